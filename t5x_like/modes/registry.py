"""Training modes as plug-ins, like families: a ``Mode`` is one record of everything a
mode adds to a run, and ``register`` puts it where ``train`` finds it.

A record holds:

- ``active(spec)``: whether a run is in the mode (its spec section is set);
- ``structure``: its structural half (``structures.mode_structures.ModeStructure``: the structure
  it wraps the family's in, what the family must do), registered with it;
- ``check(spec)``: resolve-time checks beyond the spec's own (rewards found, positions),
  raising ``UserError``;
- ``frozen``: the frozen models it runs beside the policy (a teacher, a reference, a
  reward model), each a ``Frozen``: found and checked when the run resolves (configs
  only, no arrays), loaded and handed to the train step when the loop starts;
- ``start_from(spec, attached, trainer)``: params a fresh run starts from instead of an
  init (distillation's student from its teacher's layers), with the line that says so;
- ``init_params(spec, flat_params, mesh)``: what ``init_from``'s params (flattened, as
  the structure starts from them) are completed with (PPO's value model from a reward
  model's checkpoint);
- ``batches(spec, trainer, structure, vocabulary, prompt_batches)``: where the loop's
  batches come from when not from the task's rows (online RL's rollouts): a
  ``BatchSource``;
- ``evaluators``: evaluator kinds of its own (``evaluation.in_training``), registered
  with it (online RL's ``rollouts``: the rewards of greedy completions).

``preflight.resolve_training`` asks every active mode for its checks and frozen
sources in one pass; ``training.loop`` attaches the frozen models, asks for a start and a
batch source, and names no mode (``tests/test_architecture.py`` counts the places that
do). A mode of your own registers from the module you pass with ``--module``
(``docs/architecture.md`` shows one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from t5x_like.evaluation import in_training
from t5x_like.structures import mode_structures


@dataclasses.dataclass(frozen=True)
class Frozen:
    """A frozen model a mode runs beside the policy. ``name``: its key (two modes that
    need the same one, as DPO and GRPO's KL term need the reference, share it).
    ``needed(spec)``. ``resolve(spec, vocabulary, trainer) -> source``: found and
    checked against the run, configs only (``UserError``). ``attach(spec, source,
    trainer, structure) -> host params``: loaded, placed on the mesh and handed to the
    train step (``Trainer.attach_frozen``). ``planned(spec, trainer, structure)``: the
    same, abstract, for the planner (None: not planned)."""

    name: str
    needed: Callable[[Any], bool]
    resolve: Callable[[Any, Any, Any], Any]
    attach: Callable[[Any, Any, Any, Any], Any]
    planned: Callable[[Any, Any, Any], None] | None = None


class BatchSource(Protocol):
    """Where a mode's batches come from. ``due(step)``: whether the next step needs a new
    batch (else the loop reuses the last); ``next(params, step) -> (this process's rows,
    metrics)``; ``part(step)``: for a step that reuses the batch, this process's rows of
    it that the step reads (None: all of them, the batch as placed again);
    ``reused_metrics``: the metrics logged for a reused batch; ``updates_per_batch``:
    steps each batch serves (a run stops and saves only between batches); ``PHASE``
    (goodput's name for the time) and ``DOING`` (the watchdog's)."""

    PHASE: str
    DOING: str
    updates_per_batch: int
    reused_metrics: dict

    def due(self, step: int) -> bool: ...

    def next(self, params, step: int) -> tuple[dict, dict]: ...

    def part(self, step: int) -> dict | None: ...


@dataclasses.dataclass(frozen=True)
class Mode:
    """One training mode (see the module docstring)."""

    name: str
    active: Callable[[Any], bool]
    structure: mode_structures.ModeStructure | None = None
    check: Callable[[Any], None] | None = None
    frozen: tuple[Frozen, ...] = ()
    start_from: Callable[[Any, dict, Any], tuple[Any, str] | None] | None = None
    init_params: Callable[[Any, dict, Any], dict] | None = None
    batches: Callable[..., BatchSource] | None = None
    evaluators: tuple[type, ...] = ()


MODES: dict[str, Mode] = {}


def register(mode: Mode) -> Mode:
    """Makes ``mode`` part of every run it is active in (its structural half too)."""
    if mode.structure is not None:
        if mode.structure.name != mode.name:
            raise ValueError(f"Mode {mode.name!r}: its structure half is named "
                             f"{mode.structure.name!r}; they must agree.")
        mode_structures.register(mode.structure)
    for evaluator in mode.evaluators:
        in_training.register(evaluator)
    MODES[mode.name] = mode
    return mode


def active(spec) -> list[Mode]:
    """The registered modes a run is in, in registration order."""
    return [mode for mode in MODES.values() if mode.active(spec)]


def frozen_of(spec) -> list[Frozen]:
    """The frozen models the run's modes need, each once."""
    needed: dict[str, Frozen] = {}
    for mode in active(spec):
        for frozen in mode.frozen:
            if frozen.needed(spec):
                needed.setdefault(frozen.name, frozen)
    return list(needed.values())


def batch_source(spec, *args) -> BatchSource | None:
    """The batch source of the run's mode (None: the task's rows, as in pretraining)."""
    sources = [mode for mode in active(spec) if mode.batches is not None]
    return sources[0].batches(spec, *args) if sources else None


def start_from(spec, attached: dict, trainer) -> tuple[Any, str] | None:
    """``(params, line)`` a fresh run of the run's modes starts from, or None (an init)."""
    for mode in active(spec):
        if mode.start_from is not None:
            started = mode.start_from(spec, attached, trainer)
            if started is not None:
                return started
    return None


def init_params(spec, flat_params: dict, mesh) -> dict:
    """``init_from``'s ``flat_params`` completed by the run's modes (``Mode.init_params``)."""
    for mode in active(spec):
        if mode.init_params is not None:
            flat_params = mode.init_params(spec, flat_params, mesh)
    return flat_params
