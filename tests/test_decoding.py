import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import torch
from hf_helpers import VARIANTS, padded_batch, tiny_hf_t5

from t5x_like import structures
from t5x_like.convert import __main__ as convert_cli
from t5x_like.convert import load_pretrained
from t5x_like.engine import partitioning
from t5x_like.engine import trainer as trainer_lib
from t5x_like.models import decoding
from t5x_like.system import traced_platform

MAX_DECODE = 9


def converted(tmp_path, variant):
    hf_model = tiny_hf_t5(variant)
    hf_model.save_pretrained(tmp_path / "hf")
    convert_cli.import_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    model_config, params = load_pretrained(tmp_path / "ours")
    return hf_model, structures.build_model(ml_collections.ConfigDict(model_config)), params


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_greedy_matches_transformers_generate(tmp_path, variant):
    hf_model, model, params = converted(tmp_path, variant)
    encoder, _, _ = padded_batch()
    with torch.no_grad():
        theirs = hf_model.generate(
            input_ids=torch.tensor(encoder), attention_mask=torch.tensor(encoder > 0),
            max_new_tokens=MAX_DECODE, do_sample=False, num_beams=1, decoder_start_token_id=0,
            eos_token_id=1, pad_token_id=0,
            use_cache=False,  # transformers 5.23 cache breaks with num_decoder_layers != num_layers
        ).numpy()[:, 1:]
    theirs = np.pad(theirs, ((0, 0), (0, MAX_DECODE - theirs.shape[1])))
    ours = jax.jit(functools.partial(decoding.decode, model, max_decode_length=MAX_DECODE))(
        params, jnp.asarray(encoder))
    np.testing.assert_array_equal(np.asarray(ours), theirs)


def greedy_without_cache(model, params, encoder, length):
    """Reference: rerun the whole decoder on the prefix at every step (no cache).

    The causal mask keeps position ``step`` from seeing the zeros after the prefix."""
    forward = jax.jit(lambda p, e, d: model.apply({"params": p}, e, d, jnp.ones_like(d)))
    tokens = np.zeros((encoder.shape[0], length + 1), np.int32)
    for step in range(length):
        logits = forward(params, encoder, tokens[:, :-1])
        tokens[:, step + 1] = np.argmax(np.asarray(logits[:, step]), axis=-1)
    return tokens[:, 1:]


def test_cached_greedy_equals_recomputing_the_prefix(tmp_path):
    _, model, params = converted(tmp_path, "v1_1")
    encoder, _, _ = padded_batch()
    cached = np.asarray(decoding.decode(model, params, jnp.asarray(encoder),
                                        max_decode_length=MAX_DECODE, eos_id=-1))
    np.testing.assert_array_equal(cached, greedy_without_cache(model, params, encoder, MAX_DECODE))


def test_sampling_is_seeded_and_top_k_1_is_greedy(tmp_path):
    _, model, params = converted(tmp_path, "v1_1")
    encoder = jnp.asarray(padded_batch()[0])
    sample = functools.partial(decoding.decode, model, params, encoder,
                               max_decode_length=MAX_DECODE, eos_id=-1)
    greedy = sample()
    np.testing.assert_array_equal(sample(rng=jax.random.key(3), temperature=1.0, top_k=1), greedy)
    # This random model's logits are peaked, so a high temperature makes samples vary.
    a = sample(rng=jax.random.key(1), temperature=20.0)
    np.testing.assert_array_equal(a, sample(rng=jax.random.key(1), temperature=20.0))
    assert not np.array_equal(a, sample(rng=jax.random.key(2), temperature=20.0))
    assert not np.array_equal(a, greedy)


def test_filter_logits_top_k_and_top_p():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    def kept(out):
        return (np.asarray(out) > np.finfo(np.float32).min).tolist()[0]

    assert kept(decoding.filter_logits(logits, top_k=2)) == [True, True, False, False]
    assert kept(decoding.filter_logits(logits, top_p=0.7)) == [True, True, False, False]
    assert kept(decoding.filter_logits(logits, top_p=0.5)) == [True, False, False, False]
    assert kept(decoding.filter_logits(logits, top_p=0.9)) == [True, True, True, False]


def test_greedy_on_a_sharded_mesh_equals_one_device(tmp_path):
    _, model, params = converted(tmp_path, "v1_1")
    encoder = np.random.default_rng(1).integers(2, 96, size=(8, 13)).astype(np.int32)
    encoder[::3, 8:] = 0  # padding in some rows
    single = np.asarray(decoding.decode(model, params, jnp.asarray(encoder),
                                        max_decode_length=MAX_DECODE))
    mesh = partitioning.make_mesh({"data": 2, "fsdp": 4, "tensor": 1})
    rules = partitioning.axis_rules("fsdp")
    boxed = trainer_lib.abstract_boxed_params(model, {"encoder_input_tokens": 13,
                                                      "decoder_input_tokens": 7,
                                                      "decoder_target_tokens": 7})
    shardings = partitioning.logical_shardings(boxed, mesh, rules)
    sharded_params = jax.device_put(params, shardings)
    batch = jax.device_put(encoder, partitioning.batch_sharding(mesh))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        out = jax.jit(functools.partial(decoding.decode, model, max_decode_length=MAX_DECODE))(
            sharded_params, batch)
    np.testing.assert_array_equal(np.asarray(out), single)


