"""Mixture-of-experts feed-forward layers: routers, capacity and dropless dispatch,
shared experts, and the router's auxiliary losses.

One layer serves every transformer family: a family's spec has the ``experts``
section (``model.experts``; ``num_experts=0`` keeps it dense) and its blocks call
``feed_forward`` with it where they had an ``Mlp``; ``Experts.is_moe_layer`` says which
layers are sparse (every ``every``-th, as Qwen-MoE's "sparse step"; Switch's equals it
for steps 1 and 2, the ones its checkpoints use).

Routing, per token: router logits ``x @ router`` (float32), the top ``k`` experts,
and their weights, either the softmax over all experts read at the top ``k``
(``router_softmax="before_top_k"``: Switch, Qwen-MoE) or the softmax over the top ``k``
logits alone (``"after_top_k"``: Mixtral; equal to the first, renormalised).

Dispatch:

- ``capacity`` (Switch, GShard): each group (a row of the batch, or ``group_size``
  consecutive tokens) sends each expert
  at most ``ceil(capacity_factor * k * tokens / experts)`` tokens, first choices
  before second choices and earlier tokens before later ones; the rest are dropped
  from that expert (their residual carries them past the layer). One-hot dispatch
  and combine tensors make every step dense einsums, so experts shard over the
  ``expert`` mesh axis and XLA exchanges tokens with all-to-all.
- ``dropless`` (MegaBlocks): every assignment is computed. Assignments are sorted by
  expert and each expert multiplies its contiguous run of rows
  (``jax.lax.ragged_dot``; on TPU the Pallas megablox kernel where its tiles fit,
  chosen by ``impl`` as ``attention.impl`` chooses attention kernels). Under a mesh
  with an ``expert`` axis it runs as a ``shard_map`` (``expert_parallel_dropless``):
  each device sends each expert's device only the rows routed to it (a ragged
  all-to-all), that device's experts run them, and they come back the same way.

The layer ``sow``s into the ``router`` collection: the weighted auxiliary loss it adds
(``aux_loss``), the load-balancing loss (Switch's ``E * sum_e f_e * P_e``), the router
z-loss (ST-MoE's mean ``logsumexp(logits)^2``), each expert's fraction of the
assignments and the fraction dropped. ``objectives.router`` turns them into the
objective's term and the step's metrics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util
from jax.sharding import PartitionSpec

from t5x_like.config.model_parts import Experts
from t5x_like.models import layers, ragged_exchange
from t5x_like.models.layers import constrain
from t5x_like.system import traced_platform

# Imports inside functions: the Pallas TPU kernels load only on a TPU (their import fails
# elsewhere).

#: the collection the router's statistics and losses are sown into
COLLECTION = "router"


# The megablox kernel needs rows and widths in multiples of this; where one is not,
# ``auto`` falls back to ragged_dot.
_MEGABLOX_TILE = 128


def route(logits: jax.Array, k: int, softmax: str = "before_top_k"):
    """``(probabilities [..., E], weights [..., k], experts [..., k])`` of router logits:
    the top ``k`` experts by logit and their combine weights (see the module doc)."""
    logits = logits.astype(jnp.float32)
    probabilities = jax.nn.softmax(logits, axis=-1)
    top_logits, experts = jax.lax.top_k(logits, k)
    if softmax == "after_top_k":
        weights = jax.nn.softmax(top_logits, axis=-1)
    else:
        weights = jnp.take_along_axis(probabilities, experts, axis=-1)
    return probabilities, weights, experts


def load_balancing_loss(probabilities: jax.Array, experts: jax.Array, num_experts: int
                        ) -> jax.Array:
    """Switch's auxiliary loss ``E * sum_e f_e * P_e``: ``f_e`` the fraction of tokens
    that chose expert ``e`` (each of a token's ``k`` choices counts, as Mixtral's), ``P_e``
    the mean router probability of ``e``. 1 when routing is uniform (k = 1)."""
    chosen = jax.nn.one_hot(experts, num_experts).sum(axis=-2)  # [..., E]
    f = chosen.reshape(-1, num_experts).mean(axis=0)
    p = probabilities.reshape(-1, num_experts).mean(axis=0)
    return num_experts * jnp.sum(f * p)


def router_z_loss(logits: jax.Array) -> jax.Array:
    """ST-MoE's router z-loss: the mean over tokens of ``logsumexp(logits)^2``."""
    return jnp.mean(jnp.square(jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)))


