"""Encoder-only model (BERT layout): word + position + segment embeddings, post-LayerNorm
blocks, a masked-LM head tied to the word embeddings and a next-sentence head on [CLS].

The same network, by config:
- RoBERTa: positions counted from ``positions.offset``, no next-sentence head;
- ALBERT: factorized embeddings (``embedding_dim`` < ``d_model``, projected up),
  one block shared by all layers (``share_layers``), sentence-order head (the
  next-sentence head's shape);
- SpanBERT: a span-boundary head predicting each masked token from the two
  tokens around its span and its offset in the span;
- Longformer: local attention (``attention.window``) and global tokens with their own
  projections (``attention.global_tokens``), in memory linear in the length (``models.attention``);
- ELECTRA's towers (``models.electra``): ``embeddings`` shared with another tower,
  and ``output_head="replaced_token"`` for the discriminator.

``__call__(input_tokens, token_type_ids=None, input_mask=None, ...)`` returns a
dict with ``mlm_logits [batch, length, vocab]``, ``hidden``, with the
next-sentence head ``pooled`` and ``nsp_logits [batch, 2]``, and with the
span-boundary head ``sbo_logits [batch, length, vocab]``; with the replaced-token
head ``rtd_logits [batch, length]`` and ``hidden`` only.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5x_like.config.model_specs import EncoderSpec
from t5x_like.models import attention, layers, moe, peft_modules, stacking
from t5x_like.models.layers import constrain

_bert_init = nn.initializers.normal(stddev=0.02)


class EncoderBlock(nn.Module):
    """Post-norm: ``LN(x + attention(x))`` then ``LN(x + mlp(x))``, as in BERT."""

    config: EncoderSpec
    scanned: bool = False
    sparse: bool | None = None  # a mixture-of-experts MLP (None: as every layer, a scan)

    @nn.compact
    def __call__(self, x, bias, deterministic):
        cfg = self.config
        dtype = layers.compute_dtype(cfg)
        dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        h = layers.MultiHeadAttention(cfg.num_heads, cfg.head_dim, cfg.dropout_rate, dtype,
                                      use_bias=True, scale_in_compute=True,
                                      kernel_init=_bert_init, attention_impl=cfg.attention.impl,
                                      # BART's encoder reuses this block, without globals.
                                      global_projections=getattr(cfg.attention, "global_tokens", False),
                                      name="attention")(x, x, bias, deterministic)
        x = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype, name="attention_norm")(
            x + dropout(h, deterministic=deterministic))
        h = moe.feed_forward(cfg.experts, self.sparse, cfg.d_ff, cfg.mlp_activations, cfg.dropout_rate,
                             dtype, use_bias=True, kernel_init=_bert_init)(x, deterministic)
        x = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype, name="mlp_norm")(
            x + dropout(h, deterministic=deterministic))
        x = constrain(x, ("batch", "length", "embed"))
        return (x, None) if self.scanned else x


class SharedEmbeddings(nn.Module):
    """Word, position and token-type tables with their LayerNorm, owned outside the
    towers that read them: ELECTRA's generator and discriminator share one set.
    ``config.embedding_dim`` (or ``d_model``) is their width."""

    config: EncoderSpec

    def setup(self):
        cfg = self.config
        width = cfg.embedding_dim or cfg.d_model
        table = lambda rows: layers.Embed(rows, width, dtype=layers.compute_dtype(cfg),  # noqa: E731
                                          embedding_init=_bert_init)
        self.token_embedder = table(cfg.vocab_size)
        self.position_embedder = table(cfg.positions.max_length)
        self.token_type_embedder = table(cfg.type_vocab_size)
        self.embedding_norm = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=layers.compute_dtype(cfg))

    def __call__(self, input_tokens, positions, token_type_ids):
        return self.embedding_norm(self.token_embedder(input_tokens)
                                   + self.position_embedder(positions)
                                   + self.token_type_embedder(token_type_ids))

    def attend(self, h):
        return self.token_embedder.attend(h)


OUTPUT_HEADS = ("mlm", "replaced_token")


class EncoderOnly(nn.Module):
    #: the batch features ``__call__`` takes first, in order (``models.example_inputs``)
    init_features: ClassVar[tuple[str, ...]] = ("encoder_input_tokens",)
    #: prompt tuning: the prompt goes after each row's first token ([CLS]), and the
    #: outputs per position drop it again
    PROMPT_SITE: ClassVar[peft_modules.PromptSite] = peft_modules.PromptSite(
        "input_tokens", 1,
        aligned=(("token_type_ids", 0), ("input_mask", True), ("span_mask", False)),
        unpacked=("segment_ids", "positions"),
        packed_refusal="Prompt tuning puts its prompt after each row's first token; packed "
                       "rows (segment ids, positions) are not supported: set pack=False.",
        trimmed=("mlm_logits", "hidden", "sbo_logits"))

    config: EncoderSpec
    # A SharedEmbeddings owned by a parent module (ELECTRA); None: this model's own tables.
    embeddings: nn.Module | None = None
    # "mlm": the tied masked-LM head; "replaced_token": ELECTRA's discriminator head, a
    # GELU dense layer and one logit per token ("is this token replaced?").
    output_head: str = "mlm"

    def head_features(self, input_tokens, token_type_ids=None, deterministic: bool = True):
        """What a task head reads: the final hidden states and the pooled [CLS] vector."""
        out = self(input_tokens, token_type_ids, deterministic=deterministic)
        return out["hidden"], out.get("pooled")

    @nn.compact
    def __call__(self, input_tokens, token_type_ids=None, input_mask=None, segment_ids=None,
                 positions=None, span_mask=None, global_attention_mask=None,
                 deterministic: bool = True) -> dict:
        """Packed rows pass ``segment_ids`` and ``positions`` (per segment, from 0).
        ``span_mask`` marks the tokens the span-boundary head predicts (the masked
        spans); their boundaries are the nearest unmasked tokens on each side.
        ``global_attention_mask`` (with ``global_attention``): 1 on the global tokens;
        by default the first token of each example ([CLS])."""
        cfg = self.config
        dtype = layers.compute_dtype(cfg)
        batch, length = input_tokens.shape
        if input_mask is None:
            input_mask = input_tokens != cfg.pad_id
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_tokens)
        first_of_example = (jnp.arange(length)[None] == 0) if positions is None else positions == 0
        if positions is not None:
            positions = jnp.where(input_mask, positions + cfg.positions.offset,
                                  max(cfg.positions.offset - 1, 0))
        elif cfg.positions.offset > 0:
            counted = jnp.cumsum(input_mask.astype(jnp.int32), axis=1) * input_mask
            positions = counted + cfg.positions.offset - 1
        else:
            positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
        embedding_dim = cfg.embedding_dim or cfg.d_model
        embed_axes = ("batch", "length", "embed")
        if self.embeddings is not None:
            x = self.embeddings(input_tokens, positions, token_type_ids)
            attend = self.embeddings.attend
        else:
            word = layers.Embed(cfg.vocab_size, embedding_dim, dtype=dtype,
                                embedding_init=_bert_init, name="token_embedder")
            x = (word(input_tokens)
                 + layers.Embed(cfg.positions.max_length, embedding_dim, dtype=dtype,
                                embedding_init=_bert_init, name="position_embedder")(positions)
                 + layers.Embed(cfg.type_vocab_size, embedding_dim, dtype=dtype,
                                embedding_init=_bert_init, name="token_type_embedder")(
                                    token_type_ids))
            x = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype, name="embedding_norm")(x)
            attend = word.attend
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)
        dense = lambda features, axes, name: layers.DenseGeneral(  # noqa: E731
            features, kernel_axes=axes, kernel_init=_bert_init, use_bias=True, dtype=dtype, name=name)
        if cfg.embedding_dim:
            x = dense(cfg.d_model, (None, "embed"), "embedding_projection")(x)
        x = constrain(x, embed_axes)

        global_tokens = None
        if cfg.attention.global_tokens:
            global_tokens = (jnp.broadcast_to(first_of_example, (batch, length))
                             if global_attention_mask is None else global_attention_mask)
        mask = attention.self_attention_mask(input_mask, segment_ids, window=cfg.attention.window,
                                             global_tokens=global_tokens,
                                             max_global_tokens=cfg.attention.max_global_tokens)
        mask = attention.for_every_layer(mask, cfg, deterministic)
        x = stacking.run_stack(EncoderBlock, cfg, cfg.num_layers, x, mask, deterministic,
                               scan=cfg.numerics.scan_layers, remat_policy=cfg.numerics.remat_policy,
                               static_argnums=(1,), shared=cfg.share_layers,
                               layer_attributes=moe.layer_attributes(cfg.experts, cfg.num_layers))

        act = layers.ACTIVATIONS[cfg.mlp_activations[0]]
        if self.output_head == "replaced_token":
            h = act(dense(cfg.d_model, ("embed", "mlp"), "rtd_transform")(x))
            logits = dense(1, ("mlp", None), "rtd_output")(h)[..., 0]
            return {"rtd_logits": constrain(logits.astype(jnp.float32), ("batch", "length")),
                    "hidden": x}
        if self.output_head != "mlm":
            raise ValueError(f"output_head={self.output_head!r}; use one of {OUTPUT_HEADS}.")
        # Masked-LM head: transform to the embedding width, then the tied word embeddings
        # plus an output bias.
        h = act(dense(embedding_dim, ("embed", None), "mlm_transform")(x))
        h = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype, name="mlm_norm")(h)
        mlm_bias = self.param("mlm_bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                                        ("vocab",)),
                              (cfg.vocab_size,), jnp.float32)
        mlm_logits = attend(h) + mlm_bias.astype(dtype)
        out = {"mlm_logits": constrain(mlm_logits.astype(jnp.float32), ("batch", "length", "vocab")),
               "hidden": x}
        if cfg.next_sentence_head:
            # Next-sentence (or ALBERT's sentence-order) head on the pooled [CLS] position.
            out["pooled"] = jnp.tanh(dense(cfg.d_model, ("embed", None), "pooler")(x[:, 0]))
            out["nsp_logits"] = dense(2, ("embed", None), "nsp")(out["pooled"]).astype(jnp.float32)
        if cfg.span_boundary_head:
            if span_mask is None:
                span_mask = jnp.zeros_like(input_mask)
            out["sbo_logits"] = SpanBoundaryHead(cfg, name="span_boundary")(
                x, span_mask, word, mlm_bias)
        return out


class SpanBoundaryHead(nn.Module):
    """SpanBERT: predict a masked token from the hidden states of the two tokens just
    outside its span and a learned embedding of its offset inside the span, through a
    two-layer GELU/LayerNorm MLP and the tied output embeddings."""

    config: EncoderSpec

    @nn.compact
    def __call__(self, hidden, span_mask, word: layers.Embed, output_bias):
        cfg = self.config
        dtype = layers.compute_dtype(cfg)
        left, right, offset = span_boundaries(span_mask)
        offset = jnp.minimum(offset, cfg.max_span_length - 1)
        take = lambda positions: jnp.take_along_axis(hidden, positions[..., None], axis=1)  # noqa: E731
        offset_embedding = layers.Embed(cfg.max_span_length, cfg.d_model, dtype=dtype,
                                        embedding_init=_bert_init, name="offset_embedder")(offset)
        h = jnp.concatenate([take(left), take(right), offset_embedding], axis=-1)
        embedding_dim = cfg.embedding_dim or cfg.d_model
        act = layers.ACTIVATIONS[cfg.mlp_activations[0]]
        for i, width in enumerate((cfg.d_model, embedding_dim)):
            h = layers.DenseGeneral(width, kernel_axes=(None, "embed") if i == 0 else ("embed", None),
                                    kernel_init=_bert_init, use_bias=True, dtype=dtype,
                                    name=f"mlp_{i}")(h)
            h = layers.LayerNorm(cfg.layer_norm_epsilon, dtype=dtype, name=f"norm_{i}")(act(h))
        logits = word.attend(h) + output_bias.astype(dtype)
        return constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))


def span_boundaries(span_mask: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """For every position of ``[batch, length]``: the nearest position left and right
    of its span that is outside any span, and its offset from the span's start
    (0-based). Outside spans: the position itself and offset 0. A span at the edge
    of the row uses the edge position as its missing boundary."""
    batch, length = span_mask.shape
    index = jnp.broadcast_to(jnp.arange(length), (batch, length))
    inside = span_mask.astype(bool)
    left = jax.lax.cummax(jnp.where(inside, -1, index), axis=1)
    right = jax.lax.cummin(jnp.where(inside, length, index), axis=1, reverse=True)
    offset = jnp.where(inside, index - left - 1, 0)
    return jnp.maximum(left, 0), jnp.minimum(right, length - 1), offset
