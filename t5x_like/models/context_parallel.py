"""Attention across a ``context`` mesh axis: every row's positions split over its devices.

Long rows (32k to 1M tokens) do not fit one chip's activations however the
parameters are sharded. With ``mesh.context=C`` the ``length`` and ``kv_length``
logical axes map to the ``context`` mesh axis (``partitioning.py``): each device
holds one C-th of every row's positions, and everything but attention (the
projections, the MLP, the norms) is position-wise, so it runs on its part alone.
Attention is where a query needs keys held elsewhere. Two strategies
(``partitioning.context_attention``), both per-device programs under ``shard_map``:

- ``all_gather``: each layer gathers the row's keys and values along the axis,
  then its queries attend to all of them. Simple; a device holds the whole row's
  keys and values and a ``[queries / C, keys]`` block of logits at once.
- ``ring``: keys and values travel around the axis in C - 1 hops
  (``ppermute``); each device folds every block it receives into a running
  softmax (flash attention's recurrence), recomputed in the backward pass, so it
  holds one block of keys and of logits at a time. The same bytes move; the
  memory is a C-th.

A causal mask gives the device holding a row's first positions almost nothing
to do and the last device almost everything. Load balancing
(``partitioning.context_load_balance``, decoders) cuts each row into 2C parts
and gives device i parts i and 2C-1-i, so every device has as many visible
(query, key) pairs (as MaxText's and Megatron's reorder). The model permutes its
inputs on the way in and its hidden states back on the way out, so the loss and
everything outside the stack see rows in their order. The mask's pattern
compares the positions each token came from (``AttentionMask.order``), so
packing (segment ids), causal, prefix-LM and window masks mean what they mean
unsplit, and the result equals one device's up to the order of float sums.

On TPU, all-gather runs the splash kernel inside each shard (``_gathered_splash``);
the ring, and every strategy on CPU and GPU, compute their blocks by the plain path
(einsum, float32 logits).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from t5x_like.models import attention
from t5x_like.system import traced_platform

# Imports inside functions: the Pallas TPU kernels load only on a TPU (their import fails
# elsewhere).

STRATEGIES = ("all_gather", "ring")


@dataclasses.dataclass(frozen=True)
class ContextSettings:
    """``partitioning.context_attention`` and ``partitioning.context_load_balance``."""

    attention: str = "all_gather"
    load_balance: bool = True

    def __post_init__(self):
        if self.attention not in STRATEGIES:
            raise ValueError(f"context attention {self.attention!r}; choose one of {STRATEGIES}.")


_DEFAULT = ContextSettings()
_SETTINGS: contextvars.ContextVar[ContextSettings | None] = contextvars.ContextVar(
    "context_settings", default=None)


@contextlib.contextmanager
def context_settings(settings: ContextSettings) -> Iterator[None]:
    """How models traced inside attend across a context axis (the trainer sets it with
    its mesh and rules)."""
    token = _SETTINGS.set(settings)
    try:
        yield
    finally:
        _SETTINGS.reset(token)


def current_settings() -> ContextSettings:
    return _SETTINGS.get() or _DEFAULT


def splits(length: int) -> bool:
    """Whether rows of ``length`` positions are split over a context axis while tracing
    now. Rows the axis does not divide (an evaluator's own lengths; the run's were
    checked) take the plain path, whole on every device: correct, not lean."""
    _, size = attention.context_axis()
    return size > 1 and length % size == 0


def balanced_parts(length: int) -> int:
    """C when a causal model's rows of ``length`` positions traced now are load-balanced
    over a context axis of size C, else 0."""
    _, size = attention.context_axis()
    balanced = size > 1 and current_settings().load_balance and length % (2 * size) == 0
    return size if balanced else 0


# -- the load-balanced order ----------------------------------------------------

def balance(x: jax.Array, parts: int) -> jax.Array:
    """``x`` (``[batch, length, ...]``) in the load-balanced order: the row cut into
    ``2 * parts`` pieces, device i's share being pieces i and ``2 * parts - 1 - i``."""
    batch, length = x.shape[:2]
    piece = length // (2 * parts)
    halves = x.reshape((batch, 2, parts, piece) + x.shape[2:])
    early, late = halves[:, 0], jnp.flip(halves[:, 1], axis=1)
    return jnp.stack([early, late], axis=2).reshape(x.shape)


