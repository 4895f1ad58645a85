"""ELECTRA's objective (Clark et al. 2020): the generator's masked LM plus λ times
replaced-token detection."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from t5x_like.objectives.token import row_mean_objective, token_objective


def electra_objective(out: Mapping[str, jax.Array], batch: Mapping[str, jax.Array], *,
                      pad_id: int, discriminator_loss_weight: float,
                      label_smoothing: float = 0.0, normalizer=None, num_sequences=None):
    """ELECTRA's objective from the model's outputs ``out`` (the generator's
    ``mlm_logits``, the ``corrupted_tokens`` the discriminator read, its ``rtd_logits``):
    the generator's masked-LM cross entropy plus λ times the discriminator's
    replaced-token detection loss (sigmoid cross entropy over every real token),
    λ = ``discriminator_loss_weight`` (50 in the paper).

    A token is labelled replaced exactly when the token the discriminator read
    differs from the original (``encoder_target_tokens`` hold the original sequence):
    a generator sample equal to the original counts as original, as in Clark et al.
    The detection loss is each row's mean over its real tokens, averaged over rows
    (``num_sequences`` as in :func:`masked_lm_objective`), so microbatches add up
    exactly; on full rows it equals the paper's mean over all tokens.
    """
    weights = batch["encoder_loss_weights"]
    original = batch["encoder_target_tokens"]
    objective, token_metrics = token_objective(
        out["mlm_logits"], original, weights, z_loss=0.0, label_smoothing=label_smoothing,
        normalizer=normalizer)
    real = (batch["encoder_input_tokens"] != pad_id).astype(jnp.float32)
    labels = (out["corrupted_tokens"] != original).astype(jnp.float32) * real
    logits = out["rtd_logits"]
    # log(1 + e^x) - label * x: the sigmoid cross entropy, stable for any x.
    detection, discriminator_loss = row_mean_objective(
        jax.nn.softplus(logits) - labels * logits, real, num_sequences)
    weight = float(discriminator_loss_weight)
    objective = objective + weight * detection
    num_real = jnp.maximum(real.sum(), 1.0)
    metrics = {"loss": token_metrics["loss"] + weight * discriminator_loss,
               "mlm_loss": token_metrics["loss"], "accuracy": token_metrics["accuracy"],
               "discriminator_loss": discriminator_loss,
               "discriminator_accuracy": (((logits > 0) == (labels > 0)) * real).sum() / num_real,
               "replaced_fraction": labels.sum() / num_real,
               "num_target_tokens": token_metrics["num_target_tokens"]}
    return objective, metrics
