"""Losses: ``(model, params, batch, rng) -> (loss, metrics)``; nothing about how batches are built."""

from __future__ import annotations

import functools
from typing import Mapping

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


def dropout_rngs(rng, deterministic: bool):
    """Dropout randomness for ``model.apply``: only when training with an rng."""
    return {"dropout": rng} if (rng is not None and not deterministic) else None


def token_objective(logits, targets, weights, *, z_loss: float, label_smoothing: float,
                     normalizer):
    """Objective and per-token metrics shared by the token-level losses.

    ``normalizer`` divides the summed objective: ``None`` means this batch's real
    target tokens; a number (a constant, or the whole batch's token count when the
    trainer splits it into microbatches) makes the sum over microbatches exact.
    """
    ce_sum, z_sum, correct, optimised = _token_losses(logits, targets, weights, z_loss,
                                                      label_smoothing)
    num_tokens = jnp.maximum(weights.sum(), 1.0)
    denominator = num_tokens if normalizer is None else normalizer
    metrics = {"loss": ce_sum / num_tokens, "z_loss": z_sum / num_tokens,
               "accuracy": correct / num_tokens, "num_target_tokens": weights.sum()}
    return (optimised + z_sum) / denominator, metrics


def seq2seq_loss(model, params, batch: Mapping[str, jax.Array], rng: jax.Array | None = None,
                 *, z_loss: float = 1e-4, deterministic: bool = True, label_smoothing: float = 0.0,
                 normalizer=None):
    """Span-corruption / seq2seq loss, normalised by the number of real target tokens
    (or by ``normalizer``, see :func:`token_objective`).

    ``loss`` in the metrics is the cross entropy in nats per target token (what is
    logged and compared across runs); the optimised objective adds the z-loss and
    label smoothing.
    """
    rngs = dropout_rngs(rng, deterministic)
    logits = model.apply({"params": params}, batch["encoder_input_tokens"],
                         batch["decoder_input_tokens"], batch["decoder_target_tokens"],
                         encoder_segment_ids=batch.get("encoder_segment_ids"),
                         decoder_segment_ids=batch.get("decoder_segment_ids"),
                         encoder_positions=batch.get("encoder_positions"),
                         decoder_positions=batch.get("decoder_positions"),
                         deterministic=deterministic, rngs=rngs)
    return token_objective(logits, batch["decoder_target_tokens"], batch["decoder_loss_weights"],
                            z_loss=z_loss, label_smoothing=label_smoothing, normalizer=normalizer)


def causal_lm_loss(model, params, batch: Mapping[str, jax.Array], rng: jax.Array | None = None,
                   *, z_loss: float = 1e-4, deterministic: bool = True,
                   label_smoothing: float = 0.0, normalizer=None):
    """Next-token loss for decoder-only models over ``decoder_loss_weights`` positions
    (prefix LM: the same loss, with ``decoder_causal_attention`` marking the prefix)."""
    rngs = dropout_rngs(rng, deterministic)
    logits = model.apply({"params": params}, batch["decoder_input_tokens"],
                         decoder_segment_ids=batch.get("decoder_segment_ids"),
                         decoder_positions=batch.get("decoder_positions"),
                         decoder_causal_attention=batch.get("decoder_causal_attention"),
                         deterministic=deterministic, rngs=rngs)
    return token_objective(logits, batch["decoder_target_tokens"], batch["decoder_loss_weights"],
                            z_loss=z_loss, label_smoothing=label_smoothing, normalizer=normalizer)


