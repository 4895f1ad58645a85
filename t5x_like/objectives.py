"""Losses: ``(model, params, batch, rng) -> (loss, metrics)``; nothing about how batches are built."""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp


def cross_entropy_with_z_loss(logits: jax.Array, targets: jax.Array, weights: jax.Array,
                              z_loss: float = 0.0):
    """Per-token cross entropy and T5's z-loss (``z_loss * log(Z)^2``), both weighted.

    Returns ``(sum of cross entropy, sum of z-loss, number of correct argmaxes)``
    over weighted positions; callers divide by the token count.
    """
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    cross_entropy = (log_z - target_logit) * weights
    z_term = z_loss * jnp.square(log_z) * weights
    correct = (jnp.argmax(logits, axis=-1) == targets) * weights
    return cross_entropy.sum(), z_term.sum(), correct.sum()


def seq2seq_loss(model, params, batch: Mapping[str, jax.Array], rng: jax.Array | None = None,
                 *, z_loss: float = 1e-4, deterministic: bool = True):
    """Span-corruption / seq2seq loss, normalised by the number of real target tokens.

    ``loss`` in the metrics is the cross entropy in nats per target token (what is
    logged and compared across runs); the optimised objective adds the z-loss.
    """
    rngs = {"dropout": rng} if (rng is not None and not deterministic) else None
    logits = model.apply({"params": params}, batch["encoder_input_tokens"],
                         batch["decoder_input_tokens"], batch["decoder_target_tokens"],
                         encoder_segment_ids=batch.get("encoder_segment_ids"),
                         decoder_segment_ids=batch.get("decoder_segment_ids"),
                         deterministic=deterministic, rngs=rngs)
    weights = batch["decoder_loss_weights"]
    ce_sum, z_sum, correct = cross_entropy_with_z_loss(
        logits, batch["decoder_target_tokens"], weights, z_loss)
    num_tokens = jnp.maximum(weights.sum(), 1.0)
    objective = (ce_sum + z_sum) / num_tokens
    metrics = {"loss": ce_sum / num_tokens, "z_loss": z_sum / num_tokens,
               "accuracy": correct / num_tokens, "num_target_tokens": weights.sum()}
    return objective, metrics


def causal_lm_loss(model, params, batch: Mapping[str, jax.Array], rng: jax.Array | None = None,
                   *, z_loss: float = 1e-4, deterministic: bool = True):
    """Next-token loss for decoder-only models over ``decoder_loss_weights`` positions
    (prefix LM: the same loss, with ``decoder_causal_attention`` marking the prefix)."""
    rngs = {"dropout": rng} if (rng is not None and not deterministic) else None
    logits = model.apply({"params": params}, batch["decoder_input_tokens"],
                         decoder_segment_ids=batch.get("decoder_segment_ids"),
                         decoder_positions=batch.get("decoder_positions"),
                         decoder_causal_attention=batch.get("decoder_causal_attention"),
                         deterministic=deterministic, rngs=rngs)
    weights = batch["decoder_loss_weights"]
    ce_sum, z_sum, correct = cross_entropy_with_z_loss(
        logits, batch["decoder_target_tokens"], weights, z_loss)
    num_tokens = jnp.maximum(weights.sum(), 1.0)
    metrics = {"loss": ce_sum / num_tokens, "z_loss": z_sum / num_tokens,
               "accuracy": correct / num_tokens, "num_target_tokens": weights.sum()}
    return (ce_sum + z_sum) / num_tokens, metrics


def masked_lm_loss(model, params, batch: Mapping[str, jax.Array], rng: jax.Array | None = None,
                   *, deterministic: bool = True):
    """BERT's objective: masked-LM cross entropy over selected positions, plus next-sentence
    (ALBERT: sentence-order) cross entropy when the batch has ``next_sentence_labels``,
    plus SpanBERT's span-boundary loss when the model has that head."""
    rngs = {"dropout": rng} if (rng is not None and not deterministic) else None
    out = model.apply({"params": params}, batch["encoder_input_tokens"],
                      token_type_ids=batch.get("encoder_token_type_ids"),
                      segment_ids=batch.get("encoder_segment_ids"),
                      positions=batch.get("encoder_positions"),
                      span_mask=batch["encoder_loss_weights"] > 0,
                      deterministic=deterministic, rngs=rngs)
    weights = batch["encoder_loss_weights"]
    ce_sum, _, correct = cross_entropy_with_z_loss(out["mlm_logits"],
                                                   batch["encoder_target_tokens"], weights)
    num_tokens = jnp.maximum(weights.sum(), 1.0)
    loss = ce_sum / num_tokens
    metrics = {"mlm_loss": loss, "accuracy": correct / num_tokens,
               "num_target_tokens": weights.sum()}
    if "sbo_logits" in out:  # SpanBERT: the span-boundary loss over the same positions
        sbo_sum, _, _ = cross_entropy_with_z_loss(out["sbo_logits"], batch["encoder_target_tokens"],
                                                  weights)
        metrics["sbo_loss"] = sbo_sum / num_tokens
        loss = loss + metrics["sbo_loss"]
    if "next_sentence_labels" in batch:
        nsp_logp = jax.nn.log_softmax(out["nsp_logits"])
        nsp = -jnp.take_along_axis(nsp_logp, batch["next_sentence_labels"][:, None], -1).mean()
        metrics["nsp_loss"] = nsp
        loss = loss + nsp
    metrics["loss"] = loss
    return loss, metrics
