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
import importlib.util
import itertools
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence

from t5x_like.errors import DataError, MissingFile, install_hint
from t5x_like.system import storage

# Imports inside functions: TensorFlow Datasets (slow to import, optional for most tasks)
# loads only for a TFDS source.

# "Genesis 1:1<TAB>In the beginning ..." -> the verse text only.
_VERSE_KEY = re.compile(r"^[^\t]*\d+:\d+\t")

SPLITS = ("train", "validation")


def _is_validation_line(line_index: int, holdout_every: int) -> bool:
    """Every ``holdout_every``-th line is held out; stable across runs and hosts.
    ``holdout_every=0`` holds nothing out (the source has no validation split)."""
    return holdout_every > 0 and line_index % holdout_every == holdout_every - 1


def rows_in_split(rows: int, split: str, holdout_every: int) -> int:
    """How many of ``rows`` rows (of one file) are in ``split`` when every
    ``holdout_every``-th is held out (``_is_validation_line``)."""
    held = rows // holdout_every if holdout_every else 0
    return held if split == "validation" else rows - held


def split_row(k: int, split: str, holdout_every: int) -> int:
    """The file row of the ``k``-th row of ``split`` (``_is_validation_line``'s holdout)."""
    if not holdout_every:
        return k
    if split == "validation":
        return k * holdout_every + holdout_every - 1
    return k + k // (holdout_every - 1)


def column_fields(fields, kind: str) -> tuple[tuple[str, str], ...]:
    """A column source's ``fields`` (a column name, or record keys to columns) as
    ``((key, column), ...)``: hashable, since sources are cached."""
    mapping = {"text": fields} if isinstance(fields, str) else dict(fields)
    if not mapping or not all(isinstance(v, str) for v in mapping.values()):
        raise ValueError(f"{kind} fields={fields!r}; give a column name or a mapping of record "
                         "keys to column names.")
    return tuple(mapping.items())


