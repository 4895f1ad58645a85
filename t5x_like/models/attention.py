"""Dot-product attention from a structured mask, computed by one of several implementations.

The mask is kept as a description (segment ids, causal, prefix, window, global
tokens, an additive position bias) instead of a ``[batch, heads, q, k]`` float
bias: a fused kernel (Pallas splash attention on TPU, cuDNN on GPU) builds its
mask tile by tile from such a description, and reading an L x L bias from
memory is exactly the traffic it exists to avoid. The plain path builds the
dense mask from the same description, so every implementation answers the
same question and the tests compare them directly.

Implementations (``model.attention_impl``):

- ``xla``: einsum, float32 logits, softmax; the reference. Memory grows with L².
- ``flash``: on TPU the Pallas splash kernel, or the Pallas flash kernel where
  a bias (T5's relative positions) or a query length off splash's 128 grid
  needs it; on GPU ``jax.nn.dot_product_attention`` with cuDNN. Where no kernel
  can express the mask (a prefix-LM mask or, on TPU, keys off the 128 grid,
  global tokens, attention dropout, float32 on cuDNN) the plain path runs
  instead and the reason is logged once.
- ``chunked``: local attention in blocks of the window plus the global
  tokens (Longformer): memory grows linearly with L.
- ``auto``: flash where it applies (on TPU, splash only), chunked for local
  masks much shorter than the sequence, else xla.
"""

from __future__ import annotations

import functools
import logging

import flax.linen as nn
import flax.struct as struct
import jax
import jax.numpy as jnp
import numpy as np

from t5x_like.system import traced_platform

# Imports inside functions: the Pallas TPU kernels load only on a TPU (their import fails
# elsewhere).

NEG_INF = -1e10
IMPLEMENTATIONS = ("auto", "xla", "flash", "chunked")
# Splash attention's tile along both sequence axes; lengths must be a multiple of it.
SPLASH_BLOCK = 128
# ``auto`` switches local attention to blocks once the sequence is this many windows long.
CHUNKED_MIN_WINDOWS = 4

_log = logging.getLogger(__name__)


@struct.dataclass
class AttentionMask:
    """Which keys each query may see.

    A query sees a key when both carry the same segment id above 0 (0 is padding;
    packed rows number their examples 1, 2, ...) and the pattern allows it: every
    key, or earlier keys (``causal``), or, with ``prefix`` (``[batch, q]``, 1 over a
    prefix-LM's inputs), earlier keys and the whole prefix; ``window`` keeps keys
    fewer than ``window`` positions away (only earlier ones when causal without a
    prefix). ``global_tokens`` (``[batch, length]``, self-attention only) are keys
    every query of their segment sees, Longformer's global attention; at most
    ``max_global_tokens`` of them per row enter the chunked computation.
    ``position_bias`` (``[1 or batch, heads, q, k]``) is added to the logits.
    ``order`` (``[length]``, self-attention): the position each slot of the row came
    from, when a context-parallel model permuted its rows (``context_parallel``); the
    causal, prefix and window patterns compare those positions.
    """

    query_segment_ids: jax.Array
    key_segment_ids: jax.Array
    prefix: jax.Array | None = None
    global_tokens: jax.Array | None = None
    position_bias: jax.Array | None = None
    order: jax.Array | None = None
    causal: bool = struct.field(pytree_node=False, default=False)
    window: int = struct.field(pytree_node=False, default=0)
    max_global_tokens: int = struct.field(pytree_node=False, default=0)


def self_attention_mask(valid: jax.Array, segment_ids: jax.Array | None = None, *,
                        causal: bool = False, window: int = 0, prefix: jax.Array | None = None,
                        global_tokens: jax.Array | None = None, max_global_tokens: int = 0,
                        position_bias: jax.Array | None = None,
                        order: jax.Array | None = None) -> AttentionMask:
    """A sequence attending to itself; ``valid`` (``[batch, length]``) marks real tokens;
    ``order``: see ``AttentionMask``."""
    ids = _segment_ids(valid, segment_ids)
    if global_tokens is not None:
        global_tokens = global_tokens.astype(bool) & (ids > 0)
    return AttentionMask(ids, ids, prefix=None if prefix is None else prefix.astype(bool),
                         global_tokens=global_tokens, position_bias=position_bias, order=order,
                         causal=causal or prefix is not None, window=window,
                         max_global_tokens=max_global_tokens)


