"""Pipeline stages: a scanned stack's layers split over a ``stage`` mesh axis.

A model whose layers do not fit FSDP x tensor on one slice, or a run whose slices
are joined by a slow network, puts consecutive layers on different devices and
passes activations between them. With ``mesh.stage=S`` the stack's ``layers``
parameter axis maps to the stage axis (``partitioning.STAGE_RULES``), and each
batch is cut into M microbatches that flow through the stages: at every iteration
each stage runs its layers on the microbatch it holds, then hands the result to
the next stage (a collective permute of a microbatch's activations), and the
first stage takes a new microbatch. The program is a ``scan`` over iterations
inside ``shard_map`` over the stage axis alone (the other axes stay with the
compiler): each device runs its own stage's layers, exactly the code of an
unpipelined layer, so the compiler shards them as it shards the plain stack.
(A ``vmap`` over stages left to the compiler, as MaxText writes it, compiled here to
2x the temporaries on CPU and did not fit a 405B step on TPU that this fits.)
Forward and backward are JAX's own, and every schedule's result equals one
device's; the stack's output is summed over the stages from the last one, so every
device holds it for the layers after the stack.

Schedules (``partitioning.pipeline_schedule``):

- ``gpipe``: stage s holds layers ``s*L/S .. (s+1)*L/S - 1``; M + S - 1
  iterations, of which S - 1 are the bubble (stages idle while the pipe fills
  and drains): a fraction ``(S - 1) / (M + S - 1)``.
- ``circular``: stage s holds ``pipeline_layers_per_stage`` (k) layers of every
  one of R = L / (S k) repeats, and a microbatch circles the stages R times
  (MaxText's circular, Megatron's interleaved schedule). The bubble falls to
  ``(S - 1) / (R M + S - 1)`` for R times the hand-overs. It needs M >= S: a
  microbatch's next lap starts as the last one ends. Its parameters are stored
  ``[repeats, stages x k, ...]`` (logical axes ``circular_repeats``, ``layers``), a
  reshape of the plain ``[layers, ...]`` order, so every stage's share is contiguous.

The bubble's stages compute on zeros or stale values whose results are dropped.
Arguments that travel with the rows (masks, positions) are cut into the same
microbatches and indexed by the microbatch each stage holds.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Callable, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5x_like.models.layers import constrain
from t5x_like.system import traced_platform

SCHEDULES = ("gpipe", "circular")


@dataclasses.dataclass(frozen=True)
class PipelineSettings:
    """``partitioning.pipeline_*``: the schedule, the microbatches (0: one per stage) and,
    circular, the layers a stage runs at each visit; ``stages``: the mesh's stage count,
    which fixes a circular stack's parameter layout even where no mesh is entered
    (shapes are computed before the mesh is)."""

    schedule: str = "gpipe"
    microbatches: int = 0
    layers_per_stage: int = 1
    stages: int = 1

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"pipeline schedule {self.schedule!r}; choose one of {SCHEDULES}.")

    def repeats(self, num_layers: int, stages: int) -> int:
        """R: how many laps a microbatch makes around the stages."""
        return num_layers // (stages * self.layers_per_stage) if self.schedule == "circular" else 1

    def num_microbatches(self, stages: int) -> int:
        return self.microbatches or stages


def bubble_fraction(stages: int, microbatches: int, repeats: int = 1) -> float:
    """The share of stage-iterations spent idle: ``(S - 1) / (R M + S - 1)``."""
    return (stages - 1) / (repeats * microbatches + stages - 1)


_DEFAULT = PipelineSettings()
_SETTINGS: contextvars.ContextVar[PipelineSettings | None] = contextvars.ContextVar(
    "pipeline_settings", default=None)


@contextlib.contextmanager
def pipeline_settings(settings: PipelineSettings) -> Iterator[None]:
    """How scanned stacks traced inside run over a stage axis (the trainer sets it)."""
    token = _SETTINGS.set(settings)
    try:
        yield
    finally:
        _SETTINGS.reset(token)


def current_settings() -> PipelineSettings:
    return _SETTINGS.get() or _DEFAULT


def stages_of(mesh, rules) -> int:
    """S: the devices the ``stages`` logical axis maps to on ``mesh`` under ``rules``."""
    axes = dict(rules).get("stages")
    axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
    return math.prod(mesh.shape.get(a, 1) for a in axes)


def stage_count() -> int:
    """S: the devices the ``stages`` logical axis maps to while tracing now (1 without a
    mesh or a stage axis)."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty else math.prod(mesh.shape.get(a, 1) for a in stage_mesh_axes())


def stage_mesh_axes() -> tuple[str, ...]:
    axes = nn.logical_to_mesh_axes(("stages",))[0]
    return (axes,) if isinstance(axes, str) else tuple(axes or ())


def stack_layout(settings: PipelineSettings, num_layers: int) -> str:
    """How a stack of ``num_layers`` is stored under ``settings`` (the run fingerprint's
    ``stack.layout``): ``layers``, or ``N circular laps``."""
    laps = settings.repeats(num_layers, settings.stages) if settings.stages > 1 else 1
    return "layers" if laps == 1 else f"{laps} circular laps"


def stored_repeats(num_layers: int) -> int:
    """R while tracing now: the leading ``circular_repeats`` axis a circular pipeline
    stores its stack's parameters with (1: the plain ``[layers, ...]`` layout)."""
    settings = current_settings()
    return settings.repeats(num_layers, settings.stages) if settings.stages > 1 else 1