def expert_capacity(tokens_per_group: int, num_experts: int, k: int,
                    capacity_factor: float) -> int:
    """Slots per expert per group: ``ceil(capacity_factor * k * tokens / experts)``."""
    return max(1, math.ceil(capacity_factor * k * tokens_per_group / num_experts))


def capacity_dispatch(experts: jax.Array, weights: jax.Array, num_experts: int,
                      capacity: int) -> tuple[jax.Array, jax.Array]:
    """One-hot ``(dispatch, combine)`` ``[groups, tokens, E, capacity]`` for each group's
    assignments ``experts [groups, tokens, k]``: a token's ``j``-th choice takes its
    expert's next free slot after every token's earlier choices and this choice of the
    tokens before it; assignments past ``capacity`` are dropped (all-zero rows).
    ``combine`` carries the routing weights."""
    groups, tokens, k = experts.shape
    # [groups, k, tokens, E]: choices in priority order (first choices first, then tokens).
    chosen = jax.nn.one_hot(jnp.swapaxes(experts, 1, 2), num_experts, dtype=jnp.int32)
    flat = chosen.reshape(groups, k * tokens, num_experts)
    slot = (jnp.cumsum(flat, axis=1) - 1) * flat  # the slot each assignment takes
    kept = flat * (slot < capacity)
    one_slot = jax.nn.one_hot(slot, capacity, dtype=jnp.float32) * kept[..., None]
    one_slot = jnp.swapaxes(one_slot.reshape(groups, k, tokens, num_experts, capacity), 1, 2)
    dispatch = one_slot.sum(axis=2)  # a token picks an expert at most once
    combine = (one_slot * weights[..., None, None].astype(jnp.float32)).sum(axis=2)
    return dispatch, combine


def _use_megablox(impl: str, rows: int, contraction: int, columns: int,
                  partitioned_by_xla: bool) -> bool:
    fits = all(n % _MEGABLOX_TILE == 0 for n in (rows, contraction, columns))
    if impl == "megablox":
        if traced_platform.current_platform() != "tpu":
            raise ValueError("model.experts.impl='megablox' is a TPU kernel; use 'auto' or "
                             "'ragged_dot' on this platform.")
        if not fits:
            raise ValueError(f"model.experts.impl='megablox' needs rows, d_model and experts.d_ff "
                             f"in multiples of {_MEGABLOX_TILE} (got {rows}, {contraction}, "
                             f"{columns}); use 'auto' to fall back to ragged_dot.")
        return True
    # A Pallas kernel is not partitioned by XLA: where XLA partitions the layer over a mesh
    # of several devices, auto keeps ragged_dot (inside the expert-parallel shard_map each
    # device runs the kernel on its own rows).
    if partitioned_by_xla:
        mesh = jax.sharding.get_abstract_mesh()
        if not (mesh.empty or mesh.size == 1):
            return False
    return impl == "auto" and fits and traced_platform.current_platform() == "tpu"


def megablox_tiling(rows: int, contraction: int, columns: int) -> tuple[int, int, int]:
    """The megablox kernel's ``(rows, contraction, columns)`` tiles: the largest up to
    MaxText's defaults (512 rows; 1024 wide) that divide the shapes. The kernel reads its
    input once per column tile and the expert's kernel once per row tile, so 128-square
    tiles move about 8x the bytes on Mixtral's shapes. The contraction and column tiles
    are one size, dividing both widths: the backward pass swaps them."""
    def largest(sizes, *dims):
        return next(t for t in sizes if all(d % t == 0 for d in dims))
    width = largest((1024, 512, 256, _MEGABLOX_TILE), contraction, columns)
    return largest((512, 256, _MEGABLOX_TILE), rows), width, width