def cross_attention_mask(query_valid: jax.Array, key_valid: jax.Array,
                         query_segment_ids: jax.Array | None = None,
                         key_segment_ids: jax.Array | None = None) -> AttentionMask:
    """Decoder queries over encoder keys (packed rows: same example only)."""
    return AttentionMask(_segment_ids(query_valid, query_segment_ids),
                         _segment_ids(key_valid, key_segment_ids))


def _segment_ids(valid, segment_ids):
    if segment_ids is None:
        return valid.astype(jnp.int32)
    return jnp.where(valid, segment_ids, 0).astype(jnp.int32)


def pattern(query_positions, key_positions, mask: AttentionMask, prefix_q=None, prefix_k=None):
    """Which (query, key) position pairs the mask's pattern allows (segments aside)."""
    offset = query_positions[..., :, None] - key_positions[..., None, :]
    allowed = offset >= 0 if mask.causal else jnp.ones(offset.shape, bool)
    if mask.prefix is not None:
        allowed = allowed | (prefix_q[..., :, None] & prefix_k[..., None, :])
    if mask.window:
        causal_window = mask.causal and mask.prefix is None
        near = (offset < mask.window) & (offset >= 0) if causal_window else (
            jnp.abs(offset) < mask.window)
        allowed = allowed & near
    return allowed


def same_segment(query_ids, key_ids):
    return (query_ids[..., :, None] == key_ids[..., None, :]) & (
        query_ids[..., :, None] > 0) & (key_ids[..., None, :] > 0)


def dense_allowed(mask: AttentionMask) -> jax.Array:
    """The boolean ``[batch, 1, q, k]`` mask the description stands for."""
    q_len, k_len = mask.query_segment_ids.shape[1], mask.key_segment_ids.shape[1]
    prefix = None if mask.prefix is None else mask.prefix[:, None, :]
    query_positions, key_positions = jnp.arange(q_len), jnp.arange(k_len)
    if mask.order is not None:
        query_positions = key_positions = mask.order
    allowed = pattern(query_positions, key_positions, mask, prefix, prefix)
    if mask.global_tokens is not None:
        allowed = allowed | mask.global_tokens[:, None, None, :]
    return same_segment(mask.query_segment_ids, mask.key_segment_ids)[:, None] & allowed


@struct.dataclass
class SplitBias:
    """A dense bias kept as its two broadcast factors, summed where the logits are made:
    the mask's ``[batch, 1, q, k]`` and a position bias ``[1, heads, q, k]``.

    Their sum is ``[batch, heads, q, k]``. Built once for a stack, that array is read
    by every layer, and because T5's position bias is trained, its gradient is summed
    across the layers at that size too: on T5-XL at 512 tokens, 32 sequences per
    chip, that sum alone moved 3.3 GB per layer of the backward pass. The factors are
    a heads-th and a batch-th of it, and the broadcast add fuses into the logits."""
    mask_bias: jax.Array
    position_bias: jax.Array

    def dense(self) -> jax.Array:
        return self.mask_bias + self.position_bias.astype(self.mask_bias.dtype)


def dense_bias(mask: AttentionMask, dtype=jnp.float32) -> jax.Array:
    """The additive ``[batch, 1 or heads, q, k]`` bias the plain path adds to the logits."""
    bias = jnp.where(dense_allowed(mask), 0.0, NEG_INF).astype(dtype)
    if mask.position_bias is not None:
        bias = bias + mask.position_bias.astype(dtype)
    return bias


def choose_implementation(requested: str, mask: AttentionMask, *, platform: str, dtype,
                          head_dim: int, dropout: bool = False) -> tuple[str, str]:
    """``(implementation, why)`` for a request; a request the mask or platform cannot
    serve falls back to the plain path with the reason."""
    if requested not in IMPLEMENTATIONS:
        raise ValueError(f"model.attention_impl={requested!r}; choose one of {IMPLEMENTATIONS}.")
    q_len, k_len = mask.query_segment_ids.shape[1], mask.key_segment_ids.shape[1]
    chunk_reason = _chunked_unsupported(mask, q_len, k_len, dropout)
    flash_reason = _flash_unsupported(mask, platform, dtype, q_len, k_len, head_dim, dropout)
    if requested == "xla":
        return "xla", "requested"
    if requested == "chunked":
        return ("xla", f"chunked attention unavailable: {chunk_reason}") if chunk_reason else (
            "chunked", "requested")
    if requested == "flash":
        if not flash_reason:
            return "flash", "requested"
        if not chunk_reason and mask.global_tokens is not None:
            return "chunked", (f"flash attention unavailable: {flash_reason}; "
                               "chunked keeps memory linear")
        return "xla", f"flash attention unavailable: {flash_reason}"
    # auto
    if not chunk_reason and (mask.global_tokens is not None or (
            q_len >= CHUNKED_MIN_WINDOWS * mask.window and flash_reason)):
        return "chunked", "local attention over a long sequence"
    if not flash_reason and platform == "tpu" and not splash_fits(mask, q_len, k_len):
        # Planned for T5-XL at 512 tokens (docs/attention.md): the flash kernel's saved
        # per-row statistics ([batch, heads, q, 128] float32, twice per layer) outgrow
        # the plain path's scores at these lengths: 44.4 against 32.5 GiB per v5p chip.
        return "xla", ("the TPU flash kernel (for a bias or short queries) is opt-in: "
                       "attention_impl=flash")
    if not flash_reason:
        return "flash", f"fused kernel on {platform}"
    return "xla", flash_reason


