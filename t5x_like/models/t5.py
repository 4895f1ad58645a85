"""T5 v1.1-style encoder-decoder: pre-RMSNorm, relative position bias, gated-GELU MLP.

Read top to bottom: ``EncoderLayer``/``DecoderLayer`` -> ``Encoder``/``Decoder``
stacks -> ``EncoderDecoder``. The input embedding is shared by both stacks;
the output projection is separate (v1.1) unless ``logits_via_embedding``.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5x_like.config.model_specs import T5Spec
from t5x_like.models import attention, layers, moe, peft_modules, stacking
from t5x_like.models.layers import constrain


class EncoderLayer(nn.Module):
    config: T5Spec
    scanned: bool = False
    sparse: bool | None = None  # a mixture-of-experts MLP (None: as every layer, a scan)

    @nn.compact
    def __call__(self, x, bias, deterministic):
        cfg = self.config
        dtype = layers.compute_dtype(cfg)
        dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        h = layers.RMSNorm(cfg.layer_norm_epsilon, dtype=dtype, name="pre_attention_norm")(x)
        h = layers.MultiHeadAttention(cfg.num_heads, cfg.head_dim, cfg.dropout_rate, dtype,
                                      attention_impl=cfg.attention.impl,
                                      name="attention")(h, h, bias, deterministic)
        x = layers.gradient_boundary(x + dropout(h, deterministic=deterministic))
        h = layers.RMSNorm(cfg.layer_norm_epsilon, dtype=dtype, name="pre_mlp_norm")(x)
        h = moe.feed_forward(cfg.experts, self.sparse, cfg.d_ff, cfg.mlp_activations, cfg.dropout_rate,
                             dtype)(h, deterministic)
        x = x + dropout(h, deterministic=deterministic)
        x = constrain(x, ("batch", "length", "embed"))
        return (x, None) if self.scanned else x


class DecoderLayer(nn.Module):
    config: T5Spec
    scanned: bool = False
    sparse: bool | None = None

    @nn.compact
    def __call__(self, x, encoded, self_bias, cross_bias, deterministic, decode=False,
                 cross_cache=""):
        cfg = self.config
        dtype = layers.compute_dtype(cfg)
        dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        h = layers.RMSNorm(cfg.layer_norm_epsilon, dtype=dtype, name="pre_self_attention_norm")(x)
        h = layers.MultiHeadAttention(cfg.num_heads, cfg.head_dim, cfg.dropout_rate, dtype,
                                      attention_impl=cfg.attention.impl,
                                      name="self_attention")(h, h, self_bias, deterministic,
                                                             decode=decode)
        x = layers.gradient_boundary(x + dropout(h, deterministic=deterministic))
        h = layers.RMSNorm(cfg.layer_norm_epsilon, dtype=dtype, name="pre_cross_attention_norm")(x)
        h = layers.MultiHeadAttention(cfg.num_heads, cfg.head_dim, cfg.dropout_rate, dtype,
                                      attention_impl=cfg.attention.impl,
                                      name="encoder_decoder_attention")(
                                          h, encoded, cross_bias, deterministic,
                                          cross_cache=cross_cache)
        x = layers.gradient_boundary(x + dropout(h, deterministic=deterministic))
        h = layers.RMSNorm(cfg.layer_norm_epsilon, dtype=dtype, name="pre_mlp_norm")(x)
        h = moe.feed_forward(cfg.experts, self.sparse, cfg.d_ff, cfg.mlp_activations, cfg.dropout_rate,
                             dtype)(h, deterministic)
        x = x + dropout(h, deterministic=deterministic)
        x = constrain(x, ("batch", "length", "embed"))
        return (x, None) if self.scanned else x


class Encoder(nn.Module):
    #: prompt tuning: the prompt goes in front of each row's tokens
    PROMPT_SITE: ClassVar[peft_modules.PromptSite] = peft_modules.PromptSite(
        "input_tokens", 0, unpacked=("segment_ids",),
        packed_refusal="Prompt tuning puts its prompt in front of each row; packed rows "
                       "(segment ids) are not supported: set pack=False.")

    config: T5Spec
    embedder: layers.Embed

    @nn.compact
    def __call__(self, input_tokens, deterministic, segment_ids=None):
        cfg = self.config
        length = input_tokens.shape[1]
        position_bias = layers.RelativePositionBias(
            cfg.num_heads, cfg.positions.num_buckets,
            cfg.positions.max_distance, bidirectional=True,
            dtype=layers.compute_dtype(cfg), name="relpos_bias")(length, length)
        bias = attention.for_every_layer(
            attention.self_attention_mask(input_tokens > 0, segment_ids,
                                          position_bias=position_bias), cfg, deterministic)
        x = self.embedder(input_tokens)
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)
        x = constrain(x, ("batch", "length", "embed"))
        x = stacking.run_stack(EncoderLayer, cfg, cfg.num_encoder_layers, x, bias, deterministic,
                               scan=cfg.numerics.scan_layers, remat_policy=cfg.numerics.remat_policy,
                               static_argnums=(1,),
                               layer_attributes=moe.layer_attributes(cfg.experts, cfg.num_encoder_layers))
        x = layers.RMSNorm(cfg.layer_norm_epsilon, dtype=layers.compute_dtype(cfg), name="final_norm")(x)
        return nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)


class Decoder(nn.Module):
    #: prompt tuning: its cross-attention sees the encoder's rows with the prompt in front
    PROMPT_SITE: ClassVar[peft_modules.PromptSite] = peft_modules.PromptSite(
        "encoder_input_tokens", 0, owner=False)

    config: T5Spec
    embedder: layers.Embed

    @nn.compact
    def __call__(self, encoded, encoder_input_tokens, decoder_input_tokens,
                 decoder_target_tokens, deterministic, decode=False, max_decode_length=None,
                 encoder_segment_ids=None, decoder_segment_ids=None, cached_cross=False):
        """Training: full sequences. ``decode``: one position per call over a cache of
        ``max_decode_length`` positions (targets are unknown then, so only the causal
        mask and the encoder padding apply); the encoder output's cross-attention keys
        and values are projected into the cache, or with ``cached_cross`` read from it
        (``encoded`` is then unused). Packed rows: a decoder token sees only its own
        segment, in the decoder and in the encoder."""
        cfg = self.config
        length = (max_decode_length or decoder_input_tokens.shape[1]) if decode else (
            decoder_input_tokens.shape[1])
        position_bias = layers.RelativePositionBias(
            cfg.num_heads, cfg.positions.num_buckets,
            cfg.positions.max_distance, bidirectional=False,
            dtype=layers.compute_dtype(cfg), name="relpos_bias")(length, length)
        if decode:
            query_valid = jnp.ones(decoder_input_tokens.shape, bool)
            self_bias = attention.cache_bias(length, position_bias=position_bias)
            cross_bias = attention.cross_attention_mask(query_valid, encoder_input_tokens > 0)
        else:
            # Decoder inputs start with id 0 (= pad), so validity comes from the targets.
            query_valid = decoder_target_tokens > 0
            self_bias = attention.self_attention_mask(query_valid, decoder_segment_ids,
                                                      causal=True, position_bias=position_bias)
            cross_bias = attention.cross_attention_mask(
                query_valid, encoder_input_tokens > 0, decoder_segment_ids, encoder_segment_ids)
        self_bias, cross_bias = (attention.for_every_layer(bias, cfg, deterministic)
                                 for bias in (self_bias, cross_bias))

        y = self.embedder(decoder_input_tokens)
        y = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(y, deterministic=deterministic)
        y = constrain(y, ("batch", "length", "embed"))
        cross_cache = ("read" if cached_cross else "fill") if decode else ""
        y = stacking.run_stack(DecoderLayer, cfg, cfg.num_decoder_layers, y, encoded, self_bias,
                               cross_bias, deterministic, decode, cross_cache,
                               scan=cfg.numerics.scan_layers, remat_policy=cfg.numerics.remat_policy,
                               static_argnums=(3, 4, 5),
                               layer_attributes=moe.layer_attributes(cfg.experts, cfg.num_decoder_layers))
        y = layers.RMSNorm(cfg.layer_norm_epsilon, dtype=layers.compute_dtype(cfg), name="final_norm")(y)
        self.sow("intermediates", "final_hidden", y)  # distillation's cosine loss reads it
        y = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(y, deterministic=deterministic)
        if cfg.logits_via_embedding:
            logits = self.embedder.attend(y) / jnp.sqrt(y.shape[-1]).astype(y.dtype)
        else:
            logits = layers.DenseGeneral(cfg.vocab_size, kernel_axes=("embed", "vocab"),
                                         dtype=layers.compute_dtype(cfg), name="logits_dense")(y)
        return constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))


class EncoderDecoder(nn.Module):
    """``__call__(batch features) -> logits [batch, targets, vocab]`` in float32."""

    #: the batch features ``__call__`` takes first, in order (``models.example_inputs``)
    init_features: ClassVar[tuple[str, ...]] = ("encoder_input_tokens", "decoder_input_tokens",
                                                "decoder_target_tokens")

    config: T5Spec

    def setup(self):
        cfg = self.config
        self.token_embedder = layers.Embed(cfg.vocab_size, cfg.d_model, dtype=layers.compute_dtype(cfg))
        self.encoder = Encoder(cfg, self.token_embedder)
        self.decoder = Decoder(cfg, self.token_embedder)

    def encode(self, encoder_input_tokens, deterministic: bool = True):
        return self.encoder(encoder_input_tokens, deterministic)

    def decode(self, encoded, encoder_input_tokens, decoder_input_tokens,
               max_decode_length: int, deterministic: bool = True,
               cached_cross: bool = False) -> jax.Array:
        """One decoding step (or, at cache initialisation, the full length) with the cache;
        ``cached_cross``: the cross-attention keys and values are the cache's
        (``decoding.fill_cross_cache``)."""
        return self.decoder(encoded, encoder_input_tokens, decoder_input_tokens,
                            decoder_input_tokens, deterministic, decode=True,
                            max_decode_length=max_decode_length, cached_cross=cached_cross)

    def __call__(self, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
                 encoder_segment_ids=None, decoder_segment_ids=None, encoder_positions=None,
                 decoder_positions=None, deterministic: bool = True) -> jax.Array:
        """Packed rows pass both ``*_segment_ids`` (seqio's names). ``*_positions`` are
        accepted for a uniform interface and unused: relative position bias needs none,
        offsets inside a segment are unchanged by packing."""
        del encoder_positions, decoder_positions
        if (encoder_segment_ids is None) != (decoder_segment_ids is None):
            raise ValueError("Packed batches need both encoder_segment_ids and "
                             "decoder_segment_ids; got only one.")
        encoded = self.encoder(encoder_input_tokens, deterministic, encoder_segment_ids)
        return self.decoder(encoded, encoder_input_tokens, decoder_input_tokens,
                            decoder_target_tokens, deterministic,
                            encoder_segment_ids=encoder_segment_ids,
                            decoder_segment_ids=decoder_segment_ids)
