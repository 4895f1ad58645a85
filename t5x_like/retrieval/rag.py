"""RAG: the retriever's query tower, a fixed document index, and the T5 generator
(``models.t5.EncoderDecoder``) reading ``query + passage`` for each of the top k.

Per query: the query vector scores every indexed document (exact top k,
``search.top_k_scores``; the selection itself carries no gradient), the k passages'
scores ``q . d_k`` give ``p(z|x)``, and the generator scores the target once per
passage. ``objectives.rag`` marginalises (sequence or token). Passages are stored
pre-tokenized (``[num_docs, passage_length]``) beside their vectors, so the whole
forward pass, retrieval included, is one jitted function.

Generation: RAG-token greedily, marginalising the next-token distribution over the
k passages at every step (one shared token for the k rows of a query); RAG-sequence
by "thorough decoding": a greedy candidate per passage, each candidate scored under
every passage, the best marginal kept.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from t5x_like.models import decoding
from t5x_like.objectives import rag as rag_objectives
from t5x_like.retrieval import search


@dataclasses.dataclass(frozen=True)
class RagSpec:
    """What the jitted functions close over (hashable modules and sizes)."""

    towers: object      # retrieval.towers.BiEncoder (only the query tower runs)
    generator: object   # models.t5.EncoderDecoder
    k: int = 5
    kind: str = "sequence"
    temperature: float = 1.0  # p(z|x) = softmax(q . d / temperature), the retriever's own


def join_inputs(query: jax.Array, passages: jax.Array) -> jax.Array:
    """``[B, K, Lq + Lp]``: each row's query tokens then the passage's, padding moved to
    the end (a stable sort on "is padding"), so relative positions are the text's own."""
    batch, k, _ = passages.shape
    query = jnp.broadcast_to(query[:, None, :], (batch, k, query.shape[-1]))
    joined = jnp.concatenate([query, passages], axis=-1)
    order = jnp.argsort(joined == 0, axis=-1, stable=True)
    return jnp.take_along_axis(joined, order, axis=-1)


def retrieve(spec: RagSpec, retriever_params, query_tokens, doc_vectors):
    """``(doc_scores [B, K] with gradient to the query tower, doc ids [B, K])``."""
    q = spec.towers.apply({"params": retriever_params}, query_tokens, method="encode_query")
    _, ids = search.top_k_scores(jax.lax.stop_gradient(q), doc_vectors, spec.k)
    scores = jnp.einsum("bd,bkd->bk", q, doc_vectors[ids]) / spec.temperature
    return scores, ids


def generator_log_probs(spec: RagSpec, generator_params, inputs, targets):
    """``[N, T]`` log p(target token) under teacher forcing, for rows of ``inputs``."""
    decoder_inputs = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))
    logits = spec.generator.apply({"params": generator_params}, inputs, decoder_inputs, targets)
    return rag_objectives.token_log_probs(logits, targets)


def rag_forward(spec: RagSpec, params, batch, index):
    """``(doc_scores [B, K], token_logp [B, K, T], ids [B, K])``. ``batch``:
    ``query_tokens`` (towers' framing), ``gen_query_tokens`` (generator, no EOS),
    ``targets``; ``index``: ``vectors [N, d]``, ``passages [N, Lp]``."""
    scores, ids = retrieve(spec, params["retriever"], batch["query_tokens"], index["vectors"])
    inputs = join_inputs(batch["gen_query_tokens"], index["passages"][ids])
    batch_size, k, length = inputs.shape
    targets = batch["targets"]
    repeated = jnp.repeat(targets, k, axis=0)
    logp = generator_log_probs(spec, params["generator"], inputs.reshape(batch_size * k, length),
                               repeated)
    return scores, logp.reshape(batch_size, k, -1), ids


def rag_loss_fn(spec: RagSpec, params, batch, index):
    scores, logp, ids = rag_forward(spec, params, batch, index)
    weights = (batch["targets"] > 0).astype(jnp.float32)
    loss, metrics = rag_objectives.rag_loss(scores, logp, weights, spec.kind)
    if "gold" in batch:  # how often the gold passage is among the k retrieved
        metrics["gold_in_top_k"] = jnp.mean(jnp.any(ids == batch["gold"][:, None], axis=-1))
    return loss, metrics


def closed_book_loss_fn(generator, params, batch):
    spec = RagSpec(None, generator)
    logp = generator_log_probs(spec, params["generator"], batch["inputs"], batch["targets"])
    return rag_objectives.seq2seq_token_loss(logp, (batch["targets"] > 0).astype(jnp.float32))


# -- generation --------------------------------------------------------------------------------

def rag_token_greedy(generator, params, inputs, doc_logp, max_length: int, eos_id: int = 1):
    """``[B, max_length]``: greedy RAG-token decoding over ``inputs [B*K, L]``; at each
    step ``argmax_y sum_k p(z_k|x) p(y|x, z_k, y<t)``, fed back to all k rows
    (``decoding.decode`` with one output row per k input rows)."""
    def marginal(logits):  # [B, K, vocab] -> log sum_k p(z_k|x) p(y|x, z_k, y<t)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return jax.nn.logsumexp(doc_logp[:, :, None] + logp, axis=1)

    return decoding.decode(generator, params, inputs, max_decode_length=max_length,
                           eos_id=eos_id, copies=doc_logp.shape[1], combine=marginal)


def rag_sequence_thorough(spec: RagSpec, params, inputs, doc_logp, max_length: int):
    """``[B, max_length]``: greedy candidates, one per passage, rescored under every
    passage; the candidate with the best RAG-sequence marginal wins."""
    batch, k = doc_logp.shape
    flat = inputs.reshape(batch * k, -1)
    candidates = decoding.decode(spec.generator, params["generator"], flat,
                                 max_decode_length=max_length).reshape(batch, k, max_length)
    # Row (b, c, j): candidate c of query b under passage j.
    cand = jnp.repeat(candidates, k, axis=1).reshape(batch * k * k, max_length)
    rows = jnp.tile(inputs, (1, k, 1)).reshape(batch * k * k, -1)
    logp = generator_log_probs(spec, params["generator"], rows, cand)
    weights = (cand > 0).astype(jnp.float32)
    sequence = jnp.sum(logp * weights, -1).reshape(batch, k, k)
    marginal = jax.nn.logsumexp(doc_logp[:, None, :] + sequence, axis=-1)  # [B, C]
    best = jnp.argmax(marginal, axis=-1)
    return jnp.take_along_axis(candidates, best[:, None, None], axis=1)[:, 0]


def rag_generate(spec: RagSpec, params, batch, index, max_length: int):
    """``(tokens [B, max_length], doc ids [B, K])`` for the spec's kind."""
    scores, ids = retrieve(spec, params["retriever"], batch["query_tokens"], index["vectors"])
    inputs = join_inputs(batch["gen_query_tokens"], index["passages"][ids])
    doc_logp = jax.nn.log_softmax(scores, axis=-1)
    if spec.kind == "token":
        batch_size, k, length = inputs.shape
        out = rag_token_greedy(spec.generator, params["generator"],
                               inputs.reshape(batch_size * k, length), doc_logp, max_length)
    else:
        out = rag_sequence_thorough(spec, params, inputs, doc_logp, max_length)
    return out, ids


def numpy_index(vectors: np.ndarray, passages: np.ndarray) -> dict:
    return {"vectors": jnp.asarray(vectors, jnp.float32), "passages": jnp.asarray(passages)}
