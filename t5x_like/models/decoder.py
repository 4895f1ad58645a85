"""Decoder-only language model: GPT-2 by default, and the modern layout by config.

GPT-2: learned positions, pre-LayerNorm, biases, GELU MLP, output through the
token embedding. Modern (Llama/Mistral-style, ``configs/decoder_modern_*.py``):
rotary positions, RMSNorm, SwiGLU (``mlp_activations=("silu", "linear")``), no
biases, grouped-query attention, an untied output layer, optionally a sliding
attention window.

``__call__(decoder_input_tokens, ...) -> logits [batch, length, vocab]`` in
float32. Right padding needs no mask: under the causal mask no real token sees
a later pad. Packed rows pass ``decoder_segment_ids``/``decoder_positions``;
prefix LM passes ``decoder_causal_attention`` (1 over the prefix, which then
attends bidirectionally), the seqio feature names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5x_like.models import attention, layers, stacking
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
    norm: str = "layernorm"  # or "rmsnorm"
    position_embedding: str = "learned"  # or "rotary"
    rotary_max_wavelength: float = 10_000.0
    num_kv_heads: int = 0  # 0: as many as num_heads; fewer: grouped-query attention
    tie_embeddings: bool = True
    sliding_window: int = 0  # 0: attend to the whole past
    attention_impl: str = "auto"  # attention.IMPLEMENTATIONS
    dropout_rate: float = 0.0
    dtype: str = "float32"
    scan_layers: bool = False
    remat_policy: str = "none"
    # The first input of every sequence: 0 for the runs of this framework (targets shifted
    # right, as seqio); an imported causal LM keeps its tokenizer's BOS (GPT-2's
    # <|endoftext|>), which is what it read first in pretraining.
    bos_id: int = 0

    def __post_init__(self):
        if self.position_embedding not in ("learned", "rotary"):
            raise ValueError(f"Unknown position_embedding {self.position_embedding!r}; "
                             "choose 'learned' or 'rotary'.")

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)


# GPT-2 initialises every matrix from N(0, 0.02).
_gpt2_init = nn.initializers.normal(stddev=0.02)


class DecoderBlock(nn.Module):
    config: DecoderConfig
    scanned: bool = False

    @nn.compact
    def __call__(self, x, bias, positions, deterministic, decode=False):
        cfg = self.config
        dtype = cfg.compute_dtype
        dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        h = layers.make_norm(cfg.norm, cfg.layer_norm_epsilon, dtype, "pre_attention_norm")(x)
        h = layers.MultiHeadAttention(
            cfg.num_heads, cfg.head_dim, cfg.dropout_rate, dtype, use_bias=cfg.use_bias,
            scale_in_compute=True, kernel_init=_gpt2_init, num_kv_heads=cfg.num_kv_heads or None,
            rotary=cfg.position_embedding == "rotary",
            rotary_max_wavelength=cfg.rotary_max_wavelength, attention_impl=cfg.attention_impl,
            name="attention")(
                h, h, bias, deterministic, decode, positions, positions)
        x = layers.gradient_boundary(x + dropout(h, deterministic=deterministic))
        h = layers.make_norm(cfg.norm, cfg.layer_norm_epsilon, dtype, "pre_mlp_norm")(x)
        h = layers.Mlp(cfg.d_ff, tuple(cfg.mlp_activations), cfg.dropout_rate, dtype,
                       use_bias=cfg.use_bias, kernel_init=_gpt2_init, name="mlp")(h, deterministic)
        x = x + dropout(h, deterministic=deterministic)
        x = constrain(x, ("batch", "length", "embed"))
        return (x, None) if self.scanned else x


class DecoderOnly(nn.Module):
    #: the batch features ``__call__`` takes first, in order (``models.example_inputs``)
    init_features: ClassVar[tuple[str, ...]] = ("decoder_input_tokens",)

    config: DecoderConfig

    def head_features(self, input_tokens, token_type_ids=None, deterministic: bool = True):
        """What a task head reads: the final-normed hidden states (no pooled vector)."""
        if token_type_ids is not None:
            raise ValueError("Decoder backbones have no token types; pass token_type_ids=None.")
        return self(input_tokens, deterministic=deterministic, return_hidden=True), None

    @nn.compact
    def __call__(self, decoder_input_tokens, decoder_segment_ids=None, decoder_positions=None,
                 decoder_causal_attention=None, deterministic: bool = True, decode: bool = False,
                 max_decode_length: int | None = None, return_hidden: bool = False,
                 decode_visible: jax.Array | None = None) -> jax.Array:
        """``decode``: the next position (or a prompt's several, a prefill) over a cache of
        ``max_decode_length``; ``decoder_positions`` then say where the tokens sit.
        ``decode_visible`` (``[batch, length, max_decode_length]``, bool): which cache
        positions each fed token sees, for a caller that lays out the cache itself (beam
        search with one copy of each prompt, ``decoding.generate_padded``); without it
        the tokens see the cache causally, padding masked by ``decoder_segment_ids``.
        ``return_hidden``: the final-normed hidden states instead of logits (for heads)."""
        cfg = self.config
        batch, length = decoder_input_tokens.shape
        if decoder_positions is None:
            decoder_positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
        if decode and decode_visible is not None:
            bias = jnp.where(decode_visible, 0.0, attention.NEG_INF)[:, None]
        elif decode:
            cache_length = max_decode_length or length
            # Left-padded prompts (decoding.generate_padded): segment ids over the whole
            # cache mark the positions that hold real tokens; padding is never attended to.
            key_valid = (decoder_segment_ids > 0 if decoder_segment_ids is not None
                         and decoder_segment_ids.shape[-1] == cache_length else None)
            bias = attention.cache_bias(cache_length, key_valid, window=cfg.sliding_window)
        else:
            bias = attention.for_every_layer(
                attention.self_attention_mask(
                    jnp.ones((batch, length), bool), decoder_segment_ids, causal=True,
                    window=cfg.sliding_window, prefix=decoder_causal_attention),
                cfg, deterministic)
        token_embedder = layers.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.compute_dtype,
                                      embedding_init=_gpt2_init, name="token_embedder")
        x = token_embedder(decoder_input_tokens)
        if cfg.position_embedding == "learned":
            x = x + layers.Embed(cfg.max_length, cfg.d_model, dtype=cfg.compute_dtype,
                                 embedding_init=nn.initializers.normal(stddev=0.01),
                                 name="position_embedder")(decoder_positions)
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)
        x = constrain(x, ("batch", "length", "embed"))
        x = stacking.run_stack(DecoderBlock, cfg, cfg.num_layers, x, bias, decoder_positions,
                               deterministic, decode, scan=cfg.scan_layers,
                               remat_policy=cfg.remat_policy, static_argnums=(2, 3))
        x = layers.make_norm(cfg.norm, cfg.layer_norm_epsilon, cfg.compute_dtype, "final_norm")(x)
        if return_hidden:
            return x
        self.sow("intermediates", "final_hidden", x)  # distillation's cosine loss reads it
        if cfg.tie_embeddings:
            logits = token_embedder.attend(x)
        else:
            logits = layers.DenseGeneral(cfg.vocab_size, kernel_axes=("embed", "vocab"),
                                         kernel_init=_gpt2_init, dtype=cfg.compute_dtype,
                                         name="logits_dense")(x)
        return constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))
