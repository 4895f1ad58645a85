"""Decoder-only language model (GPT-2 layout): learned positions, pre-LayerNorm, biases,
GELU MLP, causal self-attention, output through the token embedding.

``__call__(decoder_input_tokens) -> logits [batch, length, vocab]`` in float32.
Right padding needs no mask: under the causal mask no real token sees a later pad.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5x_like.models import layers
from t5x_like.models.layers import constrain


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int = 50257
    d_model: int = 768
    num_heads: int = 12
    head_dim: int = 64
    d_ff: int = 3072
    num_layers: int = 12
    max_length: int = 1024
    mlp_activations: Sequence[str] = ("gelu",)
    use_bias: bool = True
    layer_norm_epsilon: float = 1e-5
    dropout_rate: float = 0.0
    dtype: str = "float32"

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)


# GPT-2 initialises every matrix from N(0, 0.02).
_gpt2_init = nn.initializers.normal(stddev=0.02)


class DecoderBlock(nn.Module):
    config: DecoderConfig

    @nn.compact
    def __call__(self, x, bias, deterministic, decode=False):
        cfg = self.config
        dtype = cfg.compute_dtype
        dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        h = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype, name="pre_attention_norm")(x)
        h = layers.MultiHeadAttention(cfg.num_heads, cfg.head_dim, cfg.dropout_rate, dtype,
                                      use_bias=cfg.use_bias, scale_in_compute=True,
                                      kernel_init=_gpt2_init, name="attention")(
                                          h, h, bias, deterministic, decode=decode)
        x = x + dropout(h, deterministic=deterministic)
        h = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype, name="pre_mlp_norm")(x)
        h = layers.Mlp(cfg.d_ff, tuple(cfg.mlp_activations), cfg.dropout_rate, dtype,
                       use_bias=cfg.use_bias, kernel_init=_gpt2_init, name="mlp")(h, deterministic)
        x = x + dropout(h, deterministic=deterministic)
        return constrain(x, ("batch", "length", "embed"))


class DecoderOnly(nn.Module):
    config: DecoderConfig

    @nn.compact
    def __call__(self, decoder_input_tokens, deterministic: bool = True, decode: bool = False,
                 max_decode_length: int | None = None, positions=None) -> jax.Array:
        """``decode``: one position per call over a cache of ``max_decode_length``;
        ``positions`` (``[batch, length]``) then says where the token sits."""
        cfg = self.config
        batch, length = decoder_input_tokens.shape
        mask_length = (max_decode_length or length) if decode else length
        bias = layers.attention_bias_from_mask(layers.causal_mask(mask_length))
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
        token_embedder = layers.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.compute_dtype,
                                      embedding_init=_gpt2_init, name="token_embedder")
        position_embedder = layers.Embed(cfg.max_length, cfg.d_model, dtype=cfg.compute_dtype,
                                         embedding_init=nn.initializers.normal(stddev=0.01),
                                         name="position_embedder")
        x = token_embedder(decoder_input_tokens) + position_embedder(positions)
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)
        x = constrain(x, ("batch", "length", "embed"))
        for i in range(cfg.num_layers):
            x = DecoderBlock(cfg, name=f"layers_{i}")(x, bias, deterministic, decode)
        x = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=cfg.compute_dtype, name="final_norm")(x)
        logits = token_embedder.attend(x)
        return constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))