def for_every_layer(mask, config, deterministic: bool):
    """What a stack hands each of its layers: the mask itself, or, where the plain path
    will run, its dense bias built once (every layer would otherwise rebuild the same
    ``[batch, heads, q, k]`` array: on CPU that cost T5 v1.1-small a tenth of its train
    step), as a ``SplitBias`` when a position bias is added on an accelerator.
    ``config`` is the family's model spec (``attention.impl``, ``numerics.dtype``, ``head_dim``,
    ``dropout_rate``). Dense biases pass unchanged; so do masks with
    global tokens, whose rows need the description."""
    if not isinstance(mask, AttentionMask) or mask.global_tokens is not None:
        return mask
    axis_size = context_axis()[1]
    if axis_size > 1 and mask.query_segment_ids.shape[1] % axis_size == 0:
        return mask  # split over a context axis: context_parallel builds it block by block
    implementation = config.attention.impl
    chosen, why = choose_implementation(
        implementation, mask, platform=traced_platform.current_platform(),
        dtype=jnp.dtype(config.numerics.dtype),
        head_dim=config.head_dim, dropout=config.dropout_rate > 0 and not deterministic)
    if chosen != "xla":
        return mask
    _report(implementation, chosen, why)
    if mask.position_bias is not None and traced_platform.current_platform() != "cpu":
        # On CPU the one summed array stays: it is small there (a few sequences per
        # step) and the CPU train step was tuned with it.
        return SplitBias(dense_bias(mask.replace(position_bias=None)), mask.position_bias)
    return dense_bias(mask)