def unbalance(x: jax.Array, parts: int) -> jax.Array:
    """The inverse of ``balance``: rows back in their order."""
    batch, length = x.shape[:2]
    piece = length // (2 * parts)
    shares = x.reshape((batch, parts, 2, piece) + x.shape[2:])
    early, late = shares[:, :, 0], jnp.flip(shares[:, :, 1], axis=1)
    return jnp.concatenate([early, late], axis=1).reshape(x.shape)


def balanced_order(length: int, parts: int) -> np.ndarray:
    """The position each slot of a balanced row came from (``AttentionMask.order``)."""
    halves = np.arange(length, dtype=np.int32).reshape(2, parts, length // (2 * parts))
    return np.stack([halves[0], halves[1][::-1]], axis=1).reshape(length)


# -- attention across the axis --------------------------------------------------

def attend(query, key, value, mask: attention.AttentionMask, *, scale: float = 1.0,
           dtype=jnp.float32, implementation: str = "auto", platform: str | None = None,
           interpret: bool = False) -> jax.Array:
    """Self-attention of ``query [b, L, heads, d]`` over ``key``/``value``
    ``[b, L, kv_heads, d]`` whose ``L`` is split over the context axis, by the
    strategy of ``context_settings``. A mask with a position bias or global tokens
    raises: runs that would need one are refused first (``config.devices.check_context``).
    On TPU, all-gather runs the splash kernel inside each shard where the whole row's
    attention would (``implementation`` as ``model.attention.impl``; ``interpret``
    runs the kernel on CPU, for tests)."""
    axis, size = attention.context_axis()
    length = query.shape[1]
    if key.shape[1] != length:
        raise ValueError("Context-parallel attention is self-attention; cross-attention "
                         "(encoder-decoders) is not split over a context axis.")
    if length % size:
        raise ValueError(f"A row of {length} positions does not split over mesh.context={size}.")
    mesh = jax.sharding.get_abstract_mesh()
    query_spec = PartitionSpec(*nn.logical_to_mesh_axes(("batch", "length", "heads", None)))
    if query.shape[0] % _size(mesh, query_spec[0]):
        # A batch the data axes do not divide (init's one example row) stays whole.
        query_spec = PartitionSpec(None, *query_spec[1:])
    heads_axis = query_spec[2]
    if key.shape[2] != query.shape[2] and heads_axis is not None:
        # Query heads split over the tensor axis: each device's query heads need their own
        # key/value heads, which the grouped layout does not split alike.
        key, value = (jnp.repeat(x, query.shape[2] // x.shape[2], axis=2) for x in (key, value))
    key_spec = PartitionSpec(query_spec[0], axis, heads_axis, None)
    rows_spec = PartitionSpec(query_spec[0], axis)
    order = (jnp.arange(length, dtype=jnp.int32) if mask.order is None
             else mask.order.astype(jnp.int32))
    prefix = mask.prefix
    if _splash_applies(mask, query, implementation, platform, dtype, size):
        return _gathered_splash(query, key, value, mask, axis, size, query_spec, scale,
                                interpret)
    block = _ring if current_settings().attention == "ring" else _gathered
    pattern = dataclasses.replace(_Pattern.of(mask), axis=axis, size=size)

    def run(q, k, v, q_ids, k_ids, q_order, q_prefix):
        return block(q, k, v, q_ids, k_ids, q_order, q_prefix, pattern=pattern, scale=scale,
                     dtype=dtype)

    args = (query, key, value, mask.query_segment_ids, mask.key_segment_ids, order, prefix)
    specs = (query_spec, key_spec, key_spec, rows_spec, rows_spec, PartitionSpec(axis),
             None if prefix is None else rows_spec)
    return jax.shard_map(run, mesh=mesh, in_specs=specs, out_specs=query_spec,
                         check_vma=False)(*args)


def _splash_applies(mask, query, implementation, platform, dtype, size) -> bool:
    """The splash kernel inside each shard: on TPU, for all-gather, where a whole row
    would take it (``attention.choose_implementation``) and each device's queries are
    whole kernel blocks. The ring folds blocks into a running softmax whose statistics
    the kernel does not give back with gradients: it keeps the plain path."""
    platform = platform or traced_platform.current_platform()
    if platform != "tpu" or current_settings().attention != "all_gather":
        return False
    chosen, _ = attention.choose_implementation(implementation, mask, platform=platform,
                                                dtype=dtype, head_dim=query.shape[-1])
    length = query.shape[1]
    return (chosen == "flash" and attention.splash_fits(mask, length, length)
            and (length // size) % attention.SPLASH_BLOCK == 0
            and length % (size * size) == 0)


def _block(queries: int) -> int:
    """The kernel's block for a shard of ``queries``: the largest up to 512 (MaxText's)
    dividing it. Long rows need large blocks: the kernel's mask is mapped block by
    block when it is built, ``(L / block)^2`` blocks."""
    return next(b for b in (512, 256, attention.SPLASH_BLOCK) if queries % b == 0)


def _gathered_splash(query, key, value, mask, axis, size, query_spec, scale, interpret):
    """All-gather with the splash kernel: each device gathers the row's keys and values
    (back in their positions' order where the row is load-balanced) and its queries
    attend to them through one kernel whose mask spans the whole row, cut into the
    axis's query shards (``make_splash_mha(q_seq_shards=C)``, as MaxText's): each
    device's kernel gets the block map of its own queries, which the mask places by
    the positions they came from (``q_sequence``), so the balanced order is causal."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash
    batch, length, heads, _ = query.shape
    parts = balanced_parts(length) if mask.order is not None else 0
    order = balanced_order(length, parts) if parts else None
    mesh = jax.sharding.get_abstract_mesh()
    local_heads = heads // _size(mesh, query_spec[2])
    kernel = splash.make_splash_mha(
        attention.splash_kernel_mask(mask, length, length, local_heads, order, size),
        block_sizes=attention.splash_block_sizes(_block(length // size)),
        head_shards=1, q_seq_shards=size, interpret=interpret)
    kernel_spec = kernel.manual_sharding_spec(
        jax.sharding.NamedSharding(mesh, PartitionSpec(None, axis)))
    key_spec = PartitionSpec(query_spec[0], axis, query_spec[2], None)
    rows_spec = PartitionSpec(query_spec[0], axis)
    if key.shape[2] != heads and local_heads != heads:
        # Query heads split over the tensor axis need their own key/value heads.
        key, value = attention.repeat_kv(key, heads), attention.repeat_kv(value, heads)
    elif key.shape[2] != heads:
        key_spec = PartitionSpec(query_spec[0], axis, None, None)  # gathered, then repeated

    def run(kernel, q, k, v, q_ids, k_ids):
        def whole_row(x):
            x = jax.lax.all_gather(x, axis, axis=1, tiled=True)
            return unbalance(x, parts) if parts else x
        k, v, k_ids = whole_row(k), whole_row(v), whole_row(k_ids)
        k, v = attention.repeat_kv(k, q.shape[2]), attention.repeat_kv(v, q.shape[2])
        return attention.splash_rows(kernel, q, k, v, q_ids, k_ids, scale)

    args = (kernel, query, key, value, mask.query_segment_ids, mask.key_segment_ids)
    specs = (kernel_spec, query_spec, key_spec, key_spec, rows_spec, rows_spec)
    return jax.shard_map(run, mesh=mesh, in_specs=specs, out_specs=query_spec,
                         check_vma=False)(*args)


def _size(mesh, axes) -> int:
    """How many devices the mesh axis (or tuple of axes, or None) spans."""
    names = () if axes is None else (axes,) if isinstance(axes, str) else axes
    return int(np.prod([mesh.shape[name] for name in names]))


@dataclasses.dataclass(frozen=True)
class _Pattern:
    """The static part of a mask, and the axis the blocks travel on."""

    causal: bool
    window: int
    axis: str = ""
    size: int = 1

    @classmethod
    def of(cls, mask: attention.AttentionMask) -> _Pattern:
        if mask.position_bias is not None or mask.global_tokens is not None:
            raise ValueError("Context-parallel attention builds segment, causal, prefix and "
                             "window masks; a position bias or global tokens are not built.")
        return cls(causal=mask.causal, window=mask.window)

    def allowed(self, q_ids, k_ids, q_order, k_order, q_prefix, k_prefix) -> jax.Array:
        """``[b, q, k]``: which keys each query sees, by the positions they came from."""
        mask = attention.AttentionMask(q_ids, k_ids, prefix=q_prefix, causal=self.causal,
                                       window=self.window)
        return attention.pattern(q_order, k_order, mask, q_prefix, k_prefix) & (
            attention.same_segment(q_ids, k_ids))


def _gathered(q, k, v, q_ids, k_ids, order, prefix, *, pattern: _Pattern, scale, dtype):
    """All-gather: the row's keys and values, then the plain path over them."""
    def gather(x):
        return None if x is None else jax.lax.all_gather(
            x, pattern.axis, axis=1 if x.ndim > 1 else 0, tiled=True)

    allowed = pattern.allowed(q_ids, gather(k_ids), order, gather(order), prefix,
                              gather(prefix))
    bias = jnp.where(allowed, 0.0, attention.NEG_INF)[:, None]
    return attention.reference_attention(q, gather(k), gather(v), None, scale=scale,
                                         dtype=dtype, bias=bias)


def _ring(q, k, v, q_ids, k_ids, order, prefix, *, pattern: _Pattern, scale, dtype):
    """Ring: fold the local block, then C - 1 times pass the keys on and fold the block
    that arrived, in a running softmax; each fold is recomputed in the backward pass."""
    batch, q_len, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    grouped = q.reshape(batch, q_len, kv_heads, heads // kv_heads, head_dim)
    travelling = (k, v, k_ids, order, prefix)

    @jax.checkpoint
    def fold(state, block):
        running_max, total, out = state
        k_block, v_block, ids, k_order, k_prefix = block
        logits = jnp.einsum("bqkgd,bskd->bkgqs", grouped, k_block).astype(jnp.float32)
        logits = logits * np.float32(scale)
        allowed = pattern.allowed(q_ids, ids, order, k_order, prefix, k_prefix)
        logits = logits + jnp.where(allowed, 0.0, attention.NEG_INF)[:, None, None]
        new_max = jnp.maximum(running_max, logits.max(axis=-1))
        correction = jnp.exp(running_max - new_max)
        weights = jnp.exp(logits - new_max[..., None])
        total = total * correction + weights.sum(axis=-1)
        out = out * correction[..., None] + jnp.einsum(
            "bkgqs,bskd->bkgqd", weights, v_block.astype(jnp.float32))
        return new_max, total, out

    def hop(carry, _):
        state, block = carry
        state = fold(state, block)
        shift = [(i, (i + 1) % pattern.size) for i in range(pattern.size)]
        block = jax.tree.map(lambda x: jax.lax.ppermute(x, pattern.axis, shift), block)
        return (state, block), None

    stats = (batch, kv_heads, heads // kv_heads, q_len)
    state = (jnp.full(stats, -jnp.inf, jnp.float32), jnp.zeros(stats, jnp.float32),
             jnp.zeros(stats + (head_dim,), jnp.float32))
    (state, block), _ = jax.lax.scan(hop, (state, travelling), None, length=pattern.size - 1)
    _, total, out = fold(state, block)
    out = (out / total[..., None]).astype(dtype)                   # [b, kv, g, q, d]
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(batch, q_len, heads, head_dim)