def masked_lm_loss(model, params, batch: Mapping[str, jax.Array], rng: jax.Array | None = None,
                   *, deterministic: bool = True, label_smoothing: float = 0.0,
                   normalizer=None, num_sequences=None):
    """BERT's objective: masked-LM cross entropy over selected positions, plus next-sentence
    (ALBERT: sentence-order) cross entropy when the batch has ``next_sentence_labels``,
    plus SpanBERT's span-boundary loss when the model has that head.

    ``num_sequences`` divides the summed next-sentence objective (``None``: this
    batch's rows); a microbatch passes the whole batch's rows, as ``normalizer``
    does for tokens, so k microbatches add up to the whole batch's objective.
    """
    rngs = dropout_rngs(rng, deterministic)
    out = model.apply({"params": params}, batch["encoder_input_tokens"],
                      token_type_ids=batch.get("encoder_token_type_ids"),
                      segment_ids=batch.get("encoder_segment_ids"),
                      positions=batch.get("encoder_positions"),
                      span_mask=batch["encoder_loss_weights"] > 0,
                      deterministic=deterministic, rngs=rngs)
    token_loss = functools.partial(token_objective, targets=batch["encoder_target_tokens"],
                                   weights=batch["encoder_loss_weights"], z_loss=0.0,
                                   label_smoothing=label_smoothing, normalizer=normalizer)
    objective, token_metrics = token_loss(out["mlm_logits"])
    loss = token_metrics["loss"]
    metrics = {"mlm_loss": loss, "accuracy": token_metrics["accuracy"],
               "num_target_tokens": token_metrics["num_target_tokens"]}
    if "sbo_logits" in out:  # SpanBERT: the span-boundary loss over the same positions
        sbo_objective, sbo_metrics = token_loss(out["sbo_logits"])
        metrics["sbo_loss"] = sbo_metrics["loss"]
        loss = loss + sbo_metrics["loss"]
        objective = objective + sbo_objective
    if "next_sentence_labels" in batch:
        nsp_logp = jax.nn.log_softmax(out["nsp_logits"])
        nsp_each = -jnp.take_along_axis(nsp_logp, batch["next_sentence_labels"][:, None], -1)
        nsp = nsp_each.mean()
        metrics["nsp_loss"] = nsp
        loss = loss + nsp
        rows = nsp_each.shape[0] if num_sequences is None else num_sequences
        objective = objective + nsp_each.sum() / rows
    metrics["loss"] = loss
    return objective, metrics


def electra_loss(model, params, batch: Mapping[str, jax.Array], rng: jax.Array | None = None,
                 *, deterministic: bool = True, label_smoothing: float = 0.0,
                 normalizer=None, num_sequences=None):
    """ELECTRA's objective: the generator's masked-LM cross entropy plus λ times the
    discriminator's replaced-token detection loss (sigmoid cross entropy over every
    real token), λ = ``model.config.discriminator_loss_weight`` (50 in the paper).

    A token is labelled replaced exactly when the token the discriminator read
    differs from the original (``encoder_target_tokens`` hold the original sequence):
    a generator sample equal to the original counts as original, as in Clark et al.
    The detection loss is each row's mean over its real tokens, averaged over rows
    (``num_sequences`` as in :func:`masked_lm_loss`), so microbatches add up exactly;
    on full rows it equals the paper's mean over all tokens. Training samples from
    the step's rng; evaluation (no rng) from a fixed key, so it is repeatable.
    """
    config = model.config
    dropout_rng, sample_rng = (jax.random.split(rng) if rng is not None
                               else (None, jax.random.key(0)))
    rngs = dict(dropout_rngs(dropout_rng, deterministic) or {}, sample=sample_rng)
    weights = batch["encoder_loss_weights"]
    out = model.apply({"params": params}, batch["encoder_input_tokens"],
                      token_type_ids=batch.get("encoder_token_type_ids"),
                      segment_ids=batch.get("encoder_segment_ids"),
                      positions=batch.get("encoder_positions"), masked_positions=weights > 0,
                      deterministic=deterministic, rngs=rngs)
    original = batch["encoder_target_tokens"]
    objective, token_metrics = token_objective(
        out["mlm_logits"], original, weights, z_loss=0.0, label_smoothing=label_smoothing,
        normalizer=normalizer)
    real = (batch["encoder_input_tokens"] != config.pad_id).astype(jnp.float32)
    labels = (out["corrupted_tokens"] != original).astype(jnp.float32) * real
    logits = out["rtd_logits"]
    # log(1 + e^x) - label * x: the sigmoid cross entropy, stable for any x.
    token_bce = (jax.nn.softplus(logits) - labels * logits) * real
    per_row = token_bce.sum(axis=-1) / jnp.maximum(real.sum(axis=-1), 1.0)
    rows = per_row.shape[0] if num_sequences is None else num_sequences
    weight = float(config.discriminator_loss_weight)
    objective = objective + weight * per_row.sum() / rows
    num_real = jnp.maximum(real.sum(), 1.0)
    discriminator_loss = per_row.mean()
    metrics = {"loss": token_metrics["loss"] + weight * discriminator_loss,
               "mlm_loss": token_metrics["loss"], "accuracy": token_metrics["accuracy"],
               "discriminator_loss": discriminator_loss,
               "discriminator_accuracy": (((logits > 0) == (labels > 0)) * real).sum() / num_real,
               "replaced_fraction": labels.sum() / num_real,
               "num_target_tokens": token_metrics["num_target_tokens"]}
    return objective, metrics


