"""Instruction templates: one example, phrased as an instruction and its response.

FLAN (Wei et al. 2022) wrote ten templates per dataset, some turning the task around;
T0 (Sanh et al. 2022) collected many per dataset with promptsource, each a pattern over
the example's fields plus ``answer_choices``, the words its answer is one of. A
``Template`` is that: an ``inputs`` and a ``targets`` pattern in ``str.format`` syntax
over the example's text fields, and optionally ``answer_choices`` (indexed by the
example's integer ``label``) that replace the task's own label words, so "equivalent"
can be asked as a yes/no question.

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

OPTIONS_FIELD = "options"  # the placeholder, and an example's own list of choices


@dataclasses.dataclass(frozen=True)
class Template:
    """A phrasing of a task: ``inputs`` and ``targets`` patterns over the example's
    fields (``{answer}`` is the right answer's text), ``answer_choices`` by label."""

    name: str
    inputs: str
    targets: str = "{answer}"
    answer_choices: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "answer_choices", tuple(self.answer_choices))
        for pattern in (self.inputs, self.targets):
            try:
                fields(pattern)
            except ValueError as e:
                raise ValueError(f"Template {self.name!r}: {pattern!r} is not a format "
                                 f"pattern ({e}).") from None

    @property
    def lists_options(self) -> bool:
        return OPTIONS_FIELD in fields(self.inputs)

    def render(self, example: Mapping, label_options: Sequence[str] = ()) -> dict[str, str]:
        """``{"inputs": ..., "targets": ...}`` for ``example``."""
        values = {key: as_text(value) for key, value in example.items()
                  if isinstance(value, (str, bytes))}
        choices = self.choices(example, label_options)
        if self.answer_choices:
            values["answer"] = self.answer_choices[int(example["label"])]
        elif "answer" not in values:
            values["answer"] = as_text(example["targets"])
        if choices:
            values[OPTIONS_FIELD] = "OPTIONS:\n" + "\n".join(f"- {c}" for c in choices)
        missing = [f for f in fields(self.inputs) | fields(self.targets) if f not in values]
        if missing:
            raise ValueError(f"Template {self.name!r} needs the example's {missing}; it has "
                             f"{sorted(values)}.")
        return {"inputs": self.inputs.format(**values), "targets": self.targets.format(**values)}

    def choices(self, example: Mapping, label_options: Sequence[str] = ()) -> tuple[str, ...]:
        """The answer choices this template offers for ``example`` (rank classification
        scores these)."""
        if self.answer_choices:
            return self.answer_choices
        if OPTIONS_FIELD in example:
            return tuple(as_text(o) for o in example[OPTIONS_FIELD])
        return tuple(label_options)


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
