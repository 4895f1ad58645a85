"""ELMo (Peters et al. 2018): a character-CNN token encoder and a bidirectional LSTM
language model (``model.family = "bilm"``).

The model reads token ids (the project's SentencePiece vocabulary) and builds each
token's characters from its piece text: a ``[vocab, max_chars]`` table of char ids
(a begin-of-word or begin-of-piece marker, the UTF-8 bytes of the piece, an end
marker, padding) is a constant of the model, so the data pipeline is unchanged.
``char_vocabulary = "embedded"`` takes the pieces of the embedded corpus's
SentencePiece model; ``""`` derives stand-in "characters" from the id's bytes (for
size checks of vocabularies we do not ship, such as the paper's 793k words).

- Char CNN: 16-dim char embeddings, convolutions of widths 1..7 (the original
  filter counts 32, 32, 64, 128, 256, 512, 1024: 2048 in all) max-pooled over the
  characters, ``num_highway`` highway layers, a linear projection to ``projection_dim``.
- BiLSTM: ``num_layers`` LSTMs with projection (LSTMP: ``lstm_dim`` cells, output
  ``projection_dim``), per direction, scanned over time by ``flax.linen.RNN``;
  residual connection from the second layer on. The forward LSTM predicts the
  next token, the backward LSTM (the sequence reversed within its real length)
  the previous one. One softmax (``softmax``: an output embedding separate from
  the inputs) is shared by both directions.

Rows are unpacked, right-padded examples (``pack=False``; ``config_lib`` refuses
packing for this family): the backward LSTM reverses each row within its length.

Outputs (``__call__``): ``forward_logits``, ``backward_logits`` ``[batch, length,
vocab]``; with ``return_layers`` also ``layers`` ``[num_layers + 1, batch, length,
2 * projection_dim]``: layer 0 the char-CNN projection (repeated for both
directions, as ELMo), layer j the j-th LSTM's forward and backward outputs.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5x_like.config.model_specs import BilmSpec
from t5x_like.models import layers

CHAR_PAD, CHAR_BOW, CHAR_BOP, CHAR_EOW = 0, 1, 2, 3
CHAR_OFFSET = 4  # byte b has char id b + 4
NUM_CHARS = 262  # ELMo's 256 bytes + specials (here 4 specials + 256 bytes = 260 used)


def _kernel(module, name, shape, axes, init=None):
    init = init or nn.initializers.lecun_normal()
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)


def _bias(module, name, size, axis, value=0.0):
    return module.param(name, nn.with_logical_partitioning(nn.initializers.constant(value),
                                                           (axis,)), (size,), jnp.float32)


@functools.lru_cache(maxsize=4)
@functools.lru_cache(maxsize=4)
def char_table(pieces: tuple[str, ...], vocab_size: int, max_chars: int) -> np.ndarray:
    """``[vocab_size, max_chars]`` char ids of a vocabulary's pieces (ids past the
    pieces, such as sentinels, read as ``<extra_i>``)."""
    table = np.zeros((vocab_size, max_chars), np.int32)
    for i in range(vocab_size):
        piece = pieces[i] if i < len(pieces) else f"<extra_{i}>"
        table[i] = _piece_chars(piece, max_chars)
    return table


def _piece_chars(piece: str, max_chars: int) -> np.ndarray:
    starts_word = piece.startswith("\u2581")
    text = piece[1:] if starts_word else piece
    body = [b + CHAR_OFFSET for b in text.encode("utf-8")][:max_chars - 2]
    chars = [CHAR_BOW if starts_word else CHAR_BOP] + body + [CHAR_EOW]
    return np.asarray(chars + [CHAR_PAD] * (max_chars - len(chars)), np.int32)


def id_chars(tokens: jax.Array, max_chars: int) -> jax.Array:
    """Stand-in characters computed from the ids: a marker, the id's 3 bytes, an end."""
    parts = [jnp.full_like(tokens, CHAR_BOW)]
    parts += [(tokens >> shift) % 256 + CHAR_OFFSET for shift in (16, 8, 0)]
    parts += [jnp.full_like(tokens, CHAR_EOW)]
    chars = jnp.stack(parts, axis=-1)
    return jnp.pad(chars, [(0, 0)] * tokens.ndim + [(0, max_chars - 5)])


