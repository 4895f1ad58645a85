"""Encoder-only model (BERT layout): word + position + segment embeddings, post-LayerNorm
blocks, a masked-LM head tied to the word embeddings and a next-sentence head on [CLS].
RoBERTa is the same network with positions counted from ``position_offset`` and no
next-sentence head.

``__call__(input_tokens, token_type_ids=None, input_mask=None)`` returns a dict with
``mlm_logits [batch, length, vocab]``, ``hidden``, and with the next-sentence head
``pooled`` and ``nsp_logits [batch, 2]``.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp

from t5x_like.models import layers
from t5x_like.models.layers import constrain


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    vocab_size: int = 30522
    d_model: int = 768
    num_heads: int = 12
    head_dim: int = 64
    d_ff: int = 3072
    num_layers: int = 12
    max_length: int = 512
    type_vocab_size: int = 2
    mlp_activations: Sequence[str] = ("gelu_exact",)
    layer_norm_epsilon: float = 1e-12
    pad_id: int = 0
    # 0: positions 0, 1, 2, ... (BERT). k > 0: real tokens count from k and padding
    # sits at k - 1 (RoBERTa: k = 2, padding at position 1, its pad id).
    position_offset: int = 0
    next_sentence_head: bool = True
    dropout_rate: float = 0.0
    dtype: str = "float32"

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)


_bert_init = nn.initializers.normal(stddev=0.02)


class EncoderBlock(nn.Module):
    """Post-norm: ``LN(x + attention(x))`` then ``LN(x + mlp(x))``, as in BERT."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x, bias, deterministic):
        cfg = self.config
        dtype = cfg.compute_dtype
        dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        h = layers.MultiHeadAttention(cfg.num_heads, cfg.head_dim, cfg.dropout_rate, dtype,
                                      use_bias=True, scale_in_compute=True,
                                      kernel_init=_bert_init, name="attention")(
                                          x, x, bias, deterministic)
        x = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype, name="attention_norm")(
            x + dropout(h, deterministic=deterministic))
        h = layers.Mlp(cfg.d_ff, tuple(cfg.mlp_activations), cfg.dropout_rate, dtype,
                       use_bias=True, kernel_init=_bert_init, name="mlp")(x, deterministic)
        x = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype, name="mlp_norm")(
            x + dropout(h, deterministic=deterministic))
        return constrain(x, ("batch", "length", "embed"))


class EncoderOnly(nn.Module):
    config: EncoderConfig

    @nn.compact
    def __call__(self, input_tokens, token_type_ids=None, input_mask=None,
                 deterministic: bool = True) -> dict:
        cfg = self.config
        dtype = cfg.compute_dtype
        batch, length = input_tokens.shape
        if input_mask is None:
            input_mask = input_tokens != cfg.pad_id
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_tokens)
        if cfg.position_offset > 0:
            counted = jnp.cumsum(input_mask.astype(jnp.int32), axis=1) * input_mask
            positions = counted + cfg.position_offset - 1
        else:
            positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
        word = layers.Embed(cfg.vocab_size, cfg.d_model, dtype=dtype, embedding_init=_bert_init,
                            name="token_embedder")
        x = (word(input_tokens)
             + layers.Embed(cfg.max_length, cfg.d_model, dtype=dtype, embedding_init=_bert_init,
                            name="position_embedder")(positions)
             + layers.Embed(cfg.type_vocab_size, cfg.d_model, dtype=dtype,
                            embedding_init=_bert_init, name="token_type_embedder")(token_type_ids))
        x = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype, name="embedding_norm")(x)
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)
        x = constrain(x, ("batch", "length", "embed"))
        bias = layers.attention_bias_from_mask(layers.padding_mask(input_mask, input_mask))
        for i in range(cfg.num_layers):
            x = EncoderBlock(cfg, name=f"layers_{i}")(x, bias, deterministic)

        dense = lambda features, axes, name: layers.DenseGeneral(  # noqa: E731
            features, kernel_axes=axes, kernel_init=_bert_init, use_bias=True, dtype=dtype, name=name)
        # Masked-LM head: transform, then the tied word embeddings plus an output bias.
        h = layers.ACTIVATIONS[cfg.mlp_activations[0]](dense(cfg.d_model, ("embed", None),
                                                             "mlm_transform")(x))
        h = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype, name="mlm_norm")(h)
        mlm_bias = self.param("mlm_bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                                        ("vocab",)),
                              (cfg.vocab_size,), jnp.float32)
        mlm_logits = word.attend(h) + mlm_bias.astype(dtype)
        out = {"mlm_logits": constrain(mlm_logits.astype(jnp.float32), ("batch", "length", "vocab")),
               "hidden": x}
        if cfg.next_sentence_head:
            # Next-sentence head on the pooled [CLS] (first) position.
            out["pooled"] = jnp.tanh(dense(cfg.d_model, ("embed", None), "pooler")(x[:, 0]))
            out["nsp_logits"] = dense(2, ("embed", None), "nsp")(out["pooled"]).astype(jnp.float32)
        return out
