"""BERT-style encoders: masked-LM batches, scoring by the masked positions."""

from __future__ import annotations

import jax.numpy as jnp

from t5x_like import objectives
from t5x_like.data import feature_converters
from t5x_like.structures.base import (
    Structure,
    _stack_matmuls,
    _with_router_terms,
    dropout_rngs,
)


class EncoderStructure(Structure):
    """BERT-style encoders: masked LM; scoring sums the log-likelihood of the original
    tokens at the masked positions. They do not generate: fine-tune a head to predict."""

    name = "encoder"
    embeds_text = True
    depth_keys = ("num_layers",)

    @classmethod
    def positions_needed(cls, config, lengths):
        return lengths.get("inputs", 0)

    @classmethod
    def text_framing(cls, vocabulary):
        """BERT's ``[CLS] text [SEP]``; ``text EOS`` for a vocabulary without them."""
        try:
            return [int(vocabulary.cls_id)], [int(vocabulary.sep_id)]
        except (ValueError, AttributeError):
            return [], [int(vocabulary.eos_id)]
    weights_feature = "encoder_loss_weights"
    targets_feature = "encoder_target_tokens"

    def feature_converter(self, task_feature_lengths, pack=False):
        config = getattr(self.model, "config", None)  # Longformer's global tokens
        attention = getattr(config, "attention", None)
        return feature_converters.EncoderFeatureConverter(
            pack=pack, global_attention=bool(getattr(attention, "global_tokens", False)))

    def model_feature_lengths(self, task_feature_lengths):
        length = dict(task_feature_lengths)["inputs"]
        return {"encoder_input_tokens": length, "encoder_target_tokens": length}

    def apply_model(self, model, params, batch, rng=None, deterministic=True, **options):
        """The encoder's outputs: ``mlm_logits``, ``hidden``, and ``sbo_logits`` /
        ``nsp_logits`` when the model has those heads (``options`` go to ``model.apply``,
        e.g. ``mutable``)."""
        return model.apply(
            {"params": params}, batch["encoder_input_tokens"],
            token_type_ids=batch.get("encoder_token_type_ids"),
            segment_ids=batch.get("encoder_segment_ids"),
            positions=batch.get("encoder_positions"),
            span_mask=batch["encoder_loss_weights"] > 0,
            global_attention_mask=batch.get("encoder_global_attention_mask"),
            deterministic=deterministic, rngs=dropout_rngs(rng, deterministic), **options)

    def loss_fn(self, loss_config):
        label_smoothing = float(loss_config.label_smoothing)  # BERT's objective has no z-loss

        def loss_fn(model, params, batch, rng, normalizer=None, num_sequences=None):
            out, state = self.apply_model(model, params, batch, rng, deterministic=rng is None,
                                          mutable=[objectives.ROUTER_COLLECTION])
            objective, metrics = objectives.masked_lm_objective(
                out, batch, label_smoothing=label_smoothing, normalizer=normalizer,
                num_sequences=num_sequences)
            return _with_router_terms(objective, metrics, state, batch[self.weights_feature],
                                      normalizer)
        return loss_fn

    def forward(self, model, params, batch, rng=None, deterministic=True, hidden=True):
        # ``hidden`` is always given: the model's outputs hold it, nothing is sown.
        out = self.apply_model(model, params, batch, rng, deterministic)
        real = batch["encoder_input_tokens"] != model.config.pad_id
        return {"logits": out["mlm_logits"], "hidden": out["hidden"],
                "targets": batch["encoder_target_tokens"],
                "weights": batch["encoder_loss_weights"], "positions": real.astype(jnp.float32)}

    def predict_batch(self, params, batch, *, rng=None, **decode):
        raise ValueError("A masked-LM encoder does not generate text; evaluate it with "
                         "--mode=score, or fine-tune a head (models.heads) for labels.")

    def forward_flops_per_sequence(self, model, lengths):
        return _encoder_flops(model, lengths["inputs"], model.embedding_dim)


def _encoder_flops(model, s: int, embedding_dim: int, head: str = "mlm", dims=None) -> float:
    """A BERT encoder over ``s`` tokens: its layers, the projection from factorized
    embeddings (``embedding_dim`` > 0, ALBERT and ELECTRA), and its output head: the
    masked-LM transform and tied vocabulary projection, or ELECTRA's replaced-token
    head (a ``d x d`` layer and one logit). ``dims``: the tower's dimensions when they
    are not the model's (ELECTRA's generator)."""
    dims = dims or model
    d, h, dh, v = dims.d_model, dims.num_heads, dims.head_dim, model.vocab_size
    layers = dims.num_layers
    e = embedding_dim or d
    projection = 2 * s * e * d if embedding_dim else 0
    # Local attention (Longformer) scores each token against 2 w - 1 keys, not s.
    window = getattr(model.attention, "window", 0)
    keys = min(s, 2 * window - 1) if window else s
    body = (2 * s * _stack_matmuls(model, layers, dims=dims)
            + 4 * layers * s * keys * h * dh + projection)
    if head == "replaced_token":
        return body + 2 * s * d * d + 2 * s * d
    return body + 2 * s * d * e + 2 * s * e * v