# -- fine-tuning heads (models.heads.WithHead) -------------------------------------------------
# Batches carry ``input_tokens`` (and optionally ``token_type_ids``) plus the labels below.

def _apply_head(model, params, batch, rng, deterministic):
    rngs = dropout_rngs(rng, deterministic)
    return model.apply({"params": params}, batch["input_tokens"], batch.get("token_type_ids"),
                       deterministic=deterministic, rngs=rngs)


def classification_loss(model, params, batch, rng=None, *, deterministic: bool = True):
    """Cross entropy of ``labels [batch]`` (class ids), averaged over the batch."""
    logits = _apply_head(model, params, batch, rng, deterministic)
    labels = batch["labels"].astype(jnp.int32)
    log_probs = jax.nn.log_softmax(logits)
    loss = -jnp.take_along_axis(log_probs, labels[:, None], axis=-1).mean()
    accuracy = (jnp.argmax(logits, axis=-1) == labels).mean()
    return loss, {"loss": loss, "accuracy": accuracy}


def regression_loss(model, params, batch, rng=None, *, deterministic: bool = True):
    """Mean squared error of a one-label head against float ``labels [batch]`` (STS-B)."""
    predictions = _apply_head(model, params, batch, rng, deterministic)[:, 0]
    loss = jnp.mean(jnp.square(predictions - batch["labels"].astype(jnp.float32)))
    return loss, {"loss": loss}


def token_classification_loss(model, params, batch, rng=None, *, deterministic: bool = True):
    """Cross entropy per token of ``labels [batch, length]`` where ``label_weights`` > 0
    (padding and word-piece continuations get weight 0)."""
    logits = _apply_head(model, params, batch, rng, deterministic)
    weights = batch["label_weights"]
    ce_sum, _, correct = cross_entropy_with_z_loss(logits, batch["labels"].astype(jnp.int32),
                                                   weights)
    num = jnp.maximum(weights.sum(), 1.0)
    return ce_sum / num, {"loss": ce_sum / num, "accuracy": correct / num}


def span_extraction_loss(model, params, batch, rng=None, *, deterministic: bool = True):
    """Mean of the start and end cross entropies over ``start_positions``/``end_positions``
    (the answer's first and last token), as in BERT's SQuAD fine-tuning."""
    out = _apply_head(model, params, batch, rng, deterministic)
    losses, exact = [], []
    for side in ("start", "end"):
        logits = out[f"{side}_logits"]
        positions = batch[f"{side}_positions"].astype(jnp.int32)[:, None]
        losses.append(-jnp.take_along_axis(jax.nn.log_softmax(logits), positions, axis=-1).mean())
        exact.append(jnp.argmax(logits, axis=-1) == positions[:, 0])
    loss = (losses[0] + losses[1]) / 2
    return loss, {"loss": loss, "accuracy": (exact[0] & exact[1]).mean()}
