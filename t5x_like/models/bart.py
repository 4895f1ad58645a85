"""BART encoder-decoder: learned positions, post-LayerNorm blocks with biases, GELU,
a LayerNorm on the embeddings of each stack, output through the shared embedding
plus a bias.

mBART (Liu et al. 2020) is the same network with, by config: pre-LayerNorm blocks
(``pre_norm``), a LayerNorm after each stack (``final_layer_norm``), embeddings
scaled by sqrt(d_model) (``scale_embedding``), and decoder inputs that start with
the target's language id (``decoder_start_from_targets``: the first decoder input
of each example is its last target token, as Hugging Face's ``shift_tokens_right``
for mBART; targets end ``</s> <lang>``, so the decoder starts with ``<lang>``, and
decoding starts from ``decoder_start_id``, set to that language's id).

The encoder block is BERT's (``encoder.EncoderBlock``); the decoder block adds
cross-attention, also post-norm. Positions are looked up at ``position + 2``
(fairseq's offset, kept by Hugging Face checkpoints). Padding is ``pad_id`` (1),
and decoding starts from ``decoder_start_id`` (2, the end-of-sequence id).

``__call__(encoder_input_tokens, decoder_input_tokens, decoder_target_tokens)``
returns logits ``[batch, targets, vocab]`` in float32, like the T5 model.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5x_like.config.model_specs import BartSpec
from t5x_like.models import attention, layers, moe, stacking
from t5x_like.models.encoder import EncoderBlock
from t5x_like.models.layers import constrain

POSITION_OFFSET = 2
_init = nn.initializers.normal(stddev=0.02)


class PreNormEncoderLayer(nn.Module):
    """mBART's encoder layer: ``x + attention(LN(x))`` then ``x + mlp(LN(x))``; the
    parameter names of BERT's post-norm ``EncoderBlock``."""

    config: BartSpec
    scanned: bool = False
    sparse: bool | None = None  # a mixture-of-experts MLP (None: as every layer, a scan)

    @nn.compact
    def __call__(self, x, bias, deterministic):
        cfg = self.config
        dtype = layers.compute_dtype(cfg)
        dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        h = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype, name="attention_norm")(x)
        h = layers.MultiHeadAttention(cfg.num_heads, cfg.head_dim, cfg.dropout_rate, dtype,
                                      use_bias=True, scale_in_compute=True, kernel_init=_init,
                                      attention_impl=cfg.attention.impl,
                                      name="attention")(h, h, bias, deterministic)
        x = x + dropout(h, deterministic=deterministic)
        h = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype, name="mlp_norm")(x)
        h = moe.feed_forward(cfg.experts, self.sparse, cfg.d_ff, cfg.mlp_activations, cfg.dropout_rate,
                             dtype, use_bias=True, kernel_init=_init)(h, deterministic)
        x = constrain(x + dropout(h, deterministic=deterministic), ("batch", "length", "embed"))
        return (x, None) if self.scanned else x


class BartDecoderLayer(nn.Module):
    config: BartSpec
    scanned: bool = False
    sparse: bool | None = None

    @nn.compact
    def __call__(self, y, encoded, self_bias, cross_bias, deterministic, decode=False,
                 cross_cache=""):
        cfg = self.config
        dtype = layers.compute_dtype(cfg)
        dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        attention_layer = lambda name: layers.MultiHeadAttention(  # noqa: E731
            cfg.num_heads, cfg.head_dim, cfg.dropout_rate, dtype, use_bias=True,
            scale_in_compute=True, kernel_init=_init, attention_impl=cfg.attention.impl, name=name)
        norm = lambda name: layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype, name=name)  # noqa: E731
        mlp = moe.feed_forward(cfg.experts, self.sparse, cfg.d_ff, cfg.mlp_activations, cfg.dropout_rate,
                               dtype, use_bias=True, kernel_init=_init)
        if cfg.pre_norm:  # mBART
            h = norm("self_attention_norm")(y)
            h = attention_layer("self_attention")(h, h, self_bias, deterministic, decode)
            y = y + dropout(h, deterministic=deterministic)
            h = norm("cross_attention_norm")(y)
            h = attention_layer("encoder_decoder_attention")(h, encoded, cross_bias, deterministic,
                                                             cross_cache=cross_cache)
            y = y + dropout(h, deterministic=deterministic)
            y = y + dropout(mlp(norm("mlp_norm")(y), deterministic), deterministic=deterministic)
        else:
            h = attention_layer("self_attention")(y, y, self_bias, deterministic, decode)
            y = norm("self_attention_norm")(y + dropout(h, deterministic=deterministic))
            h = attention_layer("encoder_decoder_attention")(y, encoded, cross_bias, deterministic,
                                                             cross_cache=cross_cache)
            y = norm("cross_attention_norm")(y + dropout(h, deterministic=deterministic))
            y = norm("mlp_norm")(y + dropout(mlp(y, deterministic), deterministic=deterministic))
        y = constrain(y, ("batch", "length", "embed"))
        return (y, None) if self.scanned else y


