"""ELMo's objective (Peters et al. 2018): the forward LM predicts the next token, the
backward LM the previous one, through one shared softmax; the loss is the mean of the
two cross-entropies (both logged, as ``forward_loss`` and ``backward_loss``)."""

from __future__ import annotations

import jax.numpy as jnp

from t5x_like.objectives.token import token_objective


def lm_targets(tokens, pad_id: int = 0):
    """``(forward_targets, forward_weights, backward_targets, backward_weights)``:
    position t's forward state predicts token t+1, its backward state token t-1."""
    real = (tokens != pad_id).astype(jnp.float32)
    fwd_t = jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))
    fwd_w = jnp.pad(real[:, 1:], ((0, 0), (0, 1)))
    bwd_t = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)))
    bwd_w = jnp.pad(real[:, :-1], ((0, 0), (1, 0)))
    return fwd_t, fwd_w, bwd_t, bwd_w


def bilm_objective(out, tokens, *, pad_id: int = 0, z_loss=0.0, label_smoothing=0.0,
                   normalizer=None):
    """The mean of the forward and backward LM cross-entropies (``out``'s
    ``forward_logits`` and ``backward_logits``) over the real tokens of ``tokens``."""
    fwd_t, fwd_w, bwd_t, bwd_w = lm_targets(tokens, pad_id)
    options = dict(z_loss=z_loss, label_smoothing=label_smoothing, normalizer=normalizer)
    f_obj, f_metrics = token_objective(out["forward_logits"], fwd_t, fwd_w, **options)
    b_obj, b_metrics = token_objective(out["backward_logits"], bwd_t, bwd_w, **options)
    metrics = {"loss": (f_metrics["loss"] + b_metrics["loss"]) / 2,
               "forward_loss": f_metrics["loss"], "backward_loss": b_metrics["loss"],
               "accuracy": (f_metrics["accuracy"] + b_metrics["accuracy"]) / 2,
               "z_loss": (f_metrics["z_loss"] + b_metrics["z_loss"]) / 2,
               "num_target_tokens": f_metrics["num_target_tokens"]}
    return (f_obj + b_obj) / 2, metrics
