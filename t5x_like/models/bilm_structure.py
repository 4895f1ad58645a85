"""The ``bilm`` family's structure: causal-LM batches (``DecoderFeatureConverter``,
unpacked), read as one token sequence (``decoder_target_tokens``); the objective is
the mean of the forward and backward LM cross-entropies (``forward_loss`` and
``backward_loss`` in the metrics). Scoring sums the forward LM's log-likelihood.
A biLM does not generate."""

from __future__ import annotations

import jax.numpy as jnp

from t5x_like.models import bilm
from t5x_like.models.structures import DecoderStructure, _target_log_likelihood
from t5x_like.objectives import dropout_rngs
from t5x_like.objectives.token import token_objective


def bilm_loss(model, params, batch, rng=None, *, deterministic=True, z_loss=0.0,
              label_smoothing=0.0, normalizer=None):
    tokens = batch["decoder_target_tokens"]
    out = model.apply({"params": params}, tokens, deterministic=deterministic,
                      rngs=dropout_rngs(rng, deterministic))
    fwd_t, fwd_w, bwd_t, bwd_w = bilm.lm_targets(tokens, model.config.pad_id)
    options = dict(z_loss=z_loss, label_smoothing=label_smoothing,
                   normalizer=None if normalizer is None else normalizer)
    f_obj, f_metrics = token_objective(out["forward_logits"], fwd_t, fwd_w, **options)
    b_obj, b_metrics = token_objective(out["backward_logits"], bwd_t, bwd_w, **options)
    metrics = {"loss": (f_metrics["loss"] + b_metrics["loss"]) / 2,
               "forward_loss": f_metrics["loss"], "backward_loss": b_metrics["loss"],
               "accuracy": (f_metrics["accuracy"] + b_metrics["accuracy"]) / 2,
               "z_loss": (f_metrics["z_loss"] + b_metrics["z_loss"]) / 2,
               "num_target_tokens": f_metrics["num_target_tokens"]}
    return (f_obj + b_obj) / 2, metrics


class BilmStructure(DecoderStructure):
    name = "bilm"

    def __init__(self, model, prefix_attention: str = "bidirectional"):
        super().__init__(model, prefix_attention)

    def loss_fn(self, loss_config):
        options = {"label_smoothing": float(loss_config.label_smoothing),
                   "z_loss": float(loss_config.z_loss)}

        def loss_fn(model, params, batch, rng, normalizer=None, num_sequences=None):
            return bilm_loss(model, params, batch, rng, deterministic=rng is None,
                             normalizer=normalizer, **options)
        return loss_fn

    def forward(self, model, params, batch, rng=None, deterministic=True):
        tokens = batch["decoder_target_tokens"]
        out = model.apply({"params": params}, tokens, deterministic=deterministic,
                          rngs=dropout_rngs(rng, deterministic), return_layers=True)
        fwd_t, fwd_w, _, _ = bilm.lm_targets(tokens, model.config.pad_id)
        return {"logits": out["forward_logits"], "hidden": out["layers"][-1],
                "targets": fwd_t, "weights": fwd_w,
                "positions": (tokens != model.config.pad_id).astype(jnp.float32)}

    def score_batch(self, params, batch):
        out = self.forward(self.model, params, batch)
        return _target_log_likelihood(out["logits"], out["targets"], out["weights"])

    def predict_batch(self, params, batch, *, rng=None, **decode):
        raise ValueError("A bidirectional LM (model.family='bilm') does not generate text; "
                         "evaluate it with --mode=score, or use its features (ELMo).")

    def forward_flops_per_sequence(self, model, lengths):
        """Matmul FLOPs per sequence: char CNN, both directions' LSTMPs, the softmax
        for both directions."""
        s = lengths.get("inputs", 0) + lengths["targets"]
        e, c, p = model["char_embed_dim"], model["max_chars"], model["projection_dim"]
        widths, counts = tuple(model["filter_widths"]), tuple(model["filter_counts"])
        n = sum(counts)
        cnn = sum(2 * (c - w + 1) * w * e * k for w, k in zip(widths, counts))
        cnn += model["num_highway"] * 2 * n * 2 * n + 2 * n * p
        lstm = 2 * model["num_layers"] * (2 * (2 * p) * 4 * model["lstm_dim"]
                                          + 2 * model["lstm_dim"] * p)
        return s * (cnn + lstm + 2 * 2 * p * model["vocab_size"])