class BartEncoderDecoder(nn.Module):
    #: the batch features ``__call__`` takes first, in order (``models.example_inputs``)
    init_features: ClassVar[tuple[str, ...]] = ("encoder_input_tokens", "decoder_input_tokens",
                                                "decoder_target_tokens")

    config: BartSpec

    def setup(self):
        cfg = self.config
        dtype = layers.compute_dtype(cfg)
        self.token_embedder = layers.Embed(cfg.vocab_size, cfg.d_model, dtype=dtype,
                                           embedding_init=_init)
        self.encoder_positions = layers.Embed(cfg.positions.max_length + POSITION_OFFSET, cfg.d_model,
                                              dtype=dtype, embedding_init=_init)
        self.decoder_positions = layers.Embed(cfg.positions.max_length + POSITION_OFFSET, cfg.d_model,
                                              dtype=dtype, embedding_init=_init)
        self.encoder_embedding_norm = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype)
        self.decoder_embedding_norm = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype)
        self.decode_position = DecodePosition()
        self.embedding_dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        self.encoder = BartStack(cfg, is_decoder=False)
        self.decoder = BartStack(cfg, is_decoder=True)
        if cfg.final_layer_norm:
            self.encoder_final_norm = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype)
            self.decoder_final_norm = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype)
        self.final_logits_bias = self.param(
            "final_logits_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
            (cfg.vocab_size,), jnp.float32)

    def _embed(self, tokens, positions, position_embedder, norm, deterministic):
        cfg = self.config
        scale = np.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        x = self.token_embedder(tokens) * scale + position_embedder(positions + POSITION_OFFSET)
        x = norm(x)
        x = self.embedding_dropout(x, deterministic=deterministic)
        return constrain(x, ("batch", "length", "embed"))

    def encode(self, encoder_input_tokens, encoder_segment_ids=None, encoder_positions=None,
               deterministic: bool = True):
        mask = attention.for_every_layer(attention.self_attention_mask(
            encoder_input_tokens != self.config.pad_id, encoder_segment_ids), self.config,
            deterministic)
        positions = _positions(encoder_input_tokens, encoder_positions)
        x = self._embed(encoder_input_tokens, positions, self.encoder_positions,
                        self.encoder_embedding_norm, deterministic)
        x = self.encoder(x, None, mask, None, deterministic)
        return self.encoder_final_norm(x) if self.config.final_layer_norm else x

    def decode(self, encoded, encoder_input_tokens, decoder_input_tokens, max_decode_length: int,
               deterministic: bool = True, cached_cross: bool = False) -> jax.Array:
        """One decoding step over the cache (or, at cache initialisation, the full length);
        the cache counts the positions; ``cached_cross`` as in ``t5.EncoderDecoder.decode``."""
        positions = self.decode_position(decoder_input_tokens)
        cross_mask = attention.cross_attention_mask(jnp.ones(decoder_input_tokens.shape, bool),
                                                    encoder_input_tokens != self.config.pad_id)
        self_bias = attention.cache_bias(max_decode_length)
        return self._decode(encoded, decoder_input_tokens, positions, self_bias, cross_mask,
                            deterministic, True, "read" if cached_cross else "fill")

    def _decode(self, encoded, decoder_input_tokens, positions, self_bias, cross_bias,
                deterministic, decode, cross_cache=""):
        y = self._embed(decoder_input_tokens, positions, self.decoder_positions,
                        self.decoder_embedding_norm, deterministic)
        y = self.decoder(y, encoded, self_bias, cross_bias, deterministic, decode, cross_cache)
        if self.config.final_layer_norm:
            y = self.decoder_final_norm(y)
        self.sow("intermediates", "final_hidden", y)  # distillation's cosine loss reads it
        logits = self.token_embedder.attend(y) + self.final_logits_bias.astype(y.dtype)
        return constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))

    def __call__(self, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
                 encoder_segment_ids=None, decoder_segment_ids=None, encoder_positions=None,
                 decoder_positions=None, deterministic: bool = True) -> jax.Array:
        cfg = self.config
        if (encoder_segment_ids is None) != (decoder_segment_ids is None):
            raise ValueError("Packed batches need both encoder_segment_ids and "
                             "decoder_segment_ids; got only one.")
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, encoder_positions,
                              deterministic)
        if cfg.decoder_start_from_targets:
            decoder_input_tokens = mbart_decoder_inputs(decoder_input_tokens, decoder_target_tokens,
                                                        cfg.pad_id, decoder_segment_ids)
        # Decoder inputs start with decoder_start_id, so validity comes from the targets.
        query_valid = decoder_target_tokens != cfg.pad_id
        self_mask = attention.self_attention_mask(query_valid, decoder_segment_ids, causal=True)
        cross_mask = attention.cross_attention_mask(query_valid, encoder_input_tokens != cfg.pad_id,
                                                    decoder_segment_ids, encoder_segment_ids)
        return self._decode(encoded, decoder_input_tokens,
                            _positions(decoder_input_tokens, decoder_positions),
                            attention.for_every_layer(self_mask, cfg, deterministic),
                            attention.for_every_layer(cross_mask, cfg, deterministic),
                            deterministic, False)