class CharCNN(nn.Module):
    config: BilmSpec

    @nn.compact
    def __call__(self, chars):  # [batch, length, max_chars] -> [batch, length, projection_dim]
        cfg = self.config
        table = _kernel(self, "char_embedding", (NUM_CHARS, cfg.char_embed_dim),
                        (None, None), nn.initializers.normal(1.0))
        x = jnp.take(table, chars, axis=0).astype(layers.compute_dtype(cfg))
        b, s, c, e = x.shape
        x = x.reshape(b * s, c, e)
        pooled = []
        for width, count in zip(tuple(cfg.filter_widths), tuple(cfg.filter_counts), strict=False):
            kernel = _kernel(self, f"conv_{width}", (width, e, count), (None, None, "mlp"))
            bias = _bias(self, f"conv_{width}_bias", count, "mlp")
            y = jax.lax.conv_general_dilated(x, kernel.astype(x.dtype), (1,), "VALID",
                                             dimension_numbers=("NWC", "WIO", "NWC"))
            pooled.append(jnp.max(y, axis=1) + bias.astype(x.dtype))
        h = jnp.tanh(jnp.concatenate(pooled, axis=-1))
        n = h.shape[-1]
        for i in range(cfg.num_highway):
            kernel = _kernel(self, f"highway_{i}", (n, 2 * n), ("mlp", None))
            bias = jnp.concatenate([_bias(self, f"highway_{i}_carry_bias", n, "mlp", -2.0),
                                    _bias(self, f"highway_{i}_bias", n, "mlp")])
            z = h @ kernel.astype(h.dtype) + bias.astype(h.dtype)
            gate, transform = jax.nn.sigmoid(z[:, :n]), jax.nn.relu(z[:, n:])
            h = gate * h + (1 - gate) * transform
        proj = _kernel(self, "projection", (n, cfg.projection_dim), ("mlp", "embed"))
        out = h @ proj.astype(h.dtype) + _bias(self, "projection_bias", cfg.projection_dim,
                                               "embed").astype(h.dtype)
        return out.reshape(b, s, cfg.projection_dim)


class LSTMPCell(nn.RNNCellBase):
    """LSTM with a projected output (Sak et al. 2014), clipped as ELMo's."""

    cell_dim: int
    proj_dim: int
    cell_clip: float = 3.0
    proj_clip: float = 3.0

    @nn.compact
    def __call__(self, carry, x):
        c, h = carry
        w_in = _kernel(self, "input_kernel", (x.shape[-1], 4 * self.cell_dim), ("embed", "mlp"))
        w_h = _kernel(self, "hidden_kernel", (self.proj_dim, 4 * self.cell_dim), ("embed", "mlp"))
        bias = _bias(self, "bias", 4 * self.cell_dim, "mlp")
        z = x @ w_in.astype(x.dtype) + h @ w_h.astype(x.dtype) + bias.astype(x.dtype)
        i, f, g, o = jnp.split(z, 4, axis=-1)
        c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        if self.cell_clip:
            c = jnp.clip(c, -self.cell_clip, self.cell_clip)
        proj = _kernel(self, "projection", (self.cell_dim, self.proj_dim), ("mlp", "embed"))
        h = (jax.nn.sigmoid(o) * jnp.tanh(c)) @ proj.astype(x.dtype)
        if self.proj_clip:
            h = jnp.clip(h, -self.proj_clip, self.proj_clip)
        return (c, h), h

    def initialize_carry(self, rng, input_shape):
        batch = input_shape[:-1]
        return (jnp.zeros(batch + (self.cell_dim,)), jnp.zeros(batch + (self.proj_dim,)))

    @property
    def num_feature_axes(self) -> int:
        return 1