def context_axis() -> tuple[str | None, int]:
    """``(mesh axis, size)`` that rows' positions are split over while tracing under a
    mesh and axis rules mapping ``length`` to an axis larger than 1, else ``(None, 1)``."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return None, 1
    axis = nn.logical_to_mesh_axes(("length",))[0]
    if not isinstance(axis, str) or mesh.shape.get(axis, 1) == 1:
        return None, 1
    return axis, mesh.shape[axis]


def cache_bias(length: int, key_valid: jax.Array | None = None, *, window: int = 0,
               position_bias: jax.Array | None = None) -> jax.Array:
    """The dense bias over a decoding cache of ``length`` positions, whose rows the
    decoding steps read: causal (within ``window``), over the keys ``key_valid``
    (``[batch, length]``) marks real (left-padded prompts), plus ``position_bias``."""
    keys = (jnp.ones((1, length), jnp.int32) if key_valid is None
            else key_valid.astype(jnp.int32))
    return dense_bias(AttentionMask(jnp.ones_like(keys), keys, position_bias=position_bias,
                                    causal=True, window=window))


@struct.dataclass
class PagedBias:
    """The bias of decoding steps over a paged key/value cache (``generation``): each
    attention layer keeps one pool of pages (``[kv_heads, pages, page_size, kv]``), and a
    row's keys are its pages in ``page_table`` order (``[batch, pages per row]``), so
    logical position ``p`` of a row lives in page ``page_table[row, p // page_size]`` at
    ``p % page_size``. ``positions [batch, length]`` are the fed tokens' logical positions
    (where they are written); ``bias [batch, 1, length, pages per row * page_size]`` what
    they see. Page 0 is the pool's scratch page: unused table entries point at it, and
    writes past a row's table land there. ``window``: the layer's sliding window (0:
    none), which the bias already holds; a kernel that reads the pages needs it apart.
    """

    bias: jax.Array
    page_table: jax.Array
    positions: jax.Array
    window: int = struct.field(pytree_node=False, default=0)


def paged_bias(positions: jax.Array, page_table: jax.Array, key_length: int, *,
               window: int = 0) -> PagedBias:
    """A ``PagedBias`` over ``key_length`` logical positions per row: each token sees its
    row's positions up to its own (within ``window``). A row starts at position 0, so
    every position before a token's own holds one of the row's tokens."""
    keys = jnp.arange(key_length)[None, None, :]
    query = positions[:, :, None]
    visible = keys <= query
    if window:
        visible &= query - keys < window
    bias = jnp.where(visible, 0.0, NEG_INF).astype(jnp.float32)[:, None]
    return PagedBias(bias, page_table.astype(jnp.int32), positions.astype(jnp.int32), window)


def _flash_unsupported(mask, platform, dtype, q_len, k_len, head_dim, dropout) -> str:
    if platform not in ("tpu", "gpu"):
        return f"no fused kernel on {platform}"
    if dropout:
        return "attention dropout is on (the kernels have none)"
    if mask.global_tokens is not None:
        return "global tokens (Longformer) are not a kernel mask"
    if platform == "tpu":
        if mask.prefix is not None:
            return "a prefix-LM mask differs per example (the TPU kernels' masks are static)"
        if splash_fits(mask, q_len, k_len):
            return ""
        # The flash kernel: a bias, or query lengths off splash's grid.
        if k_len % SPLASH_BLOCK:
            return f"lengths {q_len}x{k_len}: keys are not a multiple of {SPLASH_BLOCK}"
        if q_len > SPLASH_BLOCK and q_len % SPLASH_BLOCK:
            return (f"lengths {q_len}x{k_len}: queries are neither a multiple of "
                    f"{SPLASH_BLOCK} nor shorter")
        if mask.window:
            return "the flash kernel (for a position bias or short queries) has no window"
        return ""
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"cuDNN attention needs bfloat16 or float16, not {jnp.dtype(dtype).name}"
    if head_dim % 8 or head_dim > 128:
        return f"cuDNN attention needs head_dim a multiple of 8 up to 128, not {head_dim}"
    if mask.window and not (mask.causal and mask.prefix is None):
        return "cuDNN's window looks only backwards (a causal window)"
    return ""


def _chunked_unsupported(mask, q_len, k_len, dropout) -> str:
    if not mask.window:
        return "no attention window"
    if q_len != k_len:
        return "not self-attention"
    if mask.position_bias is not None:
        return "an additive position bias"
    if mask.global_tokens is not None and not mask.max_global_tokens:
        return "global tokens without max_global_tokens"
    if dropout:
        return "attention dropout is on"
    return ""


@functools.cache
def _report(requested: str, chosen: str, why: str) -> None:
    level = logging.WARNING if requested not in ("auto", chosen) else logging.INFO
    _log.log(level, "attention: %s (attention_impl=%s): %s", chosen, requested, why)


def attend(query: jax.Array, key: jax.Array, value: jax.Array, mask: AttentionMask, *,
           implementation: str = "auto", scale: float = 1.0, dtype=jnp.float32,
           dropout=None, platform: str | None = None, interpret: bool = False) -> jax.Array:
    """``query [b, q, heads, d]`` over ``key``/``value`` ``[b, k, kv_heads, d]`` ->
    ``[b, q, heads, d]``. ``dropout`` (a function of the weights) keeps the plain path."""
    platform = platform or traced_platform.current_platform()
    chosen, why = choose_implementation(implementation, mask, platform=platform, dtype=dtype,
                                        head_dim=query.shape[-1], dropout=dropout is not None)
    _report(implementation, chosen, why)
    if chosen == "chunked":
        return chunked_attention(query, key, value, mask, scale=scale, dtype=dtype)
    if chosen == "flash" and platform == "tpu":
        if splash_fits(mask, query.shape[1], key.shape[1]):
            return splash_attention(query, key, value, mask, scale=scale, interpret=interpret)
        return flash_attention(query, key, value, mask, scale=scale)
    if chosen == "flash":
        return cudnn_attention(query, key, value, mask, scale=scale)
    return reference_attention(query, key, value, mask, scale=scale, dtype=dtype, dropout=dropout)


def reference_attention(query, key, value, mask: AttentionMask | None, *, scale=1.0,
                        dtype=jnp.float32, bias=None, dropout=None,
                        logit_softcap: float = 0.0) -> jax.Array:
    """The plain path: float32 logits over every key, the dense bias, softmax.
    ``bias`` (an array or a ``SplitBias``) replaces the mask's (decoding passes rows
    of a cached bias);
    ``dropout`` is applied to the weights; ``logit_softcap`` (Gemma 2) bounds the
    scaled logits to ``cap * tanh(logits / cap)`` before the bias."""
    batch, q_len, heads, head_dim = query.shape
    kv_heads = key.shape[2]
    groups = heads // kv_heads
    # Query head h uses key/value head h // groups (Llama's repeat_kv order).
    grouped = query.reshape(batch, q_len, kv_heads, groups, head_dim)
    logits = jnp.einsum("bqkgd,bskd->bkgqs", grouped, key).astype(jnp.float32)
    logits = logits.reshape(batch, heads, q_len, key.shape[1])
    if scale != 1.0:
        logits = logits * np.float32(scale)
    if logit_softcap:
        logits = np.float32(logit_softcap) * jnp.tanh(logits / np.float32(logit_softcap))
    if bias is None and mask is not None:
        bias = dense_bias(mask)
    if isinstance(bias, SplitBias):
        logits = logits + bias.mask_bias.astype(jnp.float32) + bias.position_bias.astype(
            jnp.float32)
    elif bias is not None:
        logits = logits + bias.astype(jnp.float32)
    weights = jax.nn.softmax(logits, axis=-1).astype(dtype)
    if dropout is not None:
        weights = dropout(weights)
    weights = weights.reshape(batch, kv_heads, groups, q_len, key.shape[1])
    out = jnp.einsum("bkgqs,bskd->bqkgd", weights, value.astype(dtype))
    return out.reshape(batch, q_len, heads, head_dim)


def repeat_kv(x, heads):
    return x if x.shape[2] == heads else jnp.repeat(x, heads // x.shape[2], axis=2)


def global_indices(global_tokens: jax.Array, count: int) -> tuple[jax.Array, jax.Array]:
    """The first ``count`` global positions of each row (``[batch, count]``) and which
    of those slots hold one (a row with fewer fills the rest with position 0)."""
    order = jnp.argsort(~global_tokens, axis=1, stable=True)[:, :count]
    return order, jnp.take_along_axis(global_tokens, order, axis=1)


def chunked_attention(query, key, value, mask: AttentionMask, *, scale=1.0,
                      dtype=jnp.float32) -> jax.Array:
    """Local attention computed block by block: queries in blocks of ``window``, each
    against its own block and the neighbours (the previous one only when causal),
    plus the global keys; logits take ``L x (3 window + globals)`` memory, not L²."""
    batch, length, heads, head_dim = query.shape
    key, value = repeat_kv(key, heads), repeat_kv(value, heads)
    window = mask.window
    blocks = -(-length // window)
    padded = blocks * window
    pad = lambda x, lo=0, hi=0: jnp.pad(  # noqa: E731
        x, [(0, 0), (lo, padded - length + hi)] + [(0, 0)] * (x.ndim - 2))
    causal_window = mask.causal and mask.prefix is None
    neighbours = (-1, 0) if causal_window else (-1, 0, 1)

    def around(x):
        """``[b, padded, ...]`` -> ``[b, blocks, len(neighbours) * window, ...]``."""
        wide = pad(x, window, window)
        views = [wide[:, (1 + n) * window:(1 + n) * window + padded] for n in neighbours]
        views = [v.reshape((batch, blocks, window) + v.shape[2:]) for v in views]
        return jnp.concatenate(views, axis=2)

    def in_blocks(x):
        return pad(x).reshape((batch, blocks, window) + x.shape[2:])

    q_ids = in_blocks(mask.query_segment_ids)                     # [b, n, w]
    k_ids = around(mask.key_segment_ids)                          # [b, n, m]
    q_pos = jnp.arange(padded).reshape(blocks, window)
    # Key positions of each block's neighbourhood; those outside [0, length) carry
    # segment id 0 from the padding, so nothing sees them.
    k_pos = jnp.concatenate([(jnp.arange(blocks)[:, None] + n) * window + jnp.arange(window)
                             for n in neighbours], axis=1)
    prefix_q = prefix_k = None
    if mask.prefix is not None:
        prefix_q, prefix_k = in_blocks(mask.prefix), around(mask.prefix)
    allowed = pattern(q_pos, k_pos, mask, prefix_q, prefix_k)   # [(b,) n, w, m]
    allowed = allowed & same_segment(q_ids, k_ids)
    if mask.global_tokens is not None:
        # Global keys enter once, through their own columns below.
        allowed = allowed & ~around(mask.global_tokens)[:, :, None, :]

    q_blocks = in_blocks(query)                                   # [b, n, w, h, d]
    logits = jnp.einsum("bnqhd,bnkhd->bnhqk", q_blocks, around(key)).astype(jnp.float32)
    logits = jnp.where(allowed[:, :, None], logits * np.float32(scale), NEG_INF)
    values = [around(value)]
    if mask.global_tokens is not None:
        index, present = global_indices(mask.global_tokens, mask.max_global_tokens)
        take = lambda x: jnp.take_along_axis(  # noqa: E731
            x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)
        global_ids = jnp.where(present, take(mask.key_segment_ids), 0)
        global_logits = jnp.einsum("bnqhd,bghd->bnhqg", q_blocks, take(key)).astype(jnp.float32)
        global_allowed = same_segment(q_ids, global_ids[:, None, :])  # [b, n, w, g]
        global_logits = jnp.where(global_allowed[:, :, None], global_logits * np.float32(scale),
                                  NEG_INF)
        logits = jnp.concatenate([logits, global_logits], axis=-1)
        values.append(jnp.broadcast_to(take(value)[:, None],
                                       (batch, blocks) + take(value).shape[1:]))
    weights = jax.nn.softmax(logits, axis=-1).astype(dtype)
    out = jnp.einsum("bnhqk,bnkhd->bnqhd", weights,
                     jnp.concatenate(values, axis=2).astype(dtype))
    return out.reshape(batch, padded, heads, head_dim)[:, :length]


def global_query_attention(query, key, value, mask: AttentionMask, *, scale=1.0,
                           dtype=jnp.float32, chunked: bool = False) -> jax.Array:
    """Longformer's global rows: each global token's query (through the global
    projections) over every key of its segment. Returns ``[b, L, h, d]`` with
    the global rows filled (others zero). ``chunked``: only the global rows are
    computed (``globals x L`` logits), else the dense ``L x L`` reference."""
    batch, length, heads, head_dim = query.shape
    key, value = repeat_kv(key, heads), repeat_kv(value, heads)
    everything = AttentionMask(mask.query_segment_ids, mask.key_segment_ids)
    is_global = mask.global_tokens[:, :, None, None]
    if not chunked:
        out = reference_attention(query, key, value, everything, scale=scale, dtype=dtype)
        return jnp.where(is_global, out, 0).astype(dtype)
    index, present = global_indices(mask.global_tokens, mask.max_global_tokens)
    rows = jnp.take_along_axis(query, index[:, :, None, None], axis=1)        # [b, g, h, d]
    row_ids = jnp.where(present, jnp.take_along_axis(mask.query_segment_ids, index, axis=1), 0)
    out = reference_attention(rows, key, value, AttentionMask(row_ids, mask.key_segment_ids),
                              scale=scale, dtype=dtype)
    # Slots without a global token write nowhere (index ``length`` is dropped).
    target = jnp.where(present, index, length)
    full = jnp.zeros((batch, length, heads, head_dim), dtype)
    return full.at[jnp.arange(batch)[:, None], target].set(out.astype(dtype), mode="drop")


def _splash_module():
    """The Pallas splash kernel's module, imported where a kernel is built (see above)."""
    from jax.experimental.pallas.ops.tpu import splash_attention
    return splash_attention