class ColumnRows(Sequence):
    """A split of a columnar source (Parquet, a datasets folder) read by index: subclasses
    give ``__len__``, ``origin(index)`` and ``_values(index)`` (column -> value)."""

    kind = ""
    _fields: tuple[tuple[str, str], ...] = ()

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        index %= len(self)
        values = self._values(index)
        record = {}
        for key, column in self._fields:
            if values[column] is None:
                raise DataError(f"column {column!r} is null; every row needs a value in the "
                                f"columns {self.kind} reads.", where=self.origin(index),
                                field=column)
            record[key] = values[column]
        return record

    def origin(self, index: int) -> str:
        raise NotImplementedError

    def _values(self, index: int):
        raise NotImplementedError


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
            matched = storage.glob(pattern)
            if not matched:
                raise MissingFile(
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
    # On disk or in a bucket; a stray non-UTF-8 byte becomes U+FFFD instead of a crash.
    return storage.read_text_lines(path)


# -- Task sources: ``get(split)`` -> a random-access sequence of raw example dicts -----------

def _as_tuple(value) -> tuple:
    return (value,) if isinstance(value, str) else tuple(value)


@functools.lru_cache(maxsize=32)
def _cached_split(source, split: str) -> Sequence[dict]:
    return source.load(split)


class Source:
    """Base of task sources: raw examples of a split, by index, cached per process."""

    splits: tuple[str, ...] = SPLITS

    def validation_hint(self) -> str:
        """How to give this source held-out examples (said when it has none)."""
        return "give the task's source a 'validation' split"

    def origin(self, split: str, index: int) -> str:
        """Where record ``index`` of ``split`` comes from, for messages."""
        return f"record {index} of the {split!r} split"

    def record_without(self, split: str, fields: Sequence[str]) -> str | None:
        """Where the first record lacking one of ``fields`` is, and what it has; only
        fields that other records have count (a field the preprocessors make is no
        record's). For error messages: it reads the whole split."""
        records = self.get(split)
        index = _first_lacking(records, fields)
        if index is None:
            return None
        record = records[index]
        present = {f for other in records for f in fields if f in other}
        lacking = [f for f in fields if f in present and f not in record]
        return (f"{self.origin(split, index)} has no {', '.join(map(repr, lacking))} "
                f"(its fields: {', '.join(map(repr, record)) or 'none'})")

    def locate(self, split: str, lookup: Mapping) -> str | None:
        """Where the record a ``DataError``'s ``lookup`` describes is (``value``: the first
        record holding it in a field; ``lacks``: the first lacking one of those fields
        that other records have), among the split's first ``LOCATE_LIMIT`` records; None
        when none is. For error messages, which a step raises without knowing its record."""
        head = list(itertools.islice(iter(self.get(split)), LOCATE_LIMIT))
        if "lacks" in lookup:
            index = _first_lacking(head, lookup["lacks"])
        else:
            index = next((i for i, record in enumerate(head)
                          if any(_same(v, lookup["value"]) for v in record.values())), None)
        return None if index is None else self.origin(split, index)

    def get(self, split: str) -> Sequence[dict]:
        if split not in self.splits:
            raise ValueError(f"Unknown split {split!r}; this source has splits {self.splits}.")
        return _cached_split(self, split)

    def load(self, split: str) -> Sequence[dict]:
        raise NotImplementedError

    def num_examples(self, split: str) -> int:
        return len(self.get(split))

    def shard(self, split: str, shard_index: int, num_shards: int) -> Sequence[dict]:
        """Shard ``shard_index`` of ``num_shards``: every ``num_shards``-th example. A split
        of fewer examples than shards leaves the last shards empty (a one-pass read, such as
        an evaluation, reads each example once; ``Task.get_dataset`` gives a repeating
        stream an example to repeat)."""
        records = self.get(split)
        if not records:
            files = self.files() if hasattr(self, "files") else ()
            raise DataError(_empty_split(split, files))
        return Strided(records, shard_index, num_shards)


def located(error: DataError, sources: Sequence[Source], split: str, context: str) -> DataError:
    """``error`` (raised about one example by a step or a converter, which see the example,
    not its record) at the first record of ``sources`` its look-up finds
    (``Source.locate``); a look-up that fails or finds nothing leaves it said within
    ``context`` (e.g. ``Task 'x'``)."""
    for source in sources:
        try:
            where = source.locate(split, error.lookup) if split in source.splits else None
        except Exception:  # noqa: BLE001 - the data's own error is the one to report
            where = None
        if where:
            return error.located(where)
    return error.located(None).within(context)


LOCATE_LIMIT = 100_000  # records a failed step's look-up reads at most (a huge split: not all)


def _first_lacking(records: Sequence[dict], fields: Sequence[str]) -> int | None:
    """The index of the first record lacking one of ``fields`` that another record has."""
    present = {f for record in records for f in fields if f in record}
    return next((index for index, record in enumerate(records)
                 if any(f in present and f not in record for f in fields)), None)


def _same(a, b) -> bool:
    """``a`` is ``b``'s value: the same type and equal (``1`` is not ``True``; arrays
    compare whole)."""
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except ValueError:  # an array: == is elementwise
        return bool(getattr(a, "shape", None) == getattr(b, "shape", None) and (a == b).all())


def _empty_split(split: str, paths=()) -> str:
    where = f" (read from {', '.join(str(p) for p in paths)})" if paths else ""
    return (f"split {split!r} has no examples{where}: the data files are empty or hold no "
            "record of the expected format. Check the files the task reads.")


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

    @property
    def windowed(self) -> bool:
        """Records read in windows (Parquet row groups) are strided the same way."""
        return hasattr(self._records, "in_windows")

    def dataset(self, seed: int, shuffle: bool, num_epochs: int | None):
        records = self._records.in_windows(self._start, self._step)
        return records.dataset(seed, shuffle, num_epochs)


@functools.lru_cache(maxsize=64)
def _cached_files(source, split: str, paths: tuple[str, ...]) -> Sequence[dict]:
    return source.load_files(split, paths)


class FileSource(Source):
    """A source whose examples come file by file: with at least ``num_shards`` files,
    shard ``i`` reads whole files ``i::num_shards`` (file-level sharding, as seqio does
    with enough files); with fewer it falls back to record sharding. Subclasses have
    ``file_patterns`` and read one file list in ``load_files``."""

    def __post_init__(self):
        object.__setattr__(self, "file_patterns", _as_tuple(self.file_patterns))
        if not isinstance(self.holdout_every, int) or self.holdout_every < 0:
            raise ValueError(f"{type(self).__name__} holdout_every={self.holdout_every!r}; use "
                             "a positive N (every N-th record is validation) or 0 (no "
                             "validation split).")

    def files(self) -> list[str]:
        return TextLineSource(self.file_patterns).files()

    @property
    def splits(self):
        return SPLITS if self.holdout_every else ("train",)

    def validation_hint(self) -> str:
        kind = type(self).__name__
        if not self.holdout_every:
            return (f"its {kind} has holdout_every=0; set holdout_every=N to hold out every "
                    "N-th record")
        files = self.files()
        return (f"its {kind} holds out one record in {self.holdout_every}, and "
                f"{files[0] if len(files) == 1 else f'its {len(files)} files'} "
                f"{'has' if len(files) == 1 else 'have'} {self.num_examples('train')}; a smaller "
                f"holdout_every holds some out, e.g. {kind}([...], holdout_every=5)")

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
        if not records and not _cached_files(self, split, tuple(files)):
            raise DataError(_empty_split(split, files))  # fewer shards would not help
        if not records:
            raise DataError(
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
    record is ``validation`` (``holdout_every=0``: no validation split). A line that is
    not a JSON object is an error naming its file and line."""

    file_patterns: Sequence[str]
    holdout_every: int = 100

    def _split_lines(self, split, paths):
        """``(path, line index, line)`` of each non-empty line of ``split``, in order."""
        for path in paths:
            for index, line in enumerate(_read_lines(path)):
                if line.strip() and _is_validation_line(index, self.holdout_every) == (
                        split == "validation"):
                    yield path, index, line

    def load_files(self, split, paths):
        records = []
        for path, index, line in self._split_lines(split, paths):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"not valid JSON ({e.msg} at column {e.colno}); JsonlSource "
                                "needs one JSON object per line.",
                                where=f"{path}:{index + 1}") from None
            if not isinstance(record, dict):
                raise DataError(f"a JSON {type(record).__name__}, not an object; JsonlSource "
                                "needs one object per line.", where=f"{path}:{index + 1}")
            records.append(record)
        return records

    def _objects(self, split, paths):
        """``(path:line, object)`` of each line of ``split``, refused naming its file and
        line when it is not a JSON object: what a source of one row shape per line
        (conversations, preference pairs) checks before its own checks."""
        for path, index, line in self._split_lines(split, paths):
            where = f"{path}:{index + 1}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"not valid JSON ({e.msg} at column {e.colno}).",
                                where=where) from None
            if not isinstance(record, dict):
                raise DataError(f"a JSON {type(record).__name__}, not an object.", where=where)
            yield where, record

    def origin(self, split, index):
        """``path:line`` of record ``index`` of ``split``."""
        for seen, (path, line_index, _) in enumerate(self._split_lines(split, self.files())):
            if seen == index:
                return f"{path}:{line_index + 1}"
        return super().origin(split, index)


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
class _TfdsLoadPiece:
    """One TFRecord file's part of a split, opened at a record offset with ``tfds.load``
    (an absolute slice of the split that file belongs to, so only that file is read)."""

    name: str
    data_dir: str | None
    split: str
    start: int
    stop: int

    def __call__(self, offset: int):
        import tensorflow_datasets as tfds
        dataset = tfds.load(self.name, split=f"{self.split}[{self.start + offset}:{self.stop}]",
                            data_dir=self.data_dir, download=False, shuffle_files=False,
                            read_config=tfds.ReadConfig(try_autocache=False))
        return (dict(example) for example in tfds.as_numpy(dataset))


@dataclasses.dataclass(frozen=True)
class TfdsSource(Source):
    """A prepared TFDS dataset: array_record files through ``tfds.data_source`` (random
    access, no TensorFlow needed), TFRecord files through ``tfds.load`` (TensorFlow).

    ``split_map`` renames our splits to TFDS ones (C4 has ``validation``, Wikipedia
    only ``train``: map validation to ``train[:1%]`` and train to ``train[1%:]``).
    ``builder_module`` is imported first: without TensorFlow, TFDS registers a
    builder such as ``c4`` only once its module is imported.

    ``reader``: ``"auto"`` follows the prepared files' format; ``"array_record"`` or
    ``"tfrecord"`` insists. TFRecord files cannot be indexed, so they are read file by
    file: a shard is whole files (or every n-th record when there are fewer files
    than shards), and shuffling permutes the file order each epoch and the examples
    within windows of ``shuffle_window`` (``sequential.SequentialRecords``); resuming
    is still exact. Not cached: opening is cheap.
    """

    name: str
    data_dir: str | None = None
    split_map: tuple[tuple[str, str], ...] = (("train", "train"), ("validation", "validation"))
    builder_module: str | None = None
    reader: str = "auto"
    shuffle_window: int = 2048

    def __post_init__(self):
        if self.reader not in ("auto", "array_record", "tfrecord"):
            raise ValueError(f"TfdsSource reader={self.reader!r}; use 'auto', 'array_record' "
                             "or 'tfrecord'.")

    @property
    def splits(self):
        return tuple(ours for ours, _ in self.split_map)

    def _tfds_split(self, split: str) -> str:
        if split not in self.splits:
            raise ValueError(f"Unknown split {split!r}; this source has splits {self.splits}.")
        return dict(self.split_map)[split]

    def origin(self, split, index):
        """The TFDS split and the record's index in it (TFRecord and array_record alike)."""
        return f"TFDS dataset {self.name!r} split {self._tfds_split(split)!r} record {index}"

    def get(self, split):
        return self.load(split)

    def load(self, split):
        return self.shard(split, 0, 1)

    def num_examples(self, split):
        info = self._tfrecord_info(split)
        if info is not None:  # from the metadata, without opening any file
            return info.splits[self._tfds_split(split)].num_examples
        return len(self.get(split))

    def shard(self, split, shard_index, num_shards):
        info = self._tfrecord_info(split)
        if info is None:
            records = self._data_source(split)
            return records if num_shards == 1 else super().shard(split, shard_index, num_shards)
        from t5x_like.data import sequential
        pieces = self._tfrecord_pieces(split, info)
        if len(pieces) >= num_shards:  # whole files: each process reads only its own
            segments = [sequential.Segment(open_fn, 0, 1, length)
                        for open_fn, length in pieces[shard_index::num_shards]]
        else:
            segments = sequential.stride_segments(pieces, shard_index, num_shards)
        records = sequential.SequentialRecords(segments, self.shuffle_window)
        if len(records) == 0 and sum(n for _, n in pieces) == 0:
            raise DataError(_empty_split(split))
        return records  # empty when the split has fewer examples than shards

    def _import_builder_module(self):
        if self.builder_module:
            importlib.import_module(self.builder_module)

    def _data_source(self, split):
        import tensorflow_datasets as tfds  # imported late: slow, and optional for most tasks
        self._import_builder_module()
        tfds_split = self._tfds_split(split)
        try:
            return _TfdsRecords(tfds.data_source(self.name, split=tfds_split,
                                                 data_dir=self.data_dir, download=False))
        except Exception as e:  # tfds raises several types for a missing dataset
            raise MissingFile(
                f"TFDS dataset {self.name!r} split {tfds_split!r} is not prepared as array_record "
                f"in {self.data_dir or '~/tensorflow_datasets'} ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}). Prepare it with `tfds build "
                f"{self.name.split(':')[0]} --file_format=array_record` or set the task's "
                "data_dir; a TFRecord copy is read through tfds.load once TensorFlow is "
                f"installed ({install_hint('tf')}).") from e

    def _builder(self):
        import tensorflow_datasets as tfds
        self._import_builder_module()
        return tfds.builder(self.name, data_dir=self.data_dir)

    def _tfrecord_info(self, split: str):
        """The dataset's TFDS info when this split is read through ``tfds.load`` (TFRecord
        files), else ``None`` (array_record, through ``tfds.data_source``)."""
        self._tfds_split(split)
        if self.reader == "array_record":
            return None
        has_tensorflow = importlib.util.find_spec("tensorflow") is not None
        if self.reader == "tfrecord" and not has_tensorflow:
            raise ModuleNotFoundError(f"TfdsSource({self.name!r}, reader='tfrecord') reads with "
                                      f"tfds.load, which needs TensorFlow: {install_hint('tf')}.")
        try:
            info = self._builder().info
        except Exception:  # not prepared, or no such builder: data_source says which
            if self.reader == "tfrecord":
                raise
            return None
        if self.reader == "tfrecord":
            return info
        if not (info.splits and info.file_format.value == "tfrecord"):
            return None
        if not has_tensorflow:
            raise ModuleNotFoundError(
                f"TFDS dataset {self.name!r} is prepared as TFRecord, which only TensorFlow "
                f"reads: {install_hint('tf')} (tfds.load), or rebuild it with `tfds "
                f"build {self.name.split(':')[0]} --file_format=array_record`.")
        return info

    def _tfrecord_pieces(self, split: str, info) -> list[tuple[_TfdsLoadPiece, int]]:
        """``(opener, length)`` per file of the split, in TFDS's file order."""
        tfds_split = self._tfds_split(split)
        try:
            wanted = info.splits[tfds_split].file_instructions
        except (KeyError, ValueError) as e:
            raise DataError(f"TFDS dataset {self.name!r} has no split {tfds_split!r} (it has "
                            f"{sorted(info.splits)}): {e}") from None
        # Where each file starts in the split it belongs to: tfds.load slices by that index.
        file_start = {}
        for split_name, split_info in info.splits.items():
            offset = 0
            for instruction in split_info.file_instructions:
                file_start[os.fspath(instruction.filename)] = (split_name, offset)
                offset += instruction.examples_in_shard
        pieces = []
        for instruction in wanted:
            split_name, offset = file_start[os.fspath(instruction.filename)]
            start = offset + instruction.skip
            pieces.append((_TfdsLoadPiece(self.name, self.data_dir, split_name, start,
                                          start + instruction.take), instruction.take))
        return pieces
