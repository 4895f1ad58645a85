"""Families as plug-ins: one ``Family`` record names everything a ``model.family`` is
(its spec, its Flax module, its structure, its sharding rules and an optional Hugging
Face converter), and ``register`` puts it where train, eval, infer, summary, plan and
convert find it. A family of your own registers from the module you pass with
``--module`` (``docs/architecture.md`` shows one); nothing in ``t5x_like/`` changes.

The FLOPs that MFU and the planner count are the structure's
(``forward_flops_per_sequence``), and a family's own config checks its spec's
(``check``, ``check_run``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from t5x_like.config import model_spec_of
from t5x_like.config import model_specs as spec_registry
from t5x_like.config.model_parts import ModelSpec
from t5x_like.errors import ConfigError
from t5x_like.models import peft_modules
from t5x_like.structures.base import Structure


@dataclasses.dataclass(frozen=True)
class Family:
    """What a ``model.family`` is.

    ``module``: the Flax module class, built as ``module(spec)``; its class attribute
    ``init_features`` names the batch features ``init`` takes. ``rules``: logical-axis
    rules of the family's own axis names, per rule set (``partitioning.rules``) or under
    ``"*"`` for every set. ``converter``: an object with ``MODEL_TYPES`` (the Hugging
    Face ``model_type``s it imports) and the four functions of ``t5x_like/convert``'s
    modules (``model_config_from_hf``, ``params_from_hf``, ``hf_config_from_model_config``,
    ``params_to_hf``); None: no conversion."""

    name: str
    spec: type[ModelSpec]
    module: type
    structure: type[Structure]
    rules: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
    converter: Any = None

    def build_model(self, spec: ModelSpec):
        """The family's Flax module for ``spec`` (the structure adds what a model needs
        from outside its spec, such as ELMo's character table)."""
        return self.structure.build_model(spec, self.module)

    def axis_rules(self, rule_set: str) -> tuple:
        return tuple(self.rules.get("*", ())) + tuple(self.rules.get(rule_set, ()))


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Makes ``model.family = family.name`` build ``family`` everywhere."""
    if family.spec.FAMILY != family.name:
        raise ValueError(f"Family {family.name!r}: its spec {family.spec.__name__} has "
                         f"FAMILY={family.spec.FAMILY!r}; they must agree.")
    if not (isinstance(family.structure, type) and issubclass(family.structure, Structure)):
        raise TypeError(f"Family {family.name!r}: structure must be a Structure subclass.")
    spec_registry.register_model_spec(family.spec)
    FAMILIES[family.name] = family
    return family


def get(name: str) -> Family:
    if name not in FAMILIES:
        spec_registry.model_spec_class(name)  # an unknown family: one message naming them
        raise ConfigError(f"model.family={name!r} has a spec but no registered family; "
                          "register it with t5x_like.structures.families.register.")
    return FAMILIES[name]


def of(model) -> Family:
    """The family of a model spec (or model section)."""
    return get(model.family if isinstance(model, ModelSpec) else dict(model)["family"])


def build_model(model):
    """The Flax module of a model spec (or a model section in either layout)."""
    spec = model_spec_of(model)
    return get(spec.family).build_model(spec)


@functools.lru_cache(maxsize=32)
def structure_for(model_spec, prefix_attention: str, peft_settings) -> Structure:
    """The family's structure, with its model, for ``model_spec``: ``prefix_attention``
    is how decoders read their inputs, ``peft_settings``' modules (LoRA, adapters,
    prefixes, prompts) join the model (``models.peft_modules``). A training mode wraps
    this (``structures.mode_structures``)."""
    family = get(model_spec.family)
    model = peft_modules.with_peft(family.build_model(model_spec), peft_settings)
    return family.structure.for_model(model, prefix_attention)


def names() -> tuple[str, ...]:
    return tuple(sorted(FAMILIES))


def module_classes() -> tuple[type, ...]:
    return tuple(family.module for family in FAMILIES.values())
