"""Retrieval losses over arrays: the bi-encoder's in-batch contrastive loss, and RAG's
two marginal likelihoods (Lewis et al. 2020).

With ``doc_scores [B, K]`` (query . document of the K retrieved passages),
``log p(z|x) = log_softmax(doc_scores)`` over the K, and the generator's per-token
log-probabilities ``token_log_probs [B, K, T]`` of the target given each passage:

- RAG-sequence: ``log p(y|x) = logsumexp_k [log p(z_k|x) + sum_t log p(y_t|x,z_k,y<t)]``,
  one passage for the whole sequence;
- RAG-token: ``log p(y|x) = sum_t logsumexp_k [log p(z_k|x) + log p(y_t|x,z_k,y<t)]``,
  a passage per token.

Gradients reach the query tower through ``doc_scores``; the documents' vectors are
fixed (the index). Losses are negated log-likelihoods per target token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

RAG_KINDS = ("sequence", "token")


def contrastive_loss(queries: jax.Array, docs: jax.Array, temperature: float = 1.0):
    """In-batch negatives: query i's positive is document i, every other document of the
    batch a negative; cross entropy of ``softmax(q . d / temperature)``. Returns
    ``(loss, {"loss", "accuracy"})``; accuracy is in-batch top-1."""
    scores = jnp.einsum("qd,nd->qn", queries, docs) / temperature
    log_probs = jax.nn.log_softmax(scores.astype(jnp.float32), axis=-1)
    loss = -jnp.mean(jnp.diagonal(log_probs))
    labels = jnp.arange(queries.shape[0])
    accuracy = jnp.mean(jnp.argmax(scores, axis=-1) == labels)
    return loss, {"loss": loss, "accuracy": accuracy}


def token_log_probs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """``log p(target)`` per position, float32 (``logits [..., T, V]``, ``targets [..., T]``)."""
    logits = logits.astype(jnp.float32)
    return (jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
            - jax.nn.logsumexp(logits, axis=-1))


def rag_sequence_log_likelihood(doc_scores, token_logp, weights) -> jax.Array:
    """``[B]``: one passage per sequence, marginalised after summing the tokens."""
    doc_logp = jax.nn.log_softmax(doc_scores.astype(jnp.float32), axis=-1)
    sequence = jnp.sum(token_logp * weights[:, None, :], axis=-1)
    return jax.nn.logsumexp(doc_logp + sequence, axis=-1)


def rag_token_log_likelihood(doc_scores, token_logp, weights) -> jax.Array:
    """``[B]``: a passage per token, marginalised at every position, then summed."""
    doc_logp = jax.nn.log_softmax(doc_scores.astype(jnp.float32), axis=-1)
    per_token = jax.nn.logsumexp(doc_logp[:, :, None] + token_logp, axis=1)
    return jnp.sum(per_token * weights, axis=-1)


def rag_loss(doc_scores, token_logp, weights, kind: str = "sequence"):
    """``(loss, metrics)``: minus the marginal log-likelihood per target token."""
    if kind == "sequence":
        log_likelihood = rag_sequence_log_likelihood(doc_scores, token_logp, weights)
    elif kind == "token":
        log_likelihood = rag_token_log_likelihood(doc_scores, token_logp, weights)
    else:
        raise ValueError(f"rag kind={kind!r}; use one of {RAG_KINDS}.")
    tokens = jnp.maximum(jnp.sum(weights), 1.0)
    loss = -jnp.sum(log_likelihood) / tokens
    doc_probs = jax.nn.softmax(doc_scores.astype(jnp.float32), axis=-1)
    return loss, {"loss": loss, "top_doc_prob": jnp.mean(doc_probs[:, 0])}


def seq2seq_token_loss(token_logp, weights):
    """The closed-book baseline on the same scale: minus log p(y|x) per target token."""
    loss = -jnp.sum(token_logp * weights) / jnp.maximum(jnp.sum(weights), 1.0)
    return loss, {"loss": loss}
