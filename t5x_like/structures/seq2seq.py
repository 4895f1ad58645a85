"""T5 and BART: inputs -> encoder, targets -> decoder."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from t5x_like.data import feature_converters
from t5x_like.models import decoding
from t5x_like.structures.base import (
    DECODE_DEFAULTS,
    Structure,
    _stack_matmuls,
    _token_loss_fn,
    dropout_rngs,
)


class EncoderDecoderStructure(Structure):
    """T5 and BART: inputs -> encoder, targets -> decoder (teacher-forced)."""

    name = "encoder_decoder"
    depth_keys = ("num_encoder_layers", "num_decoder_layers")  # equal depths, as T5 and BART

    @classmethod
    def hidden_stack(cls, config):
        return "encode", f"encoder ({'BART' if config.model.family == 'bart' else 'T5'})"

    def feature_converter(self, task_feature_lengths, pack=False):
        return feature_converters.EncDecFeatureConverter(pack=pack)

    def model_feature_lengths(self, task_feature_lengths):
        lengths = dict(task_feature_lengths)
        return {"encoder_input_tokens": lengths["inputs"],
                "decoder_input_tokens": lengths["targets"],
                "decoder_target_tokens": lengths["targets"]}

    def apply_model(self, model, params, batch, rng=None, deterministic=True, **options):
        """Teacher-forced logits ``[batch, targets, vocab]`` (``options`` go to
        ``model.apply``, e.g. ``mutable``)."""
        return model.apply({"params": params}, batch["encoder_input_tokens"],
                           batch["decoder_input_tokens"], batch["decoder_target_tokens"],
                           encoder_segment_ids=batch.get("encoder_segment_ids"),
                           decoder_segment_ids=batch.get("decoder_segment_ids"),
                           encoder_positions=batch.get("encoder_positions"),
                           decoder_positions=batch.get("decoder_positions"),
                           deterministic=deterministic, rngs=dropout_rngs(rng, deterministic),
                           **options)

    def loss_fn(self, loss_config):
        return _token_loss_fn(self, loss_config)

    def predict_batch(self, params, batch, *, rng=None, **decode):
        options = {**DECODE_DEFAULTS, **decode}
        tokens = batch["encoder_input_tokens"]
        if options["num_beams"] > 1:
            sequences, _ = decoding.beam_decode(
                self.model, params, tokens, max_decode_length=options["max_decode_length"],
                num_beams=options["num_beams"], alpha=options["alpha"])
            return sequences[:, 0]
        return decoding.decode(self.model, params, tokens,
                               max_decode_length=options["max_decode_length"], rng=rng,
                               temperature=options["temperature"], top_k=options["top_k"],
                               top_p=options["top_p"])

    def decode_step(self, batch_size, lengths):
        """A decoder step reading the cross-attention keys and values from the cache
        (filled once per decode: ``decoding.fill_cross_cache``)."""

        model, inputs, targets = self.model, lengths["inputs"], lengths["targets"]
        cache = jax.eval_shape(lambda: decoding.init_cache(model, batch_size, inputs, targets))
        encoded = jax.ShapeDtypeStruct((batch_size, inputs, model.config.d_model),
                                       jnp.dtype(model.config.numerics.dtype))
        tokens = jax.ShapeDtypeStruct((batch_size, inputs), jnp.int32)
        token = jax.ShapeDtypeStruct((batch_size, 1), jnp.int32)

        def step(params, cache, encoded, encoder_tokens, token):
            logits, variables = model.apply(
                {"params": params, "cache": cache}, encoded, encoder_tokens, token, targets,
                cached_cross=True, method=model.decode, mutable=["cache"])
            return logits, variables["cache"]
        return step, cache, (encoded, tokens, token)

    def forward_flops_per_sequence(self, model, lengths):
        d, v, attn = model["d_model"], model["vocab_size"], model["num_heads"] * model["head_dim"]
        si, st = lengths["inputs"], lengths["targets"]
        le, ld = model["num_encoder_layers"], model["num_decoder_layers"]
        encoder = 2 * si * _stack_matmuls(model, le) + 4 * le * si * si * attn
        decoder = (2 * st * _stack_matmuls(model, ld, attention_mats=6)
                   + 2 * si * ld * 2 * d * attn
                   + 4 * ld * (st * st + st * si) * attn + 2 * st * d * v)
        return encoder + decoder
