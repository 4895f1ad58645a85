"""Tasks and the registry users add them to, in Python (seqio's vocabulary).

A Task turns a text source into a random-access ``grain.MapDataset`` of
examples. Index ``i`` of a split is a pure function of ``(seed, i)``: the
pipeline can jump to any step, which is what makes resume exact.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from typing import Callable, Mapping

import grain
import numpy as np

from t5x_like.data import vocabularies

# (tokens of one chunk, rng, vocabulary) -> example dict of numpy arrays.
ExampleFn = Callable[[np.ndarray, np.random.Generator, vocabularies.SentencePieceVocabulary],
                     dict]
# task_feature_lengths -> raw tokens per example.
ChunkLengthFn = Callable[[Mapping[str, int]], int]


@dataclasses.dataclass(frozen=True)
class Task:
    """Documents -> tokens -> fixed-length chunks of the token stream -> examples.

    Documents are concatenated without separators before chunking (as T5 does for
    its unsupervised objectives), so no model capacity is spent on padding.
    """

    name: str
    documents_fn: Callable[[str], list[str]]
    vocabulary_fn: Callable[[], vocabularies.SentencePieceVocabulary]
    chunk_length_fn: ChunkLengthFn
    example_fn: ExampleFn
    splits: tuple[str, ...] = ("train", "validation")
    description: str = ""

    @functools.cached_property
    def vocabulary(self) -> vocabularies.SentencePieceVocabulary:
        return self.vocabulary_fn()

    def token_stream(self, split: str) -> np.ndarray:
        return _token_stream(self, split)

    def get_dataset(self, split: str, task_feature_lengths: Mapping[str, int], *,
                    seed: int = 0, shuffle: bool = True, repeat: bool = True) -> grain.MapDataset:
        if split not in self.splits:
            raise ValueError(f"Task {self.name!r} has no split {split!r}; it has {self.splits}.")
        chunk_length = self.chunk_length_fn(task_feature_lengths)
        stream = self.token_stream(split)
        num_chunks = stream.size // chunk_length
        if num_chunks == 0:
            raise ValueError(
                f"Task {self.name!r} split {split!r} has {stream.size} tokens, fewer than one "
                f"example of {chunk_length}; shorten task_feature_lengths {dict(task_feature_lengths)}.")
        ds = grain.MapDataset.range(num_chunks)
        if shuffle:
            ds = ds.shuffle(seed=seed)  # a new permutation every epoch once repeated
        if repeat:
            ds = ds.repeat(None)
        vocab = self.vocabulary

        def make_example(chunk_index, rng):
            start = int(chunk_index) * chunk_length
            return self.example_fn(stream[start:start + chunk_length], rng, vocab)

        return ds.random_map(make_example, seed=seed)


@functools.lru_cache(maxsize=16)
def _token_stream(task: Task, split: str) -> np.ndarray:
    documents = task.documents_fn(split)
    if not documents:
        raise ValueError(f"Task {task.name!r} split {split!r} has no non-empty documents.")
    pieces = task.vocabulary.encode_batch(documents)
    return np.fromiter((t for piece in pieces for t in piece), dtype=np.int32)


class TaskRegistry:
    """Global name -> Task map. Add tasks from your own module and import it."""

    _tasks: dict[str, Task] = {}

    @classmethod
    def add(cls, task: Task) -> Task:
        if task.name in cls._tasks:
            raise ValueError(f"Task {task.name!r} is already registered; pick another name or "
                             "call TaskRegistry.remove first.")
        cls._tasks[task.name] = task
        return task

    @classmethod
    def remove(cls, name: str) -> None:
        cls._tasks.pop(name, None)

    @classmethod
    def names(cls) -> list[str]:
        return sorted(cls._tasks)

    @classmethod
    def get(cls, name: str) -> Task:
        if name not in cls._tasks:
            close = difflib.get_close_matches(name, cls._tasks, n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise KeyError(f"No task named {name!r}.{hint} Registered tasks: {cls.names()}.")
        return cls._tasks[name]
