"""BERT's objective: masked LM, next-sentence (sentence-order) and SpanBERT's
span-boundary losses."""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from t5x_like.objectives.token import token_objective


def masked_lm_objective(out: Mapping[str, jax.Array], batch: Mapping[str, jax.Array], *,
                        label_smoothing: float = 0.0, normalizer=None, num_sequences=None):
    """BERT's objective from the encoder's outputs ``out`` (``mlm_logits``, and
    ``sbo_logits`` / ``nsp_logits`` when the model has those heads): masked-LM cross
    entropy over selected positions, plus next-sentence (ALBERT: sentence-order) cross
    entropy when the batch has ``next_sentence_labels``, plus SpanBERT's span-boundary
    loss when the model has that head.

    ``num_sequences`` divides the summed next-sentence objective (``None``: this
    batch's rows); a microbatch passes the whole batch's rows, as ``normalizer``
    does for tokens, so k microbatches add up to the whole batch's objective.
    """
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