def splash_kernel_mask(mask: AttentionMask, q_len: int, k_len: int, heads: int,
                       query_order: np.ndarray | None = None, q_shards: int = 1):
    """The splash kernel's static mask (full, causal or local) for every head.
    ``query_order``: the position each query slot came from, where the queries are
    permuted (a load-balanced context axis); ``q_shards``: the query shards the kernel's
    mask is cut into (``make_splash_mha(q_seq_shards=...)``)."""
    splash = _splash_module()
    shape = (q_len, k_len)
    if mask.window:
        right = 0 if mask.causal else mask.window - 1
        one = splash.LocalMask(shape, window_size=(mask.window - 1, right), offset=0,
                               shard_count=q_shards)
    elif mask.causal:
        one = splash.CausalMask(shape, shard_count=q_shards)
    else:
        return splash.MultiHeadMask([splash.FullMask(shape)] * heads)  # no order to follow
    if query_order is not None:
        one.q_sequence = np.asarray(query_order, np.int32)
    return splash.MultiHeadMask([one] * heads)


def splash_block_sizes(block: int):
    """The splash kernel's blocks, every one ``block`` (forward, dq and dkv passes)."""
    splash = _splash_module()
    return splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                             block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                             block_q_dq=block, block_kv_dq=block)


def splash_rows(kernel, q, k, v, q_ids, k_ids, scale) -> jax.Array:
    """A splash ``kernel`` over every row of ``q [b, q, heads, d]`` against ``k``/``v``
    (as many heads), with the rows' segment ids; the queries scaled first."""
    splash = _splash_module()
    out = jax.vmap(lambda q1, k1, v1, qi, ki: kernel(
        q1, k1, v1, segment_ids=splash.SegmentIds(q=qi, kv=ki)))(
            _heads_first(q * np.asarray(scale, q.dtype)), _heads_first(k), _heads_first(v),
            q_ids, k_ids)
    return _heads_first(out)


