"""Decoder-only language model: GPT-2 by default, and the modern layout by config.

GPT-2: learned positions, pre-LayerNorm, biases, GELU MLP, output through the
token embedding. Modern (Llama/Mistral-style, ``configs/decoder_modern_*.py``):
rotary positions, RMSNorm, SwiGLU (``mlp_activations=("silu", "linear")``), no
biases, grouped-query attention, an untied output layer, optionally a sliding
attention window. The switches of the other open decoder families are fields here,
not families of their own (presets: ``configs/open_decoders.py``): Qwen2's query/key/value biases,
Qwen3's and Gemma 3's per-head query/key norms, Gemma's scaled embeddings,
sublayer output norms, query scale, logit soft-capping and alternating
local/global layers (``attention.layer_types``, with their own RoPE base), and the RoPE
rescalings of Llama 3.1 and YaRN (``positions.rope``, ``models.rotary``).

``__call__(decoder_input_tokens, ...) -> logits [batch, length, vocab]`` in
float32. Right padding needs no mask: under the causal mask no real token sees
a later pad. Packed rows pass ``decoder_segment_ids``/``decoder_positions``;
prefix LM passes ``decoder_causal_attention`` (1 over the prefix, which then
attends bidirectionally), the seqio feature names.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5x_like.config.model_specs import DecoderSpec
from t5x_like.models import attention, context_parallel, layers, moe, stacking
from t5x_like.models.layers import constrain

# GPT-2 initialises every matrix from N(0, 0.02).
_gpt2_init = nn.initializers.normal(stddev=0.02)


class DecoderBlock(nn.Module):
    """One layer. ``bias`` maps each layer type to its attention bias (or mask); the
    block reads its own type's. Sliding layers of a model with a local RoPE base
    (Gemma 3) rotate by it, unscaled; the rest by the model's RoPE."""

    config: DecoderSpec
    scanned: bool = False
    layer_type: str = ""  # "": the config's type for every layer (a scanned stack)
    sparse: bool | None = None  # a mixture-of-experts MLP (None: as every layer, a scan)

    @nn.compact
    def __call__(self, x, bias, positions, deterministic, decode=False):
        cfg = self.config
        dtype = layers.compute_dtype(cfg)
        layer_type = self.layer_type or cfg.attention.layer_type(0)
        local_rope = layer_type == "sliding_attention" and cfg.positions.rope.local_max_wavelength
        dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

        def norm(name):
            return layers.make_norm(cfg.norm, cfg.layer_norm_epsilon, dtype, name)

        h = norm("pre_attention_norm")(x)
        h = layers.MultiHeadAttention(
            cfg.num_heads, cfg.head_dim, cfg.dropout_rate, dtype, use_bias=cfg.use_bias,
            scale_in_compute=True, kernel_init=_gpt2_init, num_kv_heads=cfg.attention.num_kv_heads or None,
            rotary=cfg.positions.kind == "rotary",
            rotary_max_wavelength=(cfg.positions.rope.local_max_wavelength if local_rope
                                   else cfg.positions.rope.max_wavelength),
            rope_scaling=None if local_rope else cfg.positions.rope,
            qkv_bias=cfg.attention.qkv_bias, qk_norm=cfg.attention.qk_norm, qk_norm_epsilon=cfg.layer_norm_epsilon,
            query_scale=(cfg.attention.query_pre_scalar ** -0.5
                         if cfg.attention.query_pre_scalar else 0.0),
            logit_softcap=cfg.attention.logit_softcap,
            attention_impl=cfg.attention.impl, name="attention")(
                h, h, bias[layer_type], deterministic, decode, positions, positions)
        if cfg.post_sublayer_norms:
            h = norm("post_attention_norm")(h)
        x = layers.gradient_boundary(x + dropout(h, deterministic=deterministic))
        h = norm("pre_mlp_norm")(x)
        h = moe.feed_forward(cfg.experts, self.sparse, cfg.d_ff, cfg.mlp_activations, cfg.dropout_rate,
                             dtype, use_bias=cfg.use_bias, kernel_init=_gpt2_init)(
                                 h, deterministic)
        if cfg.post_sublayer_norms:
            h = norm("post_mlp_norm")(h)
        x = x + dropout(h, deterministic=deterministic)
        x = constrain(x, ("batch", "length", "embed"))
        return (x, None) if self.scanned else x


