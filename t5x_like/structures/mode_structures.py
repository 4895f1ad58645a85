"""What a training mode asks of the structures layer: the structure it wraps the family's
in, and what it needs the family's structure to do. A mode's whole record (its frozen
models, its resolve-time checks, its loop hooks) is a services-layer
``t5x_like.modes.Mode``; this is the part every command needs, the ones that never train
included: ``eval``, ``infer`` and ``plan`` build a DPO policy or a reward model through
``structures.for_config`` without importing the training modes, so the built-in modes'
structural halves register here (``structures/__init__.py``), beside the families.

``for_config`` asks the active modes for the structure and ``check_run`` asks them what
the family must do; neither names a mode (``tests/test_architecture.py`` counts the
places that do).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from t5x_like.errors import ConfigError
from t5x_like.structures.base import Structure


@dataclasses.dataclass(frozen=True)
class ModeStructure:
    """``active(spec)``: whether a run is in this mode (its spec section is set).
    ``wrap(spec, peft_settings) -> Structure``: the structure a run of this mode trains,
    evaluates and infers with, built around the family's (``families.structure_for``);
    None: the family's own (distillation changes the loss only). ``check(spec,
    family_structure_class)``: what the family must be able to do, as a ``ConfigError``.
    ``as_trained_model(spec) -> spec``: how ``eval``, ``infer`` and scoring read a
    checkpoint this mode trained (a DPO policy is a plain causal decoder); None: as
    trained. ``completed(spec) -> spec``: what the mode fills in when the spec resolves
    (a head's labels from its task), saved with the run's config."""

    name: str
    active: Callable[[Any], bool]
    wrap: Callable[[Any, Any], Structure] | None = None
    check: Callable[[Any, type[Structure]], None] | None = None
    as_trained_model: Callable[[Any], Any] | None = None
    completed: Callable[[Any], Any] | None = None


MODES: dict[str, ModeStructure] = {}


def register(mode: ModeStructure) -> ModeStructure:
    """Makes ``mode`` part of every structure built for a run in it."""
    MODES[mode.name] = mode
    return mode


def active(spec) -> list[ModeStructure]:
    """The registered modes a run is in, in registration order."""
    return [mode for mode in MODES.values() if mode.active(spec)]


def wrapping(spec) -> ModeStructure | None:
    """The one active mode that wraps the family's structure (None: the family's own); two
    would each build a model the other does not read, refused here."""
    wrappers = [mode for mode in active(spec) if mode.wrap is not None]
    if len(wrappers) > 1:
        raise ConfigError(f"The {wrappers[0].name} and {wrappers[1].name} modes each train "
                          "their own model around the family's; a run is in one of them. "
                          "Turn one off.")
    return wrappers[0] if wrappers else None


def completed(spec):
    """``spec`` with what its modes fill in when it resolves."""
    for mode in active(spec):
        if mode.completed is not None:
            spec = mode.completed(spec)
    return spec


def as_trained_model(spec):
    """``spec`` as ``eval`` and ``infer`` read a checkpoint its modes trained."""
    for mode in active(spec):
        if mode.as_trained_model is not None:
            spec = mode.as_trained_model(spec)
    return spec


def check_continues_prompts(spec, family_structure: type[Structure], key: str) -> None:
    """A mode that trains a decoder policy on prompts and their responses (``key``: its
    setting) refuses a family that does not continue a prompt."""
    if not family_structure.generates_after_prompt:
        raise ConfigError(f"{key} trains a decoder policy (or a reward model on one) on "
                          f"prompts and their responses; model.family={spec.model.family!r} "
                          "does not continue a prompt. Start from a decoder checkpoint.")
