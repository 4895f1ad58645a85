"""Reward functions for online RL (``config.rl.rewards``), registered by name beside tasks
and metrics: ``RewardRegistry.add(name, fn)`` in your ``--module``.

A reward function is ``fn(completions, examples) -> list of floats`` (TRL's reward
functions take the same two things): ``completions`` the sampled texts (decoded up to
EOS), ``examples`` one dict per completion with the ``prompt`` text and the task row's
``answer`` text (its targets). ``None`` for a completion the function cannot score
counts as 0. A function that raises stops the run with one line naming it.

The built-in rewards (registered by ``t5x_like.builtin_tasks``):

- ``exact_answer``: 1 when the completion, trimmed, is the answer (case-insensitive);
- ``last_number``: 1 when the last number in the completion is the answer's (the
  checker of GSM8K-style answers that reason before answering);
- ``integer_format``: 1 when the completion is a bare integer (a format reward).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

RewardFn = Callable[[Sequence[str], Sequence[dict]], Sequence[float | None]]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class RewardRegistry:
    """Reward functions by name."""

    _REWARDS: dict[str, RewardFn] = {}

    @classmethod
    def add(cls, name: str, fn: RewardFn) -> RewardFn:
        if not callable(fn):
            raise TypeError(f"Reward {name!r} must be callable, got {fn!r}.")
        cls._REWARDS[name] = fn
        return fn

    @classmethod
    def get(cls, name: str) -> RewardFn:
        if name not in cls._REWARDS:
            raise KeyError(name)
        return cls._REWARDS[name]

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(sorted(cls._REWARDS))


def _normalised(text: str) -> str:
    return " ".join(str(text).split()).lower()


def exact_answer(completions, examples):
    return [float(_normalised(c) == _normalised(e["answer"]))
            for c, e in zip(completions, examples, strict=True)]


def last_number(completions, examples):
    def last(text):
        found = _NUMBER.findall(str(text))
        return found[-1] if found else None
    return [float(last(c) is not None and last(c) == last(e["answer"]))
            for c, e in zip(completions, examples, strict=True)]


def integer_format(completions, examples):
    return [float(re.fullmatch(r"\s*-?\d+\s*", str(c)) is not None) for c in completions]


BUILTIN = {"exact_answer": exact_answer, "last_number": last_number,
           "integer_format": integer_format}