def grouped_matmul(x: jax.Array, kernel: jax.Array, group_sizes: jax.Array,
                   impl: str = "auto", partitioned_by_xla: bool = True) -> jax.Array:
    """Rows of ``x [rows, d]`` in contiguous runs per expert times that expert's
    ``kernel [E, d, n]``: ``jax.lax.ragged_dot``, or megablox on TPU (``_use_megablox``)."""
    if _use_megablox(impl, x.shape[0], x.shape[1], kernel.shape[-1], partitioned_by_xla):
        from jax.experimental.pallas.ops.tpu.megablox import ops as megablox
        return megablox.gmm(x, kernel, group_sizes, x.dtype,
                            megablox_tiling(x.shape[0], x.shape[1], kernel.shape[-1]))
    return jax.lax.ragged_dot(x, kernel, group_sizes)


class ExpertKernels(nn.Module):
    """``num_experts`` MLPs stacked on a leading ``expert`` axis (``wi``/``wi_i``, ``wo``,
    the dense ``Mlp``'s names). Called with the model width, it returns the kernels in
    the compute dtype; ``slot_mlp`` and ``row_mlp`` apply them."""

    num_experts: int
    hidden_dim: int
    activations: Sequence[str]
    dtype: jnp.dtype = jnp.float32
    kernel_init: layers.Initializer = layers.default_kernel_init

    def _kernel(self, name, shape, axes):
        init = nn.with_logical_partitioning(
            lambda rng, s: jax.vmap(lambda r: self.kernel_init(r, s[1:]))(
                jax.random.split(rng, s[0])), axes)
        return self.param(name, init, shape).astype(self.dtype)

    @nn.compact
    def __call__(self, embed: int) -> dict[str, jax.Array]:
        kernels = {name: self._kernel(name, (self.num_experts, embed, self.hidden_dim),
                                      KERNEL_AXES["wi"])
                   for name in input_kernel_names(self.activations)}
        kernels["wo"] = self._kernel("wo", (self.num_experts, self.hidden_dim, embed),
                                     KERNEL_AXES["wo"])
        return kernels


#: logical axes of the expert kernels (input projections, output projection)
KERNEL_AXES = {"wi": ("expert", "embed", "mlp"), "wo": ("expert", "mlp", "embed")}


def input_kernel_names(activations: Sequence[str]) -> list[str]:
    return ["wi"] if len(activations) == 1 else [f"wi_{i}" for i in range(len(activations))]


def slot_mlp(slots: jax.Array, kernels: dict, activations: Sequence[str]) -> jax.Array:
    """Every expert's MLP on its own slots ``[E, ..., d]`` (capacity dispatch)."""
    hidden = None
    for name, activation in zip(input_kernel_names(activations), activations, strict=True):
        h = layers.ACTIVATIONS[activation](jnp.einsum("e...d,edf->e...f", slots, kernels[name]))
        hidden = h if hidden is None else hidden * h
    return jnp.einsum("e...f,efd->e...d", hidden, kernels["wo"])


def row_mlp(rows: jax.Array, kernels: dict, activations: Sequence[str],
            group_sizes: jax.Array, impl: str, partitioned_by_xla: bool) -> jax.Array:
    """Sorted rows ``[rows, d]``, each expert's contiguous run through its MLP
    (``grouped_matmul``); rows past ``sum(group_sizes)`` come out as zeros or garbage,
    which callers mask."""
    hidden = None
    for name, activation in zip(input_kernel_names(activations), activations, strict=True):
        h = grouped_matmul(rows, kernels[name], group_sizes, impl, partitioned_by_xla)
        h = layers.ACTIVATIONS[activation](h)
        hidden = h if hidden is None else hidden * h
    return grouped_matmul(hidden, kernels["wo"], group_sizes, impl, partitioned_by_xla)


