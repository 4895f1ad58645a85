"""Fine-tuning heads' losses, pure functions of the head's outputs (``models.heads.WithHead``,
called by the head's structure) and the batch's labels."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from t5x_like.objectives.token import cross_entropy_with_z_loss


def _mean(values, row_weights):
    """The mean over the rows that are examples (``row_weights`` 1; padding rows 0)."""
    return (values * row_weights).sum() / jnp.maximum(row_weights.sum(), 1.0)


def classification_loss(logits, batch, row_weights):
    """Cross entropy of ``labels [batch]`` (class ids), averaged over the examples."""
    labels = batch["labels"].astype(jnp.int32)
    log_probs = jax.nn.log_softmax(logits)
    loss = _mean(-jnp.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0], row_weights)
    accuracy = _mean(jnp.argmax(logits, axis=-1) == labels, row_weights)
    return loss, {"loss": loss, "accuracy": accuracy}


def regression_loss(logits, batch, row_weights):
    """Mean squared error of a one-label head against float ``labels [batch]`` (STS-B)."""
    predictions = logits[:, 0]
    loss = _mean(jnp.square(predictions - batch["labels"].astype(jnp.float32)), row_weights)
    return loss, {"loss": loss}


def token_classification_loss(logits, batch, row_weights=None):
    """Cross entropy per token of ``labels [batch, length]`` where ``label_weights`` > 0
    (padding, padding rows and word-piece continuations get weight 0)."""
    weights = batch["label_weights"]
    ce_sum, _, correct = cross_entropy_with_z_loss(logits, batch["labels"].astype(jnp.int32),
                                                   weights)
    num = jnp.maximum(weights.sum(), 1.0)
    return ce_sum / num, {"loss": ce_sum / num, "accuracy": correct / num}


def span_extraction_loss(out, batch, row_weights):
    """Mean of the start and end cross entropies over ``start_positions``/``end_positions``
    (the answer's first and last token), as in BERT's SQuAD fine-tuning."""
    losses, exact = [], []
    for side in ("start", "end"):
        logits = out[f"{side}_logits"]
        positions = batch[f"{side}_positions"].astype(jnp.int32)[:, None]
        losses.append(_mean(-jnp.take_along_axis(jax.nn.log_softmax(logits), positions,
                                                 axis=-1)[:, 0], row_weights))
        exact.append(jnp.argmax(logits, axis=-1) == positions[:, 0])
    loss = (losses[0] + losses[1]) / 2
    return loss, {"loss": loss, "accuracy": _mean(exact[0] & exact[1], row_weights)}
