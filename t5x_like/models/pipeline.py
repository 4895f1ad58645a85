"""Pipeline stages: a scanned stack's layers split over a ``stage`` mesh axis.

A model whose layers do not fit FSDP x tensor on one slice, or a run whose slices
are joined by a slow network, puts consecutive layers on different devices and
passes activations between them. With ``mesh.stage=S`` the stack's ``layers``
parameter axis maps to the stage axis (``partitioning.STAGE_RULES``), and each
batch is cut into M microbatches that flow through the stages: at every iteration
each stage runs its layers on the microbatch it holds, then hands the result to
the next stage (one collective permute of a microbatch's activations), and the
first stage takes a new microbatch. The program is one ``vmap`` over stages inside
a ``scan`` over iterations, with the stage dimension sharded over the axis (as
MaxText's pipeline: GSPMD turns the hand-over into the permute), so forward and
backward are JAX's own and every schedule's result equals one device's.

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
    if mesh.empty:
        return 1
    axes = nn.logical_to_mesh_axes(("stages",))[0]
    if axes is None:
        return 1
    axes = (axes,) if isinstance(axes, str) else axes
    return math.prod(mesh.shape.get(a, 1) for a in axes)


def stage_mesh_axes() -> tuple[str, ...]:
    axes = nn.logical_to_mesh_axes(("stages",))[0]
    return (axes,) if isinstance(axes, str) else tuple(axes or ())


def stored_repeats(num_layers: int) -> int:
    """R while tracing now: the leading ``circular_repeats`` axis a circular pipeline
    stores its stack's parameters with (1: the plain ``[layers, ...]`` layout)."""
    settings = current_settings()
    return settings.repeats(num_layers, settings.stages) if settings.stages > 1 else 1


def run(layer: Callable, params, x: jax.Array, args, *, stages: int, microbatches: int,
        repeats: int, remat: bool = False, layer_axes=None) -> jax.Array:
    """The stack over ``x`` (``[batch, length, embed]``) through ``stages`` stages.

    ``layer(layer_params, h, args) -> h`` applies one layer; ``params`` is the stack's
    parameter tree with leaves ``[repeats, stages * k, ...]`` (circular) or
    ``[layers, ...]``; ``args`` a tree whose leaves with a leading batch dimension
    travel with their rows (others are shared). ``remat``: each iteration is recomputed
    in the backward pass, so the loop keeps only what flows between iterations (without
    it, every iteration's per-layer residuals and parameter slices are kept at once)."""
    batch = x.shape[0]
    m, s, r = microbatches, stages, repeats
    # [stages, k, ...]: GPipe's stages read their own layers; [laps, stages, k, ...]: a
    # circular stage picks its lap's (a copy of k layers, not of the stage's all).
    per_stage = jax.tree.map(lambda p: p.reshape(((r,) if r > 1 else ()) + (s, -1)
                                                 + p.shape[(2 if r > 1 else 1):]), params)

    def split(a):  # rows j * M + i form microbatch i: each keeps the rows' data sharding
        return jnp.swapaxes(a.reshape((batch // m, m) + a.shape[1:]), 0, 1)

    def travels(a):
        return getattr(a, "ndim", 0) >= 2 and a.shape[0] == batch

    rows = (None, "batch", "length", "embed")  # [microbatch, rows, length, embed]
    x_mb = constrain(split(x), rows)
    # Unconstrained, a buffer of every microbatch (or a mask) may be left whole on every
    # device: the microbatches' rows keep the batch's sharding.
    args_mb = jax.tree.map(
        lambda a: constrain(split(a), (None, "batch") + (None,) * (a.ndim - 1))
        if travels(a) else a, args)
    spmd_axes = stage_mesh_axes()

    def stage_step(p, repeat, h, microbatch):
        if r > 1:
            p = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, repeat, 0, keepdims=False),
                             p)
        a = jax.tree.map(
            lambda leaf, whole: jax.lax.dynamic_index_in_dim(leaf, microbatch, 0, keepdims=False)
            if travels(whole) else leaf, args_mb, args)

        def one_layer(h, layer_params):
            return layer(layer_params, h, a), None
        h, _ = jax.lax.scan(one_layer, h, p)
        return h

    stages_step = jax.vmap(stage_step, in_axes=(1 if r > 1 else 0, 0, 0, 0),
                           spmd_axis_name=spmd_axes if len(spmd_axes) != 1 else spmd_axes[0])
    total = r * m
    stage_ids = jnp.arange(s)

    def pinned(p):
        """The stages' parameters constrained to their own sharding inside the loop, so
        the gradients summed over its iterations stay sharded as the parameters are
        (left to the compiler, the sum is kept whole and reduce-scattered after the loop)."""
        if layer_axes is None:
            return p
        lead = (None, "stages", None) if r > 1 else ("stages", None)
        return jax.tree.map(lambda a, names: constrain(a, lead + tuple(names)), p, layer_axes,
                            is_leaf=lambda n: isinstance(n, tuple))

    def iteration(carry, i):
        held, done = carry  # each stage's last output; each microbatch's latest lap
        t = jnp.clip(i - stage_ids, 0, total - 1)
        first = jnp.where(i < m, x_mb[i % m], done[i % m])
        inputs = jnp.concatenate([first[None], held[:-1]], axis=0)
        inputs = constrain(inputs, ("stages", "batch", "length", "embed"))
        out = stages_step(pinned(per_stage), t // m, inputs, t % m)
        out = constrain(out, ("stages", "batch", "length", "embed"))
        finished = i - (s - 1)  # the lap the last stage just ended
        slot = jnp.clip(finished, 0, total - 1) % m
        keep = (finished >= 0) & (finished < total)
        done = constrain(jax.lax.dynamic_update_index_in_dim(
            done, jnp.where(keep, out[-1], done[slot]), slot, 0), rows)
        return (out, done), None

    if remat:
        iteration = jax.checkpoint(iteration, policy=jax.checkpoint_policies.nothing_saveable)
    held = constrain(jnp.zeros((s,) + x_mb.shape[1:], x.dtype), ("stages",) + rows[1:])
    (_, done), _ = jax.lax.scan(iteration, (held, constrain(jnp.zeros_like(x_mb), rows)),
                                jnp.arange(total + s - 1))
    return jnp.swapaxes(done, 0, 1).reshape(x.shape)
