"""Text sources: where raw documents come from, before any tokenization.

A source is an indexable, deterministic collection of documents (``str``).
Random access by index is what lets the pipeline derive every random choice
from ``(seed, example index)`` and resume a stream exactly.

``Source.shard`` splits a split into disjoint shards that together hold every
example once: every ``num_shards``-th record by default, whole files for file
sources with at least ``num_shards`` files (so a process reads only its files).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import gzip
import json
import os
import re
from typing import Callable, Mapping, Sequence

# "Genesis 1:1<TAB>In the beginning ..." -> the verse text only.
_VERSE_KEY = re.compile(r"^[^\t]*\d+:\d+\t")

SPLITS = ("train", "validation")


def _is_validation_line(line_index: int, holdout_every: int) -> bool:
    """Every ``holdout_every``-th line is held out; stable across runs and hosts."""
    return line_index % holdout_every == holdout_every - 1


@dataclasses.dataclass(frozen=True)
class TextLineSource:
    """Documents are lines of UTF-8 text files (plain or ``.gz``), read in path order.

    ``split`` selects a deterministic hold-out: every ``holdout_every``-th line of
    each file is ``validation``, the rest ``train``. Lines that are empty after
    stripping are skipped (documented skip, never an error).
    """

    file_patterns: Sequence[str]
    split: str = "train"
    holdout_every: int = 100
    strip_verse_keys: bool = True

    def __post_init__(self):
        if self.split not in SPLITS:
            raise ValueError(
                f"Unknown split {self.split!r}; TextLineSource has splits {SPLITS}.")

    def files(self) -> list[str]:
        paths: list[str] = []
        for pattern in self.file_patterns:
            matched = sorted(glob.glob(os.path.expanduser(pattern)))
            if not matched:
                raise FileNotFoundError(
                    f"No file matches {pattern!r}. Check the path (relative paths are "
                    f"resolved from {os.getcwd()!r}) or run from the repository root.")
            paths.extend(matched)
        return paths

    def documents(self) -> list[str]:
        want_validation = self.split == "validation"
        docs: list[str] = []
        for path in self.files():
            for index, line in enumerate(_read_lines(path)):
                if _is_validation_line(index, self.holdout_every) != want_validation:
                    continue
                if self.strip_verse_keys:
                    line = _VERSE_KEY.sub("", line, count=1)
                line = line.strip()
                if line:
                    docs.append(line)
        return docs


def _read_lines(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    # errors="replace": a stray non-UTF-8 byte becomes U+FFFD instead of a crash.
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        return f.read().splitlines()


# -- Task sources: ``get(split)`` -> a random-access sequence of raw example dicts -----------

def _as_tuple(value) -> tuple:
    return (value,) if isinstance(value, str) else tuple(value)


@functools.lru_cache(maxsize=32)
def _cached_split(source, split: str) -> Sequence[dict]:
    return source.load(split)


class Source:
    """Base of task sources: raw examples of a split, by index, cached per process."""

    splits: tuple[str, ...] = SPLITS

    def get(self, split: str) -> Sequence[dict]:
        if split not in self.splits:
            raise ValueError(f"Unknown split {split!r}; this source has splits {self.splits}.")
        return _cached_split(self, split)

    def load(self, split: str) -> Sequence[dict]:
        raise NotImplementedError

    def num_examples(self, split: str) -> int:
        return len(self.get(split))

    def shard(self, split: str, shard_index: int, num_shards: int) -> Sequence[dict]:
        """Shard ``shard_index`` of ``num_shards``: every ``num_shards``-th example."""
        records = self.get(split)
        if len(records) < num_shards:
            raise ValueError(f"split {split!r} has {len(records)} examples, fewer than "
                             f"num_shards={num_shards}; use fewer shards (in training: a smaller "
                             "data_streams).")
        return Strided(records, shard_index, num_shards)


class Strided(Sequence):
    """``records[start::step]`` as a view: no copy, works on lazy sequences (TFDS)."""

    def __init__(self, records: Sequence, start: int, step: int):
        self._records, self._start, self._step = records, start, step
        self._len = max(0, (len(records) - start + step - 1) // step)

    def __len__(self):
        return self._len

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._len))]
        if not -self._len <= index < self._len:
            raise IndexError(index)
        return self._records[self._start + (index % self._len) * self._step]


@functools.lru_cache(maxsize=64)
def _cached_files(source, split: str, paths: tuple[str, ...]) -> Sequence[dict]:
    return source.load_files(split, paths)


class FileSource(Source):
    """A source whose examples come file by file: with at least ``num_shards`` files,
    shard ``i`` reads whole files ``i::num_shards`` (file-level sharding, as seqio does
    with enough files); with fewer it falls back to record sharding. Subclasses have
    ``file_patterns`` and read one file list in ``load_files``."""

    def files(self) -> list[str]:
        return TextLineSource(self.file_patterns).files()

    def load(self, split):
        return self.load_files(split, tuple(self.files()))

    def load_files(self, split: str, paths: Sequence[str]) -> list[dict]:
        raise NotImplementedError

    def shard(self, split, shard_index, num_shards):
        files = self.files()
        if num_shards == 1 or len(files) < num_shards:
            return super().shard(split, shard_index, num_shards)
        if split not in self.splits:
            raise ValueError(f"Unknown split {split!r}; this source has splits {self.splits}.")
        paths = tuple(files[shard_index::num_shards])
        records = _cached_files(self, split, paths)
        if not records:
            raise ValueError(
                f"Shard {shard_index} of {num_shards} reads the files {list(paths)}, which hold "
                f"no {split!r} examples; use fewer shards (in training: a smaller data_streams) "
                "or fewer, larger files.")
        return records


@dataclasses.dataclass(frozen=True)
class TextFilesSource(FileSource):
    """``{"text": document}`` from text-line files; ``lines_per_document`` consecutive lines
    (of one file and split) make one document, joined by newlines (sentences for NSP)."""

    file_patterns: Sequence[str]
    holdout_every: int = 100
    strip_verse_keys: bool = True
    lines_per_document: int = 1

    def __post_init__(self):
        object.__setattr__(self, "file_patterns", _as_tuple(self.file_patterns))

    def load_files(self, split, paths):
        docs = []
        for path in paths:
            lines = TextLineSource([path], split, self.holdout_every,
                                   self.strip_verse_keys).documents()
            step = self.lines_per_document
            docs.extend({"text": "\n".join(lines[i:i + step])} for i in range(0, len(lines), step))
        return docs


@dataclasses.dataclass(frozen=True)
class JsonlSource(FileSource):
    """One JSON object per line (``.jsonl`` or ``.jsonl.gz``); every ``holdout_every``-th
    record is ``validation``. Records that are not objects are a clear error."""

    file_patterns: Sequence[str]
    holdout_every: int = 100

    def __post_init__(self):
        object.__setattr__(self, "file_patterns", _as_tuple(self.file_patterns))

    def load_files(self, split, paths):
        records = []
        for path in paths:
            for index, line in enumerate(_read_lines(path)):
                if not line.strip() or _is_validation_line(index, self.holdout_every) != (
                        split == "validation"):
                    continue
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError(f"{path}:{index + 1} is not a JSON object; JsonlSource needs "
                                     "one object per line.")
                records.append(record)
        return records


@dataclasses.dataclass(frozen=True, eq=False)
class InMemorySource(Source):
    """Examples given as ``{split: [example dict, ...]}``: tests, small labelled sets."""

    examples: Mapping[str, Sequence[dict]]

    @property
    def splits(self):
        return tuple(self.examples)

    def load(self, split):
        return list(self.examples[split])


@dataclasses.dataclass(frozen=True, eq=False)
class FunctionSource(Source):
    """``fn(split) -> sequence of example dicts``, for anything else."""

    fn: Callable[[str], Sequence[dict]]
    splits: tuple[str, ...] = SPLITS

    def load(self, split):
        return self.fn(split)


class _TfdsRecords(Sequence):
    """A TFDS data source seen as dicts of numpy values (bytes stay bytes)."""

    def __init__(self, data_source):
        self._data_source = data_source

    def __len__(self):
        return len(self._data_source)

    def __getitem__(self, index):
        return dict(self._data_source[index])


@dataclasses.dataclass(frozen=True)
class TfdsSource(Source):
    """A TFDS dataset read with ``tfds.data_source`` (array_record, no TensorFlow needed).

    ``split_map`` renames our splits to TFDS ones (C4 has ``validation``, Wikipedia
    only ``train``: map validation to ``train[:1%]`` and train to ``train[1%:]``).
    ``builder_module`` is imported first: without TensorFlow, TFDS registers a
    builder such as ``c4`` only once its module is imported. The dataset must be
    prepared in ``data_dir`` in array_record format. Not cached: opening is cheap.
    """

    name: str
    data_dir: str | None = None
    split_map: tuple[tuple[str, str], ...] = (("train", "train"), ("validation", "validation"))
    builder_module: str | None = None

    @property
    def splits(self):
        return tuple(ours for ours, _ in self.split_map)

    def get(self, split):
        if split not in self.splits:
            raise ValueError(f"Unknown split {split!r}; this source has splits {self.splits}.")
        return self.load(split)

    def load(self, split):
        import importlib

        import tensorflow_datasets as tfds  # imported late: slow, and optional for most tasks
        if self.builder_module:
            importlib.import_module(self.builder_module)
        tfds_split = dict(self.split_map)[split]
        try:
            return _TfdsRecords(tfds.data_source(self.name, split=tfds_split,
                                                 data_dir=self.data_dir, download=False))
        except Exception as e:  # tfds raises several types for a missing dataset
            raise FileNotFoundError(
                f"TFDS dataset {self.name!r} split {tfds_split!r} is not prepared in "
                f"{self.data_dir or '~/tensorflow_datasets'} ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}). Prepare it with `tfds build "
                f"{self.name.split(':')[0]} --file_format=array_record` or set the task's "
                "data_dir.") from e