def mbart_decoder_inputs(decoder_input_tokens, decoder_target_tokens, pad_id: int,
                         decoder_segment_ids=None):
    """mBART's decoder inputs: the first input of each example (row, or packed segment)
    becomes the example's last target token, its language id (targets ``... </s> <lang>``,
    decoder inputs ``<lang> ...``), as Hugging Face's ``shift_tokens_right`` for mBART."""
    decoder_input_tokens = jnp.asarray(decoder_input_tokens)
    decoder_target_tokens = jnp.asarray(decoder_target_tokens)
    if decoder_segment_ids is None:
        last = jnp.maximum(jnp.sum(decoder_target_tokens != pad_id, axis=1) - 1, 0)
        start = jnp.take_along_axis(decoder_target_tokens, last[:, None], axis=1)
        return decoder_input_tokens.at[:, :1].set(start.astype(decoder_input_tokens.dtype))
    segments = decoder_segment_ids
    length = segments.shape[1]
    same = (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] > 0)
    last = jnp.max(jnp.where(same, jnp.arange(length), -1), axis=-1)  # last index of i's example
    start = jnp.take_along_axis(decoder_target_tokens, jnp.maximum(last, 0), axis=1)
    first = jnp.concatenate([jnp.ones_like(segments[:, :1], bool),
                             segments[:, 1:] != segments[:, :-1]], axis=1) & (segments > 0)
    return jnp.where(first, start.astype(decoder_input_tokens.dtype), decoder_input_tokens)


class DecodePosition(nn.Module):
    """Counts decoding steps in the cache, so a step knows its learned position."""

    @nn.compact
    def __call__(self, tokens):
        initialized = self.has_variable("cache", "index")
        counter = self.variable("cache", "index", lambda: jnp.array(0, jnp.int32))
        if not initialized:  # cache initialisation sees the full length
            return _positions(tokens, None)
        position = counter.value
        counter.value = position + 1
        return jnp.full(tokens.shape, position)


def _positions(tokens, positions):
    if positions is not None:
        return positions
    return jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)


class BartStack(nn.Module):
    """The encoder's or the decoder's layers (their embeddings live in the parent)."""

    config: BartSpec
    is_decoder: bool

    @nn.compact
    def __call__(self, x, encoded, self_bias, cross_bias, deterministic, decode=False,
                 cross_cache=""):
        cfg = self.config
        if self.is_decoder:
            return stacking.run_stack(BartDecoderLayer, cfg, cfg.num_decoder_layers, x, encoded,
                                      self_bias, cross_bias, deterministic, decode, cross_cache,
                                      scan=cfg.numerics.scan_layers, remat_policy=cfg.numerics.remat_policy,
                                      static_argnums=(3, 4, 5),
                                      layer_attributes=moe.layer_attributes(
                                          cfg.experts, cfg.num_decoder_layers))
        # BART's encoder block is BERT's post-norm block (same fields on the config).
        block = PreNormEncoderLayer if cfg.pre_norm else EncoderBlock
        return stacking.run_stack(block, cfg, cfg.num_encoder_layers, x, self_bias,
                                  deterministic, scan=cfg.numerics.scan_layers,
                                  remat_policy=cfg.numerics.remat_policy, static_argnums=(1,),
                                  layer_attributes=moe.layer_attributes(
                                      cfg.experts, cfg.num_encoder_layers))
