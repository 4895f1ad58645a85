"""Concatenate documents and split into chunks; causal and prefix LM examples.

Concatenating before splitting is what T5 and GPT do for unsupervised
objectives: no model capacity is spent on padding, documents run into each
other (each one ends with EOS when ``AppendEos`` runs first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import grain
import numpy as np

from t5x_like.data.preprocessors.base import Context, ExampleStep, StreamStep
from t5x_like.data.preprocessors.text import check_minimum_length

LengthSpec = int | Callable[[Context], int]


class _ChunkIterator(grain.DatasetIterator):
    """Concatenates ``key`` across examples and emits ``length``-token chunks.

    Its state is the parent's state plus the carried tokens, so a restored
    iterator emits exactly the chunks an uninterrupted one would.
    """

    def __init__(self, parent, key: str, length: int, keep_tail: bool):
        super().__init__(parent)
        self._key, self._length, self._keep_tail = key, length, keep_tail
        self._buffer = np.zeros(0, np.int32)
        self._exhausted = False

    def __next__(self):
        while self._buffer.size < self._length and not self._exhausted:
            try:
                example = next(self._parent)
            except StopIteration:
                self._exhausted = True
                break
            tokens = np.asarray(example[self._key], np.int32)
            self._buffer = np.concatenate([self._buffer, tokens]) if self._buffer.size else tokens
        if self._buffer.size == 0 or (self._buffer.size < self._length and not self._keep_tail):
            raise StopIteration
        chunk, self._buffer = self._buffer[:self._length], self._buffer[self._length:]
        return {self._key: chunk}

    def get_state(self):
        return {"parent": self._parent.get_state(), "buffer": self._buffer.tolist(),
                "exhausted": self._exhausted}

    def set_state(self, state):
        self._parent.set_state(state["parent"])
        self._buffer = np.asarray(state["buffer"], np.int32)
        self._exhausted = bool(state["exhausted"])


class _ChunkDataset(grain.IterDataset):
    def __init__(self, parent, key, length, keep_tail):
        super().__init__(parent)
        self._key, self._length, self._keep_tail = key, length, keep_tail

    def __iter__(self):
        return _ChunkIterator(self._parent.__iter__(), self._key, self._length, self._keep_tail)


def resolve_length(length: LengthSpec, ctx: Context) -> int:
    return int(length(ctx) if callable(length) else length)


@dataclasses.dataclass(frozen=True)
class ConcatenateAndSplit(StreamStep):
    """``key`` of consecutive examples -> one token stream -> chunks of ``length`` tokens.

    ``length`` is a number or ``fn(ctx)`` of the task lengths (span corruption needs
    T5's length arithmetic). Other features are dropped. The last, shorter chunk of
    a finite stream is kept when ``keep_tail``.
    """

    key: str = "targets"
    length: LengthSpec = 512
    keep_tail: bool = True

    def check(self, ctx):
        if resolve_length(self.length, ctx) < 1:
            raise ValueError(f"Task {ctx.task_name!r}: ConcatenateAndSplit got a chunk length "
                             f"below 1 from task_feature_lengths {dict(ctx.task_feature_lengths)}.")

    def __call__(self, ds, ctx, seed):
        return _ChunkDataset(ds, self.key, resolve_length(self.length, ctx), self.keep_tail)


def length_minus_eos(key: str) -> Callable[[Context], int]:
    """Chunk length that leaves room for the EOS appended after splitting."""
    def fn(ctx: Context) -> int:
        return check_minimum_length(ctx, key, 2, "an example with EOS") - 1
    fn.__qualname__ = f"length_minus_eos({key!r})"
    return fn


def prefix_lm_split(tokens: np.ndarray, rng: np.random.Generator, max_inputs: int,
                    max_targets: int) -> tuple[np.ndarray, np.ndarray]:
    """A uniformly random split point with at least one token on each side.

    The point is drawn among those that keep ``inputs <= max_inputs`` and
    ``targets <= max_targets``; ``tokens`` must have 2..max_inputs+max_targets tokens.
    """
    n = tokens.size
    low, high = max(1, n - max_targets), min(max_inputs, n - 1)
    if n < 2 or low > high:
        raise ValueError(f"prefix_lm_split cannot split {n} tokens into inputs <= {max_inputs} "
                         f"and targets <= {max_targets}; use chunks of 2..{max_inputs + max_targets}.")
    split = int(rng.integers(low, high + 1))
    return tokens[:split], tokens[split:]


@dataclasses.dataclass(frozen=True)
class PrefixLM(ExampleStep):
    """``targets`` chunk -> random ``inputs`` prefix + ``targets`` continuation, both with EOS
    on the targets only (the prefix flows into the continuation).

    Chunk with ``ConcatenateAndSplit(length=prefix_lm_chunk_length)`` first.
    """

    key: str = "targets"

    def check(self, ctx):
        check_minimum_length(ctx, "inputs", 1, "prefix LM")
        check_minimum_length(ctx, "targets", 2, "prefix LM (one token and EOS)")

    def map(self, example, rng, ctx):
        tokens = np.asarray(example[self.key], np.int32)
        if tokens.size < 2:
            return None  # a one-token tail cannot be split; documented skip
        inputs, targets = prefix_lm_split(tokens, rng, ctx.length("inputs"),
                                          ctx.length("targets") - 1)
        eos = ctx.vocabulary("targets").eos_id
        return {"inputs": inputs, "targets": np.concatenate([targets, [eos]]).astype(np.int32)}


def prefix_lm_chunk_length(ctx: Context) -> int:
    """inputs + targets - 1: the whole budget, less the EOS that ends the targets."""
    return ctx.length("inputs") + ctx.length("targets") - 1
