"""Instruction templates: one example, phrased as an instruction and its response.

FLAN (Wei et al. 2022) wrote ten templates per dataset, some turning the task around;
T0 (Sanh et al. 2022) collected many per dataset with promptsource, each a pattern over
the example's fields plus ``answer_choices``, the words its answer is one of. A
``Template`` is that: an ``inputs`` and a ``targets`` pattern in ``str.format`` syntax
over the example's text fields (``{target}``: the right answer's text), and
optionally ``answer_choices`` (indexed by the example's integer ``label``) that replace
the task's own label words, so "equivalent" can be asked as a yes/no question.

``{options}`` in a pattern is FLAN's options suffix, ``OPTIONS:`` and one ``- choice``
line per answer choice: the template's ``answer_choices``, else the example's own
``options`` (multiple choice), else the task's ``label_options``. A template that uses
it lists its options; FLAN trained with and without them.

``ApplyTemplates`` picks one template per example from the step's seed and the
example's position in the stream (grain's per-element rng), so a restored iterator
picks what the uninterrupted one would, and writes ``inputs``, ``targets`` and the
``template`` name it used. Where the template has answer choices it also writes them
as the example's ``options``, so evaluation ranks exactly those (T0 scored every
template's own answer choices).
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Mapping, Sequence

import numpy as np

from t5x_like.data.preprocessors.base import Context, ExampleStep
from t5x_like.data.preprocessors.text import as_text
from t5x_like.errors import DataError, MissingField

OPTIONS_FIELD = "options"  # the placeholder, and an example's own list of choices
TARGET_FIELD = "target"  # the placeholder of the right answer's text
UNLABELLED = "<unk>"  # the target of an example whose label is negative (T5's)


@dataclasses.dataclass(frozen=True)
class Template:
    """A phrasing of a task: ``inputs`` and ``targets`` patterns over the example's
    fields, where ``{target}`` is the right answer's text and ``{options}`` lists the
    choices. The choices are ``answer_choices`` (by the example's integer ``label``), or
    the values of the example's ``choice_fields`` (COPA's two alternatives), or the
    example's own ``options``, or the task's label options."""

    name: str
    inputs: str
    targets: str = "{target}"
    answer_choices: tuple[str, ...] = ()
    choice_fields: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "answer_choices", tuple(self.answer_choices))
        object.__setattr__(self, "choice_fields", tuple(self.choice_fields))
        for pattern in (self.inputs, self.targets):
            try:
                fields(pattern)
            except ValueError as e:
                raise DataError(f"Template {self.name!r}: {pattern!r} is not a format "
                                f"pattern ({e}).") from None

    @property
    def lists_options(self) -> bool:
        return OPTIONS_FIELD in fields(self.inputs)

    def render(self, example: Mapping, label_options: Sequence[str] = ()) -> dict[str, str]:
        """``{"inputs": ..., "targets": ...}`` for ``example``."""
        values = {key: as_text(value) for key, value in example.items()
                  if isinstance(value, (str, bytes))}
        choices = self.choices(example, label_options)
        values[TARGET_FIELD] = self.target(example, choices)
        if choices:
            values[OPTIONS_FIELD] = "OPTIONS:\n" + "\n".join(f"- {c}" for c in choices)
        missing = sorted(f for f in fields(self.inputs) | fields(self.targets)
                         if f not in values)
        if missing:
            raise MissingField(f"Template {self.name!r} needs the example's {missing}; it has "
                               f"{sorted(values)}.", field=missing[0], lacks=missing)
        return {"inputs": self.inputs.format(**values), "targets": self.targets.format(**values)}

    def choices(self, example: Mapping, label_options: Sequence[str] = ()) -> tuple[str, ...]:
        """The answer choices this template offers for ``example`` (rank classification
        scores these)."""
        if self.answer_choices:
            return self.answer_choices
        if self.choice_fields:
            return tuple(as_text(example[f]) for f in self.choice_fields)
        if OPTIONS_FIELD in example:
            return tuple(as_text(o) for o in example[OPTIONS_FIELD])
        return tuple(label_options)

    def target(self, example: Mapping, choices: Sequence[str]) -> str:
        """The right answer's text: the choice at the example's ``label`` where the
        template sets the choices or the example has no ``targets`` text (a raw TFDS
        record), else its ``targets``. A negative label (an unlabelled test example)
        is ``UNLABELLED``, as T5 writes those targets."""
        label = _integer(example.get("label"))
        by_label = self.answer_choices or self.choice_fields or "targets" not in example
        if by_label and label is not None and choices:
            if label >= len(choices):
                raise DataError(f"Template {self.name!r}: the example's label {label} is not "
                                f"an index of its {len(choices)} answer choices "
                                f"{list(choices)}.", field="label", value=example["label"])
            return UNLABELLED if label < 0 else choices[label]
        if "targets" not in example:
            raise MissingField(f"Template {self.name!r}: the example has neither targets nor "
                               "a label among answer choices to answer with.",
                               field="targets", lacks=("targets", "label"))
        return as_text(example["targets"])


def _integer(value) -> int | None:
    """An integer label (a Python int, or a numpy scalar as TFDS gives), else None."""
    if value is None or isinstance(value, bool):
        return None
    array = np.asarray(value)
    if array.ndim == 0 and np.issubdtype(array.dtype, np.integer):
        return int(array)
    return None


def fields(pattern: str) -> set[str]:
    """The names a format pattern reads."""
    return {name for _, name, _, _ in string.Formatter().parse(pattern) if name}


@dataclasses.dataclass(frozen=True)
class ApplyTemplates(ExampleStep):
    """One of ``templates`` per example (seeded), rendered into ``inputs``/``targets``."""

    templates: tuple[Template, ...]
    label_options: tuple[str, ...] = ()

    may_drop = False

    def __post_init__(self):
        object.__setattr__(self, "templates", tuple(self.templates))
        object.__setattr__(self, "label_options", tuple(self.label_options))
        if not self.templates:
            raise ValueError("ApplyTemplates needs at least one template.")
        names = [t.name for t in self.templates]
        if len(set(names)) != len(names):
            raise ValueError(f"Template names repeat: {names}.")

    def map(self, example, rng: np.random.Generator, ctx: Context):
        template = self.templates[int(rng.integers(len(self.templates)))]
        out = {**example, **template.render(example, self.label_options),
               "template": template.name}
        choices = template.choices(example, self.label_options)
        if choices:
            out[OPTIONS_FIELD] = list(choices)
        return out

    def __repr__(self) -> str:
        return f"ApplyTemplates({len(self.templates)}: {', '.join(t.name for t in self.templates)})"
