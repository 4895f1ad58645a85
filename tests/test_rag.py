"""RAG's marginal likelihoods against a hand-computed mixture, and the RAG forward pass
and decoding on tiny models: gradients reach the query tower, k = 1 collapses to the
plain seq2seq model."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t5x_like import config_lib, models, structures
from t5x_like.models import decoding
from t5x_like.objectives import rag as rag_objectives
from t5x_like.retrieval import rag, towers


def test_rag_marginals_equal_a_hand_computed_mixture():
    # One query, two passages with scores log(3) and log(1): p(z) = (0.75, 0.25).
    scores = jnp.log(jnp.array([[3.0, 1.0]]))
    # Two target tokens; p(y_t | z) per passage.
    p = np.array([[[0.5, 0.2], [0.1, 0.4]]])  # [B=1, K=2, T=2]
    weights = jnp.ones((1, 2))
    sequence = 0.75 * (0.5 * 0.2) + 0.25 * (0.1 * 0.4)
    token = (0.75 * 0.5 + 0.25 * 0.1) * (0.75 * 0.2 + 0.25 * 0.4)
    got_seq = rag_objectives.rag_sequence_log_likelihood(scores, jnp.log(p), weights)
    got_tok = rag_objectives.rag_token_log_likelihood(scores, jnp.log(p), weights)
    np.testing.assert_allclose(got_seq, [math.log(sequence)], rtol=1e-6)
    np.testing.assert_allclose(got_tok, [math.log(token)], rtol=1e-6)
    loss, _ = rag_objectives.rag_loss(scores, jnp.log(p), weights, "token")
    np.testing.assert_allclose(loss, -math.log(token) / 2, rtol=1e-6)
    # A padded position (weight 0) changes neither marginal.
    padded = jnp.log(np.concatenate([p, np.full((1, 2, 1), 0.3)], axis=-1))
    w = jnp.array([[1.0, 1.0, 0.0]])
    np.testing.assert_allclose(rag_objectives.rag_sequence_log_likelihood(scores, padded, w),
                               got_seq, rtol=1e-6)
    np.testing.assert_allclose(rag_objectives.rag_token_log_likelihood(scores, padded, w),
                               got_tok, rtol=1e-6)


def test_contrastive_loss_is_in_batch_cross_entropy():
    q = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    d = jnp.array([[2.0, 0.0], [1.0, 1.0]])
    loss, metrics = rag_objectives.contrastive_loss(q, d, temperature=0.5)
    s = np.array([[4.0, 2.0], [0.0, 2.0]])
    expected = -np.mean([s[0, 0] - np.log(np.exp(s[0]).sum()), s[1, 1] - np.log(np.exp(s[1]).sum())])
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    assert float(metrics["accuracy"]) == 1.0


def test_join_inputs_moves_padding_to_the_end():
    query = jnp.array([[7, 8, 0, 0]])
    passages = jnp.array([[[3, 1, 0], [4, 5, 1]]])
    joined = rag.join_inputs(query, passages)
    np.testing.assert_array_equal(joined[0], [[7, 8, 3, 1, 0, 0, 0], [7, 8, 4, 5, 1, 0, 0]])


def _tiny():
    enc = config_lib.model_defaults("encoder")
    enc.update(dict(vocab_size=32, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_layers=1,
                    max_length=16, next_sentence_head=False))
    gen = config_lib.model_defaults("encoder_decoder")
    gen.update(dict(vocab_size=32, d_model=16, num_heads=2, head_dim=8, d_ff=32,
                    num_encoder_layers=1, num_decoder_layers=1))
    bi = towers.bi_encoder(enc, "mean", normalize=True)
    generator = structures.build_model(gen)
    gen_params = jax.device_get(jax.jit(generator.init)(
        jax.random.PRNGKey(1), *models.example_inputs(generator))["params"])
    import flax.linen as nn
    gen_params = nn.meta.unbox(gen_params)
    params = {"retriever": {"query": towers.init_params(bi)["query"]}, "generator": gen_params}
    rng = np.random.default_rng(0)
    index = {"vectors": jnp.asarray(rng.normal(size=(10, 16)), jnp.float32),
             "passages": jnp.asarray(rng.integers(2, 32, size=(10, 5)), jnp.int32)}
    batch = {"query_tokens": jnp.asarray(rng.integers(2, 32, size=(2, 6)), jnp.int32),
             "gen_query_tokens": jnp.asarray(rng.integers(2, 32, size=(2, 4)), jnp.int32),
             "targets": jnp.array([[5, 6, 7, 1], [8, 9, 1, 0]], jnp.int32)}
    return bi, generator, params, index, batch


@pytest.mark.parametrize("kind", ["sequence", pytest.param("token", marks=pytest.mark.slow)])
def test_rag_gradient_reaches_the_query_tower_and_the_marginal_matches(kind):
    bi, generator, params, index, batch = _tiny()
    spec = rag.RagSpec(bi, generator, k=3, kind=kind)

    @jax.jit
    def run(params):
        (loss, _), grads = jax.value_and_grad(
            lambda p: rag.rag_loss_fn(spec, p, batch, index), has_aux=True)(params)
        norms = {group: optax.tree.norm(tree) for group, tree in grads.items()}
        q = bi.apply({"params": params["retriever"]}, batch["query_tokens"],
                     method="encode_query")
        return loss, norms, rag.rag_forward(spec, params, batch, index), q

    loss, norms, (scores, logp, ids), q = run(params)
    assert float(norms["retriever"]) > 0 and float(norms["generator"]) > 0
    # Recompute the mixture by hand from the forward pass's parts.
    brute = np.argsort(-(np.asarray(q) @ np.asarray(index["vectors"]).T), axis=1)[:, :3]
    np.testing.assert_array_equal(ids, brute)
    pz = np.exp(np.asarray(scores)) / np.exp(np.asarray(scores)).sum(1, keepdims=True)
    py = np.exp(np.asarray(logp))
    w = np.asarray(batch["targets"]) > 0
    total = 0.0
    for b in range(2):
        if kind == "sequence":
            total += np.log(sum(pz[b, k] * np.prod(py[b, k][w[b]]) for k in range(3)))
        else:
            total += sum(np.log(sum(pz[b, k] * py[b, k, t] for k in range(3)))
                         for t in range(4) if w[b, t])
    np.testing.assert_allclose(loss, -total / w.sum(), rtol=1e-5)


def test_k1_rag_token_decoding_is_greedy_decoding():
    _, generator, params, _, _ = _tiny()
    inputs = jnp.array([[4, 5, 6, 1], [7, 8, 1, 0]], jnp.int32)
    both = jax.jit(lambda p: (
        decoding.decode(generator, p, inputs, max_decode_length=5),
        rag.rag_token_greedy(generator, p, inputs, jnp.zeros((2, 1)), 5)))
    greedy, ours = both(params["generator"])
    np.testing.assert_array_equal(greedy, ours)


@pytest.mark.slow  # compiles two decoders (~40 s on 2 busy cores)
@pytest.mark.parametrize("kind", ["sequence", "token"])
def test_rag_generate_shapes(kind):
    bi, generator, params, index, batch = _tiny()
    spec = rag.RagSpec(bi, generator, k=2, kind=kind)
    out, ids = jax.jit(lambda p, b, i: rag.rag_generate(spec, p, b, i, 5))(params, batch, index)
    assert out.shape == (2, 5) and ids.shape == (2, 2)