def test_beam_of_one_without_length_penalty_is_greedy(tmp_path):
    _, model, params = converted(tmp_path, "v1_0")
    encoder = jnp.asarray(padded_batch()[0])
    greedy = decoding.decode(model, params, encoder, max_decode_length=MAX_DECODE)
    seqs, _ = decoding.beam_decode(model, params, encoder, max_decode_length=MAX_DECODE,
                                   num_beams=1, alpha=0.0)
    np.testing.assert_array_equal(seqs[:, 0], greedy)


def test_beam_scores_are_the_model_log_probabilities(tmp_path):
    _, model, params = converted(tmp_path, "v1_1")
    encoder = jnp.asarray(padded_batch()[0])
    seqs, scores = jax.jit(functools.partial(
        decoding.beam_decode, model, max_decode_length=MAX_DECODE, num_beams=4, alpha=0.0))(
            params, encoder)
    for beam in range(4):
        targets = np.asarray(seqs[:, beam])
        decoder_inputs = np.concatenate([np.zeros((2, 1), np.int32), targets[:, :-1]], axis=1)
        logits = model.apply({"params": params}, encoder, decoder_inputs, np.ones_like(targets))
        logp = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), targets[..., None], -1)[..., 0]
        # Positions after EOS are padding and not part of the sequence.
        after_eos = np.cumsum(np.cumsum(targets == decoding.EOS_ID, axis=1), axis=1) > 1
        expected = np.where(after_eos, 0.0, logp).sum(axis=1)
        np.testing.assert_allclose(np.asarray(scores[:, beam]), expected, rtol=1e-4, atol=1e-4)
    assert np.all(np.diff(np.asarray(scores), axis=1) <= 1e-6)


def test_sampling_without_an_rng_and_overlong_generation_are_refused(tmp_path):
    _, model, params = converted(tmp_path, "v1_1")
    with pytest.raises(ValueError, match="needs an rng key"):
        decoding.decode(model, params, jnp.ones((1, 4), jnp.int32), max_decode_length=3,
                        temperature=1.0)
    from hf_helpers import tiny_hf_gpt2

    from t5x_like.convert import __main__ as cli
    tiny_hf_gpt2().save_pretrained(tmp_path / "gpt2")
    cli.import_hf(str(tmp_path / "gpt2"), str(tmp_path / "gpt2_ours"))
    gpt_config, gpt_params = load_pretrained(tmp_path / "gpt2_ours")
    gpt = structures.build_model(ml_collections.ConfigDict(gpt_config))
    with pytest.raises(ValueError, match="exceeds the model's max_length 40"):
        decoding.generate(gpt, gpt_params, jnp.ones((1, 30), jnp.int32), max_new_tokens=20)


def _scanned(tmp_path, variant="v1_1"):
    """The converted model unrolled and scanned, with the same weights."""
    from t5x_like.models import stacking
    _, model, params = converted(tmp_path, variant)
    config = ml_collections.ConfigDict(load_pretrained(tmp_path / "ours")[0])
    config.scan_layers = True
    return model, params, structures.build_model(config), stacking.stack_layer_params(params)