def dropless_combine(tokens: jax.Array, experts: jax.Array, weights: jax.Array, kernels: dict,
                     activations: Sequence[str], impl: str = "auto", first_expert=0,
                     partitioned_by_xla: bool = True) -> jax.Array:
    """``sum_j weights[t, j] * expert_{experts[t, j]}(tokens[t])`` over the assignments to the
    experts ``kernels`` hold (``first_expert`` onwards; all of them on one device): the
    assignments sorted by expert, each expert's rows one grouped matmul, the others
    contributing zero. ``tokens [T, d]``, ``experts`` and ``weights [T, k]``."""
    k = experts.shape[-1]
    local = kernels["wo"].shape[0]
    flat = experts.reshape(-1) - first_expert
    mine = (flat >= 0) & (flat < local)
    key = jnp.where(mine, flat, local)  # other devices' experts sort last
    order = jnp.argsort(key, stable=True)
    group_sizes = jnp.bincount(key, length=local + 1)[:local].astype(jnp.int32)
    y = row_mlp(tokens[order // k], kernels, activations, group_sizes, impl, partitioned_by_xla)
    y = jnp.where(mine[order][:, None], y, 0)
    unsorted = jnp.zeros_like(y).at[order].set(y).reshape(tokens.shape[0], k, -1)
    return jnp.einsum("tkd,tk->td", unsorted, weights.astype(unsorted.dtype))


def _gathered_but_experts(kernel: jax.Array, spec) -> jax.Array:
    """Inside ``shard_map``: ``kernel``'s shards along every mesh axis but ``expert``
    gathered (FSDP's and tensor parallelism's), so each device holds its experts whole."""
    for dim, axes in enumerate(spec):
        axes = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
        axes = tuple(a for a in axes if a != "expert")
        if axes:
            kernel = jax.lax.all_gather(kernel, axes, axis=dim, tiled=True)
    return kernel


def _assignments_by_expert(x, experts):
    """A device's assignments sorted by expert: ``(order, rows)``, ``rows[i]`` the token
    of assignment ``order[i]`` (a token's ``k`` choices are ``k`` assignments)."""
    k = experts.shape[-1]
    order = jnp.argsort(experts.reshape(-1), stable=True)
    return order, x.reshape(-1, x.shape[-1])[order // k]


def _local_experts_of(counts: jax.Array, rows: int) -> jax.Array:
    """The local expert of each of ``rows`` received rows, which arrive as runs
    ``counts [sources, local experts]`` laid end to end (source-major); ``local`` (one
    past the last) for rows past them."""
    sources, local = counts.shape
    ends = jnp.cumsum(counts.reshape(-1))
    run = jnp.searchsorted(ends, jnp.arange(rows), side="right")
    return jnp.where(run < sources * local, run % local, local)


def receive_buffer_rows(assignments: int, devices: int, factor: float) -> int:
    """Rows of a device's receive buffer for expert-parallel dropless dispatch:
    ``factor`` times its own ``assignments`` (in whole megablox tiles where the
    assignments are), at most the worst case ``devices * assignments`` (every assignment
    of the axis to this device's experts), which ``factor=0`` asks for."""
    worst = devices * assignments
    if not factor:
        return worst
    tile = _MEGABLOX_TILE if assignments % _MEGABLOX_TILE == 0 else 1
    return min(worst, math.ceil(factor * assignments / tile) * tile)


def _fitted(runs: jax.Array, buffer_rows: int) -> jax.Array:
    """``runs [source, destination, local expert]`` cut to what lands inside each
    destination's buffer of ``buffer_rows``: sources land in order, each its experts'
    runs in order, and whatever starts past the end is dropped."""
    flat = jnp.swapaxes(runs, 0, 1).reshape(runs.shape[1], -1)  # [destination, (s, e)]
    start = ragged_exchange.exclusive_cumsum(flat, axis=1)
    kept = jnp.clip(buffer_rows - start, 0, flat)
    return jnp.swapaxes(kept.reshape(runs.shape[1], runs.shape[0], runs.shape[2]), 0, 1)


def expert_parallel_dropless(x, experts, weights, kernels, activations, impl, mesh,
                             buffer_factor: float = 0.0):
    """Dropless dispatch with the experts sharded over the mesh's ``expert`` axis, as a
    ``shard_map`` (MaxText's ragged all-to-all): each device sorts its assignments by
    expert and sends each device of its expert axis only the rows routed to that
    device's experts (``ragged_exchange.ragged_all_to_all``, run lengths exchanged
    first); the receiver groups what arrived by its local expert, runs grouped matmuls
    (megablox on TPU), and sends each row back to the device it came from, which
    weighs and sums a token's ``k`` outputs. XLA cannot partition a Pallas kernel or
    ``ragged_dot`` without gathering every operand; this keeps each expert on its
    devices and moves each assignment twice, once each way.

    The receive buffer (``receive_buffer_rows``) holds the worst case unless
    ``buffer_factor`` makes it smaller: the grouped matmuls and the elementwise work
    around them run over the whole buffer, so the worst case costs ``devices`` times
    the balanced work. Assignments past a smaller buffer are dropped (zero output; the
    residual carries the token). Returns the output and the fraction dropped."""

    def spec(names):
        return PartitionSpec(*nn.logical_to_mesh_axes(names))
    batch = spec(("batch", None, None))
    kernel_specs = {name: spec(KERNEL_AXES["wo" if name == "wo" else "wi"]) for name in kernels}
    devices = mesh.shape["expert"]
    local = kernels["wo"].shape[0] // devices
    every_device = PartitionSpec(tuple(mesh.axis_names))

    def body(x, experts, weights, kernels):
        kernels = {n: _gathered_but_experts(kernel, kernel_specs[n])
                   for n, kernel in kernels.items()}
        order, rows = _assignments_by_expert(x, experts)
        me = jax.lax.axis_index("expert")
        # runs[s, d, e]: how many assignments device s sends device d's local expert e
        counts = jnp.bincount(experts.reshape(-1), length=devices * local).astype(jnp.int32)
        wanted = jax.lax.all_gather(counts.reshape(devices, local), "expert")
        buffer_rows = receive_buffer_rows(rows.shape[0], devices, buffer_factor)
        runs = wanted if buffer_rows == devices * rows.shape[0] else _fitted(wanted, buffer_rows)
        dropped = 1.0 - runs.sum() / jnp.maximum(wanted.sum(), 1)
        sizes = runs.sum(axis=-1)  # [source, destination]
        send_sizes, recv_sizes = sizes[me], sizes[:, me]
        # each source's runs start where its unfitted runs would: dropped rows are skipped
        send_offsets = ragged_exchange.exclusive_cumsum(wanted.sum(axis=-1)[me])
        landing_offsets = ragged_exchange.exclusive_cumsum(sizes, axis=0)[me]
        buffer = jnp.zeros((buffer_rows, rows.shape[1]), rows.dtype)
        received = ragged_exchange.ragged_all_to_all(
            rows, buffer, send_offsets, send_sizes, landing_offsets, recv_sizes, "expert")
        expert_of_row = _local_experts_of(runs[:, me], received.shape[0])
        grouped = jnp.argsort(expert_of_row, stable=True)
        y = row_mlp(received[grouped], kernels, activations, runs[:, me].sum(axis=0), impl,
                    partitioned_by_xla=False)
        y = jnp.where((expert_of_row[grouped] < local)[:, None], y, 0)
        y = jnp.zeros_like(y).at[grouped].set(y)
        # back where each run came from: the source's offset of its run to this device
        returned = ragged_exchange.ragged_all_to_all(
            y, jnp.zeros_like(rows), ragged_exchange.exclusive_cumsum(recv_sizes), recv_sizes,
            ragged_exchange.exclusive_cumsum(wanted.sum(axis=-1), axis=1)[:, me], send_sizes,
            "expert")
        k = experts.shape[-1]
        out = jnp.zeros_like(returned).at[order].set(returned).reshape(-1, k, rows.shape[1])
        out = jnp.einsum("tkd,tk->td", out, weights.reshape(-1, k).astype(out.dtype))
        return out.reshape(x.shape), dropped[None]

    # Pallas kernels declare no per-axis variation of their outputs, which shard_map's
    # check needs; the collectives above say how every value varies, so it is off.
    out, dropped = jax.shard_map(body, mesh=mesh, in_specs=(batch, batch, batch, kernel_specs),
                                 out_specs=(batch, every_device), check_vma=False)(
                                     x, experts, weights, kernels)
    return out, dropped.mean()


def _expert_axis_mesh():
    """The mesh being traced under when it shards experts (an ``expert`` axis over 1)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.shape.get("expert", 1) == 1:
        return None
    return mesh


class MoeFeedForward(nn.Module):
    """The sparse feed-forward layer (``[batch, length, d] -> [batch, length, d]``)."""

    settings: Experts
    hidden_dim: int
    activations: Sequence[str]
    dtype: jnp.dtype = jnp.float32
    kernel_init: layers.Initializer = layers.default_kernel_init

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        s = self.settings
        num_experts, k = s.num_experts, s.num_experts_per_token
        router_inputs = x
        if s.router_jitter and not deterministic:
            noise = jax.random.uniform(self.make_rng("dropout"), x.shape, x.dtype,
                                       1.0 - s.router_jitter, 1.0 + s.router_jitter)
            router_inputs = x * noise
        logits = layers.DenseGeneral(num_experts, kernel_axes=("embed", None), dtype=jnp.float32,
                                     kernel_init=self.kernel_init, name="router")(
                                         router_inputs.astype(jnp.float32))
        probabilities, weights, experts = route(logits, k, s.router_softmax)
        kernels = ExpertKernels(num_experts, self.hidden_dim, tuple(self.activations), self.dtype,
                          self.kernel_init, name="experts")(x.shape[-1])
        if s.dispatch == "dropless":
            out, dropped = self._dropless(x.astype(self.dtype), experts, weights, kernels)
        else:
            out, dropped = self._capacity(x.astype(self.dtype), experts, weights, kernels)
        if s.shared_d_ff:
            shared = layers.Mlp(s.shared_d_ff, tuple(self.activations), dtype=self.dtype,
                                kernel_init=self.kernel_init, name="shared_expert")(x)
            if s.shared_gate:
                gate = layers.DenseGeneral(1, kernel_axes=("embed", None), dtype=self.dtype,
                                           kernel_init=self.kernel_init,
                                           name="shared_expert_gate")(x)
                shared = jax.nn.sigmoid(gate) * shared
            out = out + shared
        balance = load_balancing_loss(probabilities, experts, num_experts)
        z = router_z_loss(logits)
        fraction = jax.nn.one_hot(experts, num_experts).reshape(-1, num_experts).mean(axis=0)
        self.sow(COLLECTION, "aux_loss", s.aux_loss_weight * balance
                 + s.z_loss_weight * z)
        self.sow(COLLECTION, "load_balancing_loss", balance)
        self.sow(COLLECTION, "router_z_loss", z)
        self.sow(COLLECTION, "expert_fraction", fraction)
        self.sow(COLLECTION, "dropped_fraction", jnp.asarray(dropped, jnp.float32))
        return constrain(out.astype(x.dtype), ("batch", "length", "embed"))

    def _capacity(self, x, experts, weights, kernels):
        s = self.settings
        shape, k = x.shape, s.num_experts_per_token
        # Groups of ``group_size`` consecutive tokens: the dispatch tensors grow with
        # the group squared, so long rows are split (GShard's groups). Where the size does
        # not divide the tokens (a decoding step's one token a row), each row is a group.
        group = s.group_size
        if not group or (shape[0] * shape[1]) % group:
            group = shape[1]
        # The groups over the batch axes but ``expert`` (``expert_batch``): over an expert
        # axis each device then reads its experts' slots from the tokens it holds after one
        # gather along that axis. Left to itself XLA gathered every group of the batch.
        x = constrain(x.reshape(-1, group, shape[-1]), ("expert_batch", None, "embed"))
        experts, weights = (constrain(a.reshape(-1, group, k), ("expert_batch", None, None))
                            for a in (experts, weights))
        capacity = expert_capacity(group, s.num_experts, k, s.capacity_factor)
        dispatch, combine = capacity_dispatch(experts, weights, s.num_experts, capacity)
        slots = jnp.einsum("bsd,bsec->ebcd", x, dispatch.astype(x.dtype))
        slots = constrain(slots, ("expert", "expert_batch", None, "embed"))
        y = slot_mlp(slots, kernels, self.activations)
        y = constrain(y, ("expert", "expert_batch", None, "embed"))
        out = jnp.einsum("ebcd,bsec->bsd", y, combine.astype(y.dtype))
        out = constrain(out, ("expert_batch", None, "embed")).reshape(shape)
        dropped = 1.0 - dispatch.sum() / (x.shape[0] * group * k)
        return out, dropped

    def _dropless(self, x, experts, weights, kernels):
        s = self.settings
        mesh = _expert_axis_mesh()
        if mesh is not None:
            return expert_parallel_dropless(x, experts, weights, kernels, self.activations,
                                            s.impl, mesh, s.ragged_buffer_factor)
        out = dropless_combine(x.reshape(-1, x.shape[-1]), experts.reshape(-1, experts.shape[-1]),
                               weights.reshape(-1, experts.shape[-1]), kernels, self.activations,
                               s.impl)
        return out.reshape(x.shape), 0.0


def inactive_parameters(shapes, num_experts: int, k: int) -> int:
    """Parameters a token does not run through: ``(E - k) / E`` of every expert kernel
    (``experts/...`` in ``shapes``, a tree of arrays or shapes). Total minus this is the
    active parameter count of a mixture of experts."""
    if not num_experts:
        return 0
    flat = traverse_util.flatten_dict(shapes)
    experts = sum(math.prod(leaf.shape) for path, leaf in flat.items() if "experts" in path)
    return experts * (num_experts - k) // num_experts


def feed_forward(settings: Experts, sparse: bool | None, hidden_dim: int,
                 activations: Sequence[str], dropout_rate: float, dtype, name: str = "mlp",
                 use_bias: bool = False, kernel_init=layers.default_kernel_init) -> nn.Module:
    """A block's feed-forward module: ``MoeFeedForward`` where the layer is sparse, else
    the family's dense ``Mlp``. ``sparse=None`` (a scanned stack, where every layer is
    alike): sparse when the model has experts. Called in a block's compact method."""
    if sparse is None:
        sparse = settings.num_experts > 0
    if sparse:
        return MoeFeedForward(settings, settings.d_ff or hidden_dim, tuple(activations),
                              dtype, kernel_init, name=name)
    return layers.Mlp(hidden_dim, tuple(activations), dropout_rate, dtype, use_bias=use_bias,
                      kernel_init=kernel_init, name=name)


def layer_attributes(settings: Experts, num_layers: int, per_layer=None):
    """``stacking.run_stack``'s ``layer_attributes``: which layers are sparse when sparse
    and dense layers mix (``moe_every > 1``), merged with a family's own ``per_layer(i)``
    attributes; ``None`` where every layer is alike (a scan may repeat one block)."""
    mixed = settings.num_experts and settings.every > 1
    if not mixed and per_layer is None:
        return None

    def attributes(index):
        found = dict(per_layer(index)) if per_layer is not None else {}
        found["sparse"] = settings.is_moe_layer(index)
        return found
    return attributes