class DecoderOnly(nn.Module):
    #: the batch features ``__call__`` takes first, in order (``models.example_inputs``)
    init_features: ClassVar[tuple[str, ...]] = ("decoder_input_tokens",)

    config: DecoderSpec

    def head_features(self, input_tokens, token_type_ids=None, deterministic: bool = True):
        """What a task head reads: the final-normed hidden states (no pooled vector)."""
        if token_type_ids is not None:
            raise ValueError("Decoder backbones have no token types; pass token_type_ids=None.")
        return self(input_tokens, deterministic=deterministic, return_hidden=True), None

    @nn.compact
    def __call__(self, decoder_input_tokens, decoder_segment_ids=None, decoder_positions=None,
                 decoder_causal_attention=None, deterministic: bool = True, decode: bool = False,
                 max_decode_length: int | None = None, return_hidden: bool = False,
                 decode_visible: jax.Array | None = None,
                 page_table: jax.Array | None = None,
                 project_hidden: jax.Array | None = None) -> jax.Array:
        """``decode``: the next position (or a prompt's several, a prefill) over a cache of
        ``max_decode_length``; ``decoder_positions`` then say where the tokens sit.
        ``decode_visible`` (``[batch, length, max_decode_length]``, bool): which cache
        positions each fed token sees, for a caller that lays out the cache itself (beam
        search with one copy of each prompt, ``decoding.generate_padded``); without it
        the tokens see the cache causally, padding masked by ``decoder_segment_ids``.
        ``page_table`` (``[batch, pages per row]``): the cache is a pool of pages
        (``generation.engine``'s continuous batching) and row ``i``'s keys are its pages in
        table order, ``max_decode_length`` positions in all; ``decoder_positions`` are each
        token's position in its row (``attention.PagedBias``).
        ``return_hidden``: the final-normed hidden states instead of logits (for heads).
        ``project_hidden``: such hidden states (``[batch, positions, d_model]``) through the
        output layer alone, the tokens unread: the loss projects a slice of positions at a
        time (``loss.logit_chunks``) so a step never holds the whole batch's logits."""
        cfg = self.config
        token_embedder = layers.Embed(cfg.vocab_size, cfg.d_model, dtype=layers.compute_dtype(cfg),
                                      embedding_init=_gpt2_init, name="token_embedder")
        if project_hidden is not None:
            return self._logits(token_embedder, project_hidden)
        batch, length = decoder_input_tokens.shape
        if decoder_positions is None:
            decoder_positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
        types = sorted({cfg.attention.layer_type(i) for i in range(cfg.num_layers)})
        parts = 0  # > 0: rows load-balanced over a context axis of that size
        if decode and page_table is not None:
            bias = {t: attention.paged_bias(decoder_positions, page_table, max_decode_length,
                                            window=cfg.attention.window(t)) for t in types}
        elif decode and decode_visible is not None:
            if len(types) > 1:
                raise ValueError("decode_visible (beam search) lays out the cache with one "
                                 "window for every layer, and this model alternates sliding "
                                 "and full layers; decode it greedily or by sampling.")
            bias = {t: jnp.where(decode_visible, 0.0, attention.NEG_INF)[:, None] for t in types}
        elif decode:
            cache_length = max_decode_length or length
            # Left-padded prompts (decoding.generate_padded): segment ids over the whole
            # cache mark the positions that hold real tokens; padding is never attended to.
            key_valid = (decoder_segment_ids > 0 if decoder_segment_ids is not None
                         and decoder_segment_ids.shape[-1] == cache_length else None)
            bias = {t: attention.cache_bias(cache_length, key_valid, window=cfg.attention.window(t))
                    for t in types}
        else:
            parts = context_parallel.balanced_parts(length)
            order = None
            if parts:  # split over a context axis: rows load-balanced, put back after the stack
                decoder_input_tokens, decoder_positions, decoder_segment_ids, \
                    decoder_causal_attention = (
                        None if x is None else context_parallel.balance(x, parts)
                        for x in (decoder_input_tokens, decoder_positions, decoder_segment_ids,
                                  decoder_causal_attention))
                order = jnp.asarray(context_parallel.balanced_order(length, parts))
            bias = {t: attention.for_every_layer(
                attention.self_attention_mask(
                    jnp.ones((batch, length), bool), decoder_segment_ids, causal=True,
                    window=cfg.attention.window(t), prefix=decoder_causal_attention,
                    order=order),
                cfg, deterministic) for t in types}
        x = token_embedder(decoder_input_tokens)
        if cfg.scale_embeddings:  # Gemma: by sqrt(d_model), rounded to the compute dtype
            x = x * jnp.asarray(cfg.d_model ** 0.5, x.dtype)
        if cfg.positions.kind == "learned":
            x = x + layers.Embed(cfg.positions.max_length, cfg.d_model, dtype=layers.compute_dtype(cfg),
                                 embedding_init=nn.initializers.normal(stddev=0.01),
                                 name="position_embedder")(decoder_positions)
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)
        x = constrain(x, ("batch", "length", "embed"))
        x = stacking.run_stack(DecoderBlock, cfg, cfg.num_layers, x, bias, decoder_positions,
                               deterministic, decode, scan=cfg.numerics.scan_layers,
                               remat_policy=cfg.numerics.remat_policy, static_argnums=(2, 3),
                               pipelined=not decode, layer_attributes=moe.layer_attributes(
                                   cfg.experts, cfg.num_layers,
                                   (lambda i: {"layer_type": cfg.attention.layer_types[i]})
                                   if len(set(cfg.attention.layer_types)) > 1 else None))
        if parts:
            x = context_parallel.unbalance(x, parts)
        x = layers.make_norm(cfg.norm, cfg.layer_norm_epsilon, layers.compute_dtype(cfg), "final_norm")(x)
        if return_hidden:
            return x
        self.sow("intermediates", "final_hidden", x)  # distillation's cosine loss reads it
        return self._logits(token_embedder, x)

    def _logits(self, token_embedder, x):
        """The output layer (``__call__``'s, inside its compact scope): the tied embedding
        or ``logits_dense``, Gemma 2's soft-cap, float32."""
        cfg = self.config
        if cfg.tie_embeddings:
            logits = token_embedder.attend(x)
        else:
            logits = layers.DenseGeneral(cfg.vocab_size, kernel_axes=("embed", "vocab"),
                                         kernel_init=_gpt2_init, dtype=layers.compute_dtype(cfg),
                                         name="logits_dense")(x)
        if cfg.final_logit_softcap:  # Gemma 2
            cap = np.float32(cfg.final_logit_softcap)
            logits = cap * jnp.tanh(logits.astype(jnp.float32) / cap)
        return constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))