def run(layer: Callable, params, x: jax.Array, args, *, stages: int, microbatches: int,
        repeats: int, remat: bool = False) -> jax.Array:
    """The stack over ``x`` (``[batch, length, embed]``) through ``stages`` stages.

    ``layer(layer_params, h, args) -> h`` applies one layer; ``params`` is the stack's
    parameter tree with leaves ``[repeats, stages * k, ...]`` (circular) or
    ``[layers, ...]``; ``args`` a tree whose leaves with a leading batch dimension
    travel with their rows (others are shared). ``remat``: each iteration is recomputed
    in the backward pass, so the loop keeps only what flows between iterations (without
    it, every iteration's per-layer residuals are kept at once)."""
    batch = x.shape[0]
    m, s, r = microbatches, stages, repeats
    # [stages, k, ...]; circular: [laps, stages, k, ...], a stage picking its lap's k.
    per_stage = jax.tree.map(lambda p: p.reshape(((r,) if r > 1 else ()) + (s, -1)
                                                 + p.shape[(2 if r > 1 else 1):]), params)

    def split(a):  # rows j * M + i form microbatch i: each keeps the rows' data sharding
        cut = jnp.swapaxes(a.reshape((batch // m, m) + a.shape[1:]), 0, 1)
        return constrain(cut, (None, "batch") + (None,) * (a.ndim - 1))

    x_mb = split(x)
    arrays, args_at = _travelling(args, split, batch)
    axes = stage_mesh_axes()
    axis = axes if len(axes) != 1 else axes[0]
    total = r * m

    def stage_program(p, x_mb, arrays):
        """One device's stage: its layers (``p``: ``[1, k, ...]``, or ``[laps, 1, k, ...]``)
        over the iterations, receiving from the stage before it and sending to the next."""
        p = jax.tree.map(lambda a: a[:, 0] if r > 1 else a[0], p)
        stage = jax.lax.axis_index(axis)
        forward = [(j, (j + 1) % s) for j in range(s)]  # the last stage's output goes to 0

        def iteration(carry, i):
            held, done = carry  # this stage's last output; stage 0's laps, the last stage's
            received = jax.lax.ppermute(held, axis, forward)
            # Stage 0 keeps what the last stage finished an iteration ago for its next lap.
            done = _put(done, received, i - s, (stage == 0), total, m)
            first = jnp.where(i < m, x_mb[i % m], done[i % m])
            h = jnp.where(stage == 0, first, received)
            t = jnp.clip(i - stage, 0, total - 1)
            layers = (jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(
                a, t // m, 0, keepdims=False), p) if r > 1 else p)
            a = args_at(arrays, t % m)

            def one_layer(h, layer_params):
                return layer(layer_params, h, a), None
            out, _ = jax.lax.scan(one_layer, h.astype(x.dtype), layers)
            out = out.astype(x_mb.dtype)
            # The last stage keeps its microbatches' final laps.
            finished = i - (s - 1)
            done = _put(done, out, finished, (stage == s - 1) & (finished >= (r - 1) * m),
                        total, m)
            return (out, done), None

        if remat:
            iteration = jax.checkpoint(iteration,
                                       policy=jax.checkpoint_policies.nothing_saveable)
        init = (jnp.zeros(x_mb.shape[1:], x_mb.dtype), jnp.zeros_like(x_mb))
        (_, done), _ = jax.lax.scan(iteration, init, jnp.arange(total + s - 1))
        # Every stage returns the last stage's outputs (what the layers after the stack read).
        return jax.lax.psum(jnp.where(stage == s - 1, done, 0).astype(done.dtype), axis)

    # XLA's CPU compiler aborts on a bfloat16 all-reduce across the stages (its
    # AllReducePromotion pass), which the output's sum and the input's gradient are: on
    # CPU the activations cross the stage boundary in float32.
    crossing = jnp.float32 if traced_platform.current_platform() == "cpu" else x.dtype
    stacked = jax.sharding.PartitionSpec(*((None, axes) if r > 1 else (axes,)))
    whole = jax.sharding.PartitionSpec()
    done = jax.shard_map(
        stage_program, in_specs=(jax.tree.map(lambda _: stacked, per_stage), whole,
                                 [whole] * len(arrays)),
        out_specs=whole, axis_names=set(axes), check_vma=False)(
            per_stage, x_mb.astype(crossing), arrays)
    return jnp.swapaxes(done, 0, 1).reshape(x.shape).astype(x.dtype)


def _put(done, value, lap, mine, total: int, m: int):
    """``done`` with ``value`` in microbatch slot ``lap % m`` when ``mine`` and ``lap`` is
    one of the ``total`` microbatch-laps (an iteration in the bubble writes nothing)."""
    slot = jnp.clip(lap, 0, total - 1) % m
    keep = mine & (lap >= 0) & (lap < total)
    return jax.lax.dynamic_update_index_in_dim(done, jnp.where(keep, value, done[slot]),
                                               slot, 0)


def _travelling(args, split, batch: int):
    """``args``' arrays, those with a leading ``batch`` dimension cut into microbatches
    (``split``), and ``at(arrays, i)``: the tree again with microbatch ``i`` of each. Only
    arrays cross into the per-device program; flags (``deterministic``) stay Python."""
    flat, tree = jax.tree.flatten(args)
    where = [i for i, leaf in enumerate(flat) if isinstance(leaf, jax.Array)]
    moving = [flat[i].ndim >= 2 and flat[i].shape[0] == batch for i in where]
    arrays = [split(flat[i]) if cut else flat[i] for i, cut in zip(where, moving, strict=True)]

    def at(arrays, microbatch):
        leaves = list(flat)
        for i, leaf, cut in zip(where, arrays, moving, strict=True):
            leaves[i] = (jax.lax.dynamic_index_in_dim(leaf, microbatch, 0, keepdims=False)
                         if cut else leaf)
        return jax.tree.unflatten(tree, leaves)
    return arrays, at
