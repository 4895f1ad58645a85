"""Distillation's structural half (``config.distill``): the student keeps its family's
structure, and the teacher's soft targets join its loss in the train step
(``modes.distill``); what the structures layer checks is that the family has a
distillation built for it (``Structure.distillable``)."""

from __future__ import annotations

from t5x_like.errors import ConfigError
from t5x_like.structures import families
from t5x_like.structures.mode_structures import ModeStructure, register


def distillable_families() -> tuple[str, ...]:
    return tuple(sorted(name for name, family in families.FAMILIES.items()
                        if family.structure.distillable))


def _in_distill_mode(spec) -> bool:
    return bool(spec.distill.teacher)


def _check(spec, family_structure) -> None:
    if not family_structure.distillable:
        raise ConfigError(f"distill works with model.family in {distillable_families()}; "
                          f"{spec.model.family!r} is not one of them.")


MODE = register(ModeStructure("distill", _in_distill_mode, check=_check))
