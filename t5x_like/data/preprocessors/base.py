"""What a preprocessor is: a step that maps a grain ``IterDataset`` to another.

Most steps look at one example at a time (``ExampleStep``): they get the
example and a numpy ``Generator`` that grain seeds from the step's seed and the
example's index in the stream, so the same seed always gives the same output and
a restored iterator continues exactly. Steps that must see several examples
(concatenate-and-split, packing) are ``StreamStep``s with their own iterator
state. A plain function ``fn(example, rng) -> example | None`` is accepted too.

``CacheMarker`` splits a task's steps for the preprocessing cache (``data/cache.py``):
the deterministic steps before it can be run once, offline, by ``cache_tasks``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grain
import numpy as np


@dataclasses.dataclass(frozen=True)
class Context:
    """What a step may read besides the example: lengths, features, the raw split."""

    task_name: str
    split: str
    task_feature_lengths: Mapping[str, int]
    output_features: Mapping[str, Any]
    source: Sequence[dict] = ()

    def length(self, key: str) -> int:
        if key not in self.task_feature_lengths:
            raise ValueError(
                f"Task {self.task_name!r} needs task_feature_lengths[{key!r}], but got "
                f"{dict(self.task_feature_lengths)}; add {key!r} to task_feature_lengths.")
        return int(self.task_feature_lengths[key])

    def vocabulary(self, key: str):
        if key not in self.output_features:
            raise ValueError(f"Task {self.task_name!r} has no output feature {key!r}; it has "
                             f"{sorted(self.output_features)}.")
        return self.output_features[key].vocabulary


class Step:
    """A pipeline step. ``check`` runs when the pipeline is built, before any worker starts."""

    def check(self, ctx: Context) -> None:
        """Raise a clear error here for lengths or features the step cannot work with."""

    def __call__(self, ds: grain.IterDataset, ctx: Context, seed: int) -> grain.IterDataset:
        raise NotImplementedError


class ExampleStep(Step):
    """A pure per-example step; ``map`` returns ``None`` to drop the example.

    Steps that never draw random numbers (``uses_rng = False``) get ``rng=None`` and
    skip grain's per-element reseeding; steps that never drop skip the filter.
    """

    uses_rng: bool = True
    may_drop: bool = True

    def map(self, example: dict, rng: np.random.Generator | None, ctx: Context) -> dict | None:
        raise NotImplementedError

    def __call__(self, ds, ctx, seed):
        if not self.uses_rng:
            return _PlainMapDataset(ds, lambda example: self.map(example, None, ctx))
        mapped = ds.random_map(lambda example, rng: self.map(example, rng, ctx), seed=seed)
        return mapped.filter(lambda example: example is not None) if self.may_drop else mapped


class _PlainMapIterator(grain.DatasetIterator):
    """``fn`` on each element, skipping ``None``; the state is the parent's.

    Deterministic steps run once per raw document (a line of text, ~40 tokens here),
    where grain's map + filter stages (timers, statistics, filter-ratio checks) cost
    more than Rekey or Tokenize themselves; this stage keeps none of that.
    """

    def __init__(self, parent, fn):
        super().__init__(parent)
        self._fn = fn

    def __next__(self):
        while True:
            example = self._fn(next(self._parent))
            if example is not None:
                return example

    def get_state(self):
        return self._parent.get_state()

    def set_state(self, state):
        self._parent.set_state(state)


class _PlainMapDataset(grain.IterDataset):
    def __init__(self, parent, fn):
        super().__init__(parent)
        self._fn = fn

    def __iter__(self):
        return _PlainMapIterator(self._parent.__iter__(), self._fn)


class StreamStep(Step):
    """A step that sees the stream (several examples in, one out, or the other way)."""


@dataclasses.dataclass(frozen=True)
class CacheMarker(Step):
    """Where a task's cache ends (seqio's ``CacheDatasetPlaceholder``): the steps before
    it run once, offline (``python -m t5x_like.cache_tasks``), and a cached task reads
    their output and runs only the steps after it. Only deterministic per-example steps
    (``ExampleStep`` with ``uses_rng = False``) may come before it.

    The marker itself does nothing and takes no step number, so adding it to a task
    changes none of its outputs. ``required``: the task may only be read from its cache.
    """

    required: bool = False

    def __call__(self, ds, ctx, seed):
        return ds


@dataclasses.dataclass(frozen=True)
class FunctionStep(ExampleStep):
    """Wraps a user's ``fn(example, rng) -> example | None``."""

    fn: Callable[[dict, np.random.Generator], dict | None]

    def map(self, example, rng, ctx):
        return self.fn(example, rng)


def as_step(preprocessor) -> Step:
    if isinstance(preprocessor, Step):
        return preprocessor
    if callable(preprocessor):
        return FunctionStep(preprocessor)
    raise TypeError(f"A preprocessor must be a Step or a function (example, rng) -> example; "
                    f"got {preprocessor!r}.")


def step_seed(seed: int, step_index: int) -> int:
    """A seed per (pipeline seed, step position): steps never share random streams."""
    return int(np.random.SeedSequence([seed, step_index]).generate_state(1)[0])


def apply_steps(ds: grain.IterDataset, steps: Sequence[Step], ctx: Context,
                seed: int, *, start: int = 0) -> grain.IterDataset:
    """``steps[start:]`` on ``ds`` (the earlier ones were applied already: a cache holds
    their output). Each step's seed comes from its number among the steps, markers not
    counted, so a cached task's steps draw what the uncached ones draw."""
    index = 0
    for position, step in enumerate(steps):
        if isinstance(step, CacheMarker):
            continue
        if position >= start:
            step.check(ctx)
            ds = step(ds, ctx, step_seed(seed, index))
        index += 1
    return ds