def splash_fits(mask: AttentionMask, q_len: int, k_len: int) -> bool:
    return (mask.position_bias is None and not q_len % SPLASH_BLOCK
            and not k_len % SPLASH_BLOCK)


def _heads_first(x):
    return jnp.swapaxes(x, 1, 2)


def _on_the_mesh(run, args, specs, out_spec):
    """``run(*args)``, per shard under ``shard_map`` when a mesh is set (the kernels are
    per-device programs)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return run(*args)
    return jax.shard_map(run, mesh=mesh, in_specs=specs, out_specs=out_spec,
                         check_vma=False)(*args)


def flash_attention(query, key, value, mask: AttentionMask, *, scale=1.0) -> jax.Array:
    """TPU where splash cannot go: the Pallas flash kernel, which adds a bias tile by
    tile (T5's relative positions, broadcast over the batch; its gradient comes back
    per example and is summed) and takes query blocks shorter than 128 (T5's 114
    decoder positions against 512 encoder keys). Segment ids carry packing and
    padding, ``causal`` its flag. On CPU (tests) trace the forward and backward
    passes under ``pltpu.force_tpu_interpret_mode()``."""
    from jax.experimental.pallas.ops.tpu import flash_attention as flash
    batch, q_len, heads, head_dim = query.shape
    k_len = key.shape[1]
    key, value = repeat_kv(key, heads), repeat_kv(value, heads)
    block_q, block_k = min(SPLASH_BLOCK, q_len), SPLASH_BLOCK
    sizes = flash.BlockSizes(
        block_q=block_q, block_k_major=block_k, block_k=block_k, block_b=1,
        block_q_major_dkv=block_q, block_k_major_dkv=block_k, block_k_dkv=block_k,
        block_q_dkv=block_q, block_k_major_dq=block_k, block_k_dq=block_k, block_q_dq=block_q)

    def run(q, k, v, q_ids, k_ids, position_bias):
        bias = None
        if position_bias is not None:
            bias = jnp.broadcast_to(position_bias, (q.shape[0], q.shape[2], q_len, k_len))
        # The kernel scales the biased logits; scaling the queries scales only q.k.
        return _heads_first(flash.flash_attention(
            _heads_first(q * np.asarray(scale, q.dtype)), _heads_first(k), _heads_first(v),
            bias, flash.SegmentIds(q=q_ids, kv=k_ids), causal=mask.causal, sm_scale=1.0,
            block_sizes=sizes))

    qkv_spec = nn.logical_to_mesh_axes(("batch", None, "heads", None))
    ids_spec = jax.sharding.PartitionSpec(qkv_spec[0], None)
    bias_spec = jax.sharding.PartitionSpec(None, qkv_spec[2], None, None)
    args = (query, key, value, mask.query_segment_ids, mask.key_segment_ids, mask.position_bias)
    return _on_the_mesh(run, args, (qkv_spec,) * 3 + (ids_spec,) * 2 + (
        bias_spec if mask.position_bias is not None else None,), qkv_spec)


def splash_attention(query, key, value, mask: AttentionMask, *, scale=1.0,
                     interpret: bool = False) -> jax.Array:
    """TPU: the Pallas splash kernel, its static mask (full, causal or local) with the
    segment ids of packed rows and padding; batch (and heads) split across the mesh
    by ``shard_map`` when a mesh is set. ``interpret`` runs it on CPU (tests)."""
    splash = _splash_module()
    batch, q_len, heads, head_dim = query.shape
    k_len = key.shape[1]
    key, value = repeat_kv(key, heads), repeat_kv(value, heads)
    sizes = splash_block_sizes(min(SPLASH_BLOCK, q_len, k_len))
    kernel_mask = splash_kernel_mask(mask, q_len, k_len, heads)

    def run(q, k, v, q_ids, k_ids):
        local_heads = q.shape[2]
        local_mask = kernel_mask if local_heads == heads else splash_kernel_mask(
            mask, q_len, k_len, local_heads)
        kernel = splash.make_splash_mha(local_mask, block_sizes=sizes, head_shards=1,
                                        q_seq_shards=1, interpret=interpret)
        return splash_rows(kernel, q, k, v, q_ids, k_ids, scale)

    args = (query, key, value, mask.query_segment_ids, mask.key_segment_ids)
    qkv_spec = nn.logical_to_mesh_axes(("batch", None, "heads", None))
    ids_spec = jax.sharding.PartitionSpec(qkv_spec[0], None)
    return _on_the_mesh(run, args, (qkv_spec,) * 3 + (ids_spec,) * 2, qkv_spec)


def paged_kernel_fits(paged: PagedBias, query_length: int, head_dim: int,
                      page_size: int) -> bool:
    """Whether a decoding step reads its pages with the TPU paged-attention kernel
    (``paged_attention``): on a TPU, one token a row, no sliding window (the kernel
    sees every position below a row's length), heads of a multiple of 128 and pages of
    a multiple of 8 positions (TPU tiles). Elsewhere the step gathers each row's pages."""
    return (traced_platform.current_platform() == "tpu" and query_length == 1
            and not paged.window and head_dim % 128 == 0 and page_size % 8 == 0)


def paged_attention(query, pool_key, pool_value, paged: PagedBias, *, scale=1.0,
                    logit_softcap: float = 0.0) -> jax.Array:
    """TPU decoding over a paged cache: ``query [rows, 1, heads, d]`` against the pools
    (``[kv_heads, pages, page_size, d]``) with the Pallas paged-attention kernel (vLLM's
    and JetStream's), each row reading its own pages (``paged.page_table``) up to its
    position, in place, where the plain step gathers every row's pages into a copy.
    Heads split over the mesh's ``tensor`` axis by ``shard_map`` as the pools' are
    (``plan --decode --page_size``). On CPU (tests) run it under
    ``pltpu.force_tpu_interpret_mode()``, which rounds its operands to bfloat16."""
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as kernel
    rows, _, heads, head_dim = query.shape
    kv_heads = pool_key.shape[0]
    lengths = paged.positions[:, 0] + 1
    block = int(np.gcd(paged.page_table.shape[1], 8))  # pages a kernel block reads

    def run(q, keys, values, lengths, table):
        return kernel(q, keys, values, lengths, table, pages_per_compute_block=block,
                      attn_logits_soft_cap=logit_softcap or None)

    # The query takes the pools' dtype: casting a pool would copy it at every step.
    q = (query[:, 0] * np.asarray(scale, query.dtype)).astype(pool_key.dtype)
    mesh = jax.sharding.get_abstract_mesh()
    split = (not mesh.empty and mesh.shape.get("tensor", 1) > 1
             and kv_heads % mesh.shape["tensor"] == 0)
    axis = "tensor" if split else None
    spec = jax.sharding.PartitionSpec
    out = _on_the_mesh(run, (q, pool_key, pool_value, lengths, paged.page_table),
                       (spec(None, axis, None), spec(axis, None, None, None),
                        spec(axis, None, None, None), spec(None), spec(None, None)),
                       spec(None, axis, None))
    return out.reshape(rows, 1, heads, head_dim).astype(query.dtype)


def cudnn_attention(query, key, value, mask: AttentionMask, *, scale=1.0,
                    implementation: str | None = "cudnn") -> jax.Array:
    """GPU: ``jax.nn.dot_product_attention`` with cuDNN; causal and window by the
    kernel's own flags, segments and padding by a boolean mask. ``implementation``
    lets the tests run the same call through XLA on CPU."""
    causal_only = mask.causal and mask.prefix is None
    window = None
    if mask.window:
        window = (mask.window - 1, 0 if causal_only else mask.window - 1)
    allowed = same_segment(mask.query_segment_ids, mask.key_segment_ids)[:, None]
    if mask.prefix is not None:
        allowed = allowed & dense_allowed(AttentionMask(
            mask.query_segment_ids, mask.key_segment_ids, prefix=mask.prefix, causal=True))
    return jax.nn.dot_product_attention(
        query, key, value, bias=mask.position_bias, mask=allowed, scale=scale,
        is_causal=causal_only, local_window_size=window, implementation=implementation)