class Bilm(nn.Module):
    """``char_pieces``: the vocabulary's pieces whose characters the char CNN reads, given
    by whoever builds the model (its structure reads them from the vocabulary that
    ``char_vocabulary`` names); the model never looks a vocabulary up itself."""

    #: the batch features ``__call__`` takes first, in order (``models.example_inputs``)
    init_features: ClassVar[tuple[str, ...]] = ("decoder_target_tokens",)

    config: BilmSpec
    char_pieces: tuple[str, ...] = ()

    def chars(self, tokens):
        cfg = self.config
        if cfg.char_vocabulary:
            if not self.char_pieces:
                raise ValueError(f"model.char_vocabulary={cfg.char_vocabulary!r} needs the "
                                 "vocabulary's pieces: build the model through its structure "
                                 "(t5x_like.structures.for_config).")
            table = jnp.asarray(char_table(self.char_pieces, cfg.vocab_size, cfg.max_chars))
            return jnp.take(table, tokens, axis=0)
        return id_chars(tokens, cfg.max_chars)

    @nn.compact
    def __call__(self, tokens, deterministic: bool = True, return_layers: bool = False):
        cfg = self.config
        tokens = nn.with_logical_constraint(tokens, ("batch", None))
        real = tokens != cfg.pad_id
        lengths = real.sum(axis=-1).astype(jnp.int32)
        x = CharCNN(cfg, name="char_cnn")(self.chars(tokens))
        layers = [jnp.concatenate([x, x], axis=-1)]
        dropout = nn.Dropout(cfg.dropout_rate)
        outputs = {}
        for direction, reverse in (("forward", False), ("backward", True)):
            h = x
            per_layer = []
            for j in range(cfg.num_layers):
                cell = LSTMPCell(cfg.lstm_dim, cfg.projection_dim, cfg.cell_clip, cfg.proj_clip,
                                 name=f"{direction}_lstm_{j}")
                rnn = nn.RNN(cell, reverse=reverse, keep_order=True)
                y = rnn(dropout(h, deterministic=deterministic), seq_lengths=lengths)
                if j > 0:
                    y = y + h  # residual connection between LSTM layers
                y = nn.with_logical_constraint(y, ("batch", None, "embed"))
                per_layer.append(y)
                h = y
            outputs[direction] = per_layer
        for j in range(cfg.num_layers):
            layers.append(jnp.concatenate([outputs["forward"][j], outputs["backward"][j]], -1))
        softmax = _kernel(self, "softmax", (cfg.vocab_size, cfg.projection_dim),
                          ("vocab", "embed"), nn.initializers.normal(cfg.projection_dim ** -0.5))
        softmax_bias = _bias(self, "softmax_bias", cfg.vocab_size, "vocab")

        def logits(h):
            h = dropout(h, deterministic=deterministic)
            return (h @ softmax.T.astype(h.dtype) + softmax_bias.astype(h.dtype)).astype(
                jnp.float32)
        result = {"forward_logits": logits(outputs["forward"][-1]),
                  "backward_logits": logits(outputs["backward"][-1])}
        if return_layers:
            result["layers"] = jnp.stack(layers)
        return result


class ScalarMix(nn.Module):
    """ELMo's task-specific combination: ``gamma * sum_j softmax(s)_j * layer_j``."""

    num_layers: int

    @nn.compact
    def __call__(self, layers):  # [num_layers, ..., dim]
        s = self.param("weights", nn.initializers.zeros, (self.num_layers,))
        gamma = self.param("gamma", nn.initializers.ones, ())
        w = jax.nn.softmax(s)
        return gamma * jnp.tensordot(w, layers, axes=1)
