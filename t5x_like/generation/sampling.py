"""The next token of each row of a continuous batch, under that row's own settings.

Rows of one decoding step belong to different requests: each has its temperature,
top-k, top-p and seed, so the filters take one value per row (``models.decoding.
filter_logits`` takes one for the batch), and the randomness of a request's ``i``-th token
is ``fold_in(key(seed), i)``: its tokens do not depend on what else is in the batch or
which slot it sits in.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from t5x_like.models import decoding


def filter_rows(logits: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """``logits [rows, vocab]`` with all but each row's ``top_k`` largest (0: all) masked,
    then all but the smallest set of the rest with mass >= its ``top_p``: the same
    filters as ``decoding.filter_logits``, one setting per row."""
    neg = jnp.finfo(logits.dtype).min
    vocab = logits.shape[-1]
    ranked = -jnp.sort(-logits, axis=-1)
    kth = jnp.take_along_axis(ranked, jnp.clip(top_k - 1, 0, vocab - 1)[:, None], axis=-1)
    logits = jnp.where((top_k[:, None] > 0) & (logits < kth), neg, logits)
    ranked = jnp.where((top_k[:, None] > 0) & (ranked < kth), neg, ranked)
    probs = jax.nn.softmax(ranked, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = mass_before < top_p[:, None]
    threshold = jnp.min(jnp.where(keep, ranked, jnp.inf), axis=-1, keepdims=True)
    return jnp.where((top_p[:, None] < 1.0) & (logits < threshold), neg, logits)


def choose(logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
           seeds: jax.Array, counters: jax.Array,
           wanted: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """``(tokens [rows], log-probabilities [rows])``: each row's argmax where its
    temperature is 0, else a draw from its filtered ``softmax(logits / temperature)``
    with key ``fold_in(key(seed), counter)``; the log-probability is the model's
    (``log_softmax(logits)``, temperature 1), as the OpenAI API and RL's old policy read
    it, computed only in steps where some row is ``wanted`` (default: every row; NaN
    otherwise: the pass over the vocabulary was a twelfth of a step of a few rows).
    Filtering sorts the vocabulary, so it runs only in steps where some row samples
    with a top-k or top-p (a sort of 64 rows of an 8k vocabulary made GRPO's rollouts
    through the engine several times slower than the static batch's)."""
    logits = logits.astype(jnp.float32)
    greedy = decoding.greedy(logits)

    def sample(_):
        scaled = logits / jnp.where(temperature > 0, temperature, 1.0)[:, None]
        filters = jnp.any((top_k > 0) | (top_p < 1.0))
        filtered = jax.lax.cond(filters, lambda x: filter_rows(x, top_k, top_p),
                                lambda x: x, scaled)
        keys = jax.vmap(lambda s, c: jax.random.fold_in(jax.random.key(s), c))(seeds, counters)
        drawn = jax.vmap(jax.random.categorical)(keys, filtered).astype(jnp.int32)
        return jnp.where(temperature > 0, drawn, greedy)
    tokens = jax.lax.cond(jnp.any(temperature > 0), sample, lambda _: greedy, None)

    def logprobs(_):
        return jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tokens[:, None],
                                   axis=-1)[:, 0]
    if wanted is None:
        return tokens, logprobs(None)
    return tokens, jax.lax.cond(jnp.any(wanted), logprobs,
                                lambda _: jnp.full(tokens.shape, jnp.nan), None)