def test_scanned_decoding_equals_unrolled_greedy_and_beam(tmp_path):
    """Both stacks read their cross-attention keys and values from the cache; a scanned
    cache has its beams on axis 1 (under ``layers``) and must follow them too."""
    model, params, scanned, scanned_params = _scanned(tmp_path)
    encoder = jnp.asarray(padded_batch()[0])
    np.testing.assert_array_equal(
        decoding.decode(scanned, scanned_params, encoder, max_decode_length=MAX_DECODE),
        decoding.decode(model, params, encoder, max_decode_length=MAX_DECODE))
    beams = [decoding.beam_decode(m, p, encoder, max_decode_length=MAX_DECODE, num_beams=3)
             for m, p in ((model, params), (scanned, scanned_params))]
    np.testing.assert_array_equal(beams[0][0], beams[1][0])
    np.testing.assert_allclose(beams[0][1], beams[1][1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scan", [False, True])
def test_decode_steps_project_the_encoder_output_once(tmp_path, scan):
    """A step that reads the cross-attention cache does no keys/values projection of the
    encoder output: its FLOPs are lower by exactly that projection (2 matrices, every
    decoder layer), counted by XLA for the compiled step."""
    model, params, scanned, scanned_params = _scanned(tmp_path)
    model, params = (scanned, scanned_params) if scan else (model, params)
    encoder = jnp.asarray(padded_batch()[0])
    batch, length = encoder.shape
    encoded = model.apply({"params": params}, encoder, method=model.encode)
    cache = decoding.init_cache(model, batch, length, MAX_DECODE)
    token = jnp.zeros((batch, 1), jnp.int32)

    def step_flops(cached):
        step = jax.jit(lambda p, c, e: model.apply(
            {"params": p, "cache": c}, e, encoder, token, MAX_DECODE, cached_cross=cached,
            method=model.decode, mutable=["cache"]))
        return step.lower(params, cache, encoded).compile().cost_analysis()["flops"]
    cfg = model.config
    projection = 2 * (2 * batch * length * cfg.d_model * cfg.num_heads * cfg.head_dim)
    layers = 1 if scan else cfg.num_decoder_layers  # XLA counts a scanned body once
    saved = step_flops(False) - step_flops(True)
    assert saved == pytest.approx(layers * projection, rel=0.05), (saved, layers * projection)


def _while_body_text(hlo: str) -> str:
    """The decoding loop's body and every computation it calls, from compiled HLO text."""
    computations = dict(re.findall(r"\n(?:ENTRY )?%([\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo, re.S))
    body = re.search(r" while\([^\n]*body=%([\w.\-]+)", hlo).group(1)
    seen, todo = set(), [body]
    while todo:
        name = todo.pop()
        if name not in seen and name in computations:
            seen.add(name)
            todo += re.findall(r"(?:calls|to_apply|body|condition)=%([\w.\-]+)",
                               computations[name])
    return "\n".join(computations[n] for n in seen)


def test_the_decoding_loop_reads_the_cross_cache_without_copying_it(tmp_path):
    """The cross-attention keys and values enter the loop in the layout the steps read:
    no step transposes the encoder-sized projection again (XLA did, two copies per
    layer and step, until fill_cross_cache put a barrier after the fill)."""
    model, params, _, _ = _scanned(tmp_path)
    encoder = jnp.asarray(padded_batch()[0])
    batch, length = encoder.shape
    cfg = model.config
    hlo = jax.jit(lambda p, e: decoding.decode(model, p, e, max_decode_length=MAX_DECODE)).lower(
        params, encoder).compile().as_text()
    projection = f"f32[{batch},{length},{cfg.num_heads},{cfg.head_dim}]"
    assert projection in hlo  # the fill, before the loop
    body = _while_body_text(hlo)
    assert projection not in body, [line.strip()[:160] for line in body.splitlines()
                                    if projection in line][:3]


def test_decoding_loops_read_dense_kernels_transposed_once_on_cpu(tmp_path):
    """On CPU the 2-D dense kernels enter the loop as ``[out, in]`` (XLA:CPU's matmul reads
    that layout about twice as fast at decoding's few rows): transposed once before the
    loop, never inside it; other platforms, and steps of one to three rows, keep the
    parameters as they are."""
    model, params = converted(tmp_path, "v1_1")[1:]
    rows = decoding.TRANSPOSED_KERNELS_MIN_ROWS
    carried, restore = decoding._loop_params(params, rows)
    for (path, kernel), moved in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                                     jax.tree.leaves(carried), strict=True):
        name = jax.tree_util.keystr(path)
        expected = kernel.T if kernel.ndim == 2 and name.endswith("['kernel']") else kernel
        np.testing.assert_array_equal(moved, expected, err_msg=name)
    jax.tree.map(np.testing.assert_array_equal, restore(carried), params)
    with traced_platform.target_platform("tpu"):
        assert decoding._loop_params(params, rows)[0] is params
    # Fewer rows: XLA:CPU's matrix-vector path wants the kernels as they are.
    assert decoding._loop_params(params, rows - 1)[0] is params

    encoder = jnp.asarray(padded_batch()[0])
    encoder = jnp.tile(encoder, (-(-rows // encoder.shape[0]), 1))
    hlo = jax.jit(lambda p, e: decoding.decode(model, p, e, max_decode_length=MAX_DECODE)).lower(
        params, encoder).compile().as_text()
    body = _while_body_text(hlo)
    shapes = {leaf.shape for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
              if leaf.ndim == 2 and path[-1].key == "kernel"}
    for rows, cols in shapes:
        transposed = re.compile(rf"= f32\[{cols},{rows}\]\{{1,0\}} (copy|transpose|fusion)")
        assert transposed.search(hlo), (rows, cols)  # made before the loop
        copied = re.compile(rf"= f32\[({rows},{cols}|{cols},{rows})\]\{{[0-9,]+\}} (copy|transpose)\(")
        assert not copied.search(body), (rows, cols)
