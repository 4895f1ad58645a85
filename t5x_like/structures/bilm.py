"""ELMo's biLM: causal-LM batches read forwards and backwards."""

from __future__ import annotations

import functools

import jax.numpy as jnp

from t5x_like import objectives
from t5x_like.data import embedded, vocabularies
from t5x_like.objectives import bilm as bilm_objective
from t5x_like.structures.base import _target_log_likelihood, dropout_rngs
from t5x_like.structures.decoder import DecoderStructure


class BilmStructure(DecoderStructure):
    """ELMo's biLM: causal-LM batches (``DecoderFeatureConverter``, unpacked), read as one
    token sequence (``decoder_target_tokens``); the objective is the mean of the forward
    and backward LM cross-entropies (``objectives.bilm_objective``). Scoring sums the forward
    LM's log-likelihood. A biLM does not generate."""

    name = "bilm"
    depth_keys = ()  # LSTM layers, not a transformer stack
    distillable = False
    scores_choices_as_lm_eval = False
    decodes_with_engine = False
    chunks_logits = False

    @classmethod
    def build_model(cls, spec, module_class):
        """The model, with the pieces of the vocabulary ``char_vocabulary`` names
        (``embedded``: the embedded corpus's SentencePiece) for its char CNN."""
        model = super().build_model(spec, module_class)
        if spec.char_vocabulary == "embedded":
            model = model.clone(char_pieces=_embedded_pieces())
        return model

    def apply_model(self, model, params, batch, rng=None, deterministic=True, **options):
        """``forward_logits`` and ``backward_logits`` over ``decoder_target_tokens``."""
        return model.apply({"params": params}, batch["decoder_target_tokens"],
                           deterministic=deterministic, rngs=dropout_rngs(rng, deterministic),
                           **options)

    def loss_fn(self, loss_config):
        options = {"label_smoothing": float(loss_config.label_smoothing),
                   "z_loss": float(loss_config.z_loss)}

        def loss_fn(model, params, batch, rng, normalizer=None, num_sequences=None):
            out = self.apply_model(model, params, batch, rng, deterministic=rng is None)
            return objectives.bilm_objective(out, batch["decoder_target_tokens"],
                                             pad_id=model.config.pad_id, normalizer=normalizer,
                                             **options)
        return loss_fn

    def forward(self, model, params, batch, rng=None, deterministic=True, hidden=True):
        # ``hidden`` is always given: the model's outputs hold it, nothing is sown.
        tokens = batch["decoder_target_tokens"]
        out = self.apply_model(model, params, batch, rng, deterministic, return_layers=True)
        fwd_t, fwd_w, _, _ = bilm_objective.lm_targets(tokens, model.config.pad_id)
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
        cnn = sum(2 * (c - w + 1) * w * e * k for w, k in zip(widths, counts, strict=False))
        cnn += model["num_highway"] * 2 * n * 2 * n + 2 * n * p
        lstm = 2 * model["num_layers"] * (2 * (2 * p) * 4 * model["lstm_dim"]
                                          + 2 * model["lstm_dim"] * p)
        return s * (cnn + lstm + 2 * 2 * p * model["vocab_size"])


@functools.cache
def _embedded_pieces() -> tuple[str, ...]:
    return vocabularies.SentencePieceVocabulary(
        embedded.vocab_model_path(), extra_ids=embedded.NUM_EXTRA_IDS).pieces()
