"""Token-level cross entropy (with T5's z-loss and label smoothing): the objective of
seq2seq and causal-LM training, a pure function of logits, targets and weights (the
structure computes the logits)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def cross_entropy_with_z_loss(logits: jax.Array, targets: jax.Array, weights: jax.Array,
                              z_loss: float = 0.0):
    """Per-token cross entropy and T5's z-loss (``z_loss * log(Z)^2``), both weighted.

    Returns ``(sum of cross entropy, sum of z-loss, number of correct argmaxes)``
    over weighted positions; callers divide by the token count.
    """
    ce, z_term, correct, _ = _token_losses(logits, targets, weights, z_loss, 0.0)
    return ce, z_term, correct


def _token_losses(logits, targets, weights, z_loss: float, label_smoothing: float):
    """Weighted sums of (cross entropy, z-loss, correct argmaxes, optimised cross entropy).

    The optimised cross entropy is against targets smoothed as in T5X: the true
    token gets ``1 - label_smoothing``, every other token an equal share of the
    rest, minus the entropy of that distribution so a perfect model scores 0.
    Without smoothing it equals the plain cross entropy.
    """
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    cross_entropy = log_z - target_logit
    if label_smoothing:
        vocab = logits.shape[-1]
        confidence = 1.0 - label_smoothing
        low = label_smoothing / (vocab - 1)
        entropy = -(confidence * jnp.log(confidence) + (vocab - 1) * low * jnp.log(low + 1e-20))
        other_logits = logits.sum(axis=-1) - target_logit
        smoothed = log_z - confidence * target_logit - low * other_logits - entropy
    else:
        smoothed = cross_entropy
    z_term = z_loss * jnp.square(log_z) * weights
    correct = (jnp.argmax(logits, axis=-1) == targets) * weights
    return ((cross_entropy * weights).sum(), z_term.sum(), correct.sum(),
            (smoothed * weights).sum())


def token_objective(logits, targets, weights, *, z_loss: float, label_smoothing: float,
                     normalizer):
    """Objective and per-token metrics shared by the token-level losses.

    ``normalizer`` divides the summed objective: ``None`` means this batch's real
    target tokens; a number (a constant, or the whole batch's token count when the
    trainer splits it into microbatches) makes the sum over microbatches exact.
    """
    sums = _token_losses(logits, targets, weights, z_loss, label_smoothing)
    return _objective_from_sums(sums, weights, normalizer)


def chunked_token_objective(project, hidden, targets, weights, *, chunks: int, z_loss: float,
                            label_smoothing: float, normalizer):
    """``token_objective`` of ``project(hidden)`` computed over ``chunks`` slices of the
    positions, each slice's logits rematerialised in the backward pass: a step holds one
    slice's float32 logits (and their gradient) instead of the whole batch's, which for a
    128k vocabulary is most of a chip's memory (MaxText's ``num_vocab_tiling``).

    ``project``: ``[batch, positions, d_model] -> [batch, positions, vocab]``, the model's
    output layer; ``hidden`` the final-normed states ``[batch, length, d_model]``. A length
    that ``chunks`` does not divide is padded with weightless positions. The sums, and so
    the objective and its gradient, are ``token_objective``'s up to float rounding.
    """
    batch, length = targets.shape
    size = -(-length // chunks)
    pad = size * chunks - length

    def slices(x):
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return jnp.moveaxis(x.reshape(batch, chunks, size, *x.shape[2:]), 1, 0)

    @jax.checkpoint
    def one_slice(h, t, w):
        return _token_losses(project(h), t, w, z_loss, label_smoothing)

    def add_slice(totals, xs):
        return tuple(a + b for a, b in zip(totals, one_slice(*xs), strict=True)), None

    zeros = tuple(jnp.zeros((), jnp.float32) for _ in range(4))
    sums, _ = jax.lax.scan(add_slice, zeros, (slices(hidden), slices(targets),
                                              slices(weights.astype(jnp.float32))))
    return _objective_from_sums(sums, weights, normalizer)


def _objective_from_sums(sums, weights, normalizer):
    """``token_objective``'s objective and metrics from ``_token_losses``' four sums."""
    ce_sum, z_sum, correct, optimised = sums
    num_tokens = jnp.maximum(weights.sum(), 1.0)
    denominator = num_tokens if normalizer is None else normalizer
    metrics = {"loss": ce_sum / num_tokens, "z_loss": z_sum / num_tokens,
               "accuracy": correct / num_tokens, "num_target_tokens": weights.sum()}
    return (optimised + z_sum) / denominator, metrics


def row_mean_objective(values, positions, num_sequences=None):
    """``(objective, mean)`` of a per-position term ``[batch, length]``: each row's mean
    over its ``positions``; the objective sums them over ``num_sequences`` rows (None:
    this batch's rows that have positions; a row of padding only, as evaluation's last
    batch holds, is no sequence), so microbatches add up to the whole batch; ``mean`` is
    for logs."""
    counts = positions.sum(axis=-1)
    row_means = (values * positions).sum(axis=-1) / jnp.maximum(counts, 1.0)
    sequences = jnp.maximum((counts > 0).sum(), 1.0)
    rows = sequences if num_sequences is None else num_sequences
    return row_means.sum() / rows, row_means.sum() / sequences
