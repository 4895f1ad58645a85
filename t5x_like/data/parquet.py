"""Parquet shards as a task source: ``ParquetSource`` reads rows on demand, one row group
at a time, so a corpus of many gigabytes (FineWeb, The Stack, Dolma) trains without being
rewritten as JSONL or loaded whole.

A split is a lazy sequence over the files' rows in path order: a row is found by index
(the files' and their row groups' row counts come from the Parquet footers, read once),
and its row group is read when first asked for and kept while the next rows are read.
A row by index costs a whole row group's read when its group is not the one being read,
so a training stream does not draw rows in a global random order (that read ~20x fewer
tokens per second from a 1 GiB corpus, ``benchmarks/parquet_throughput.py``): it reads
row groups whole, in an order permuted each epoch, and shuffles rows within windows of
``shuffle_window`` (``sequential.SequentialRecords``, as TFRecord files are read), which
still resumes exactly from one position.
Every ``holdout_every``-th row of a file is ``validation`` (as ``JsonlSource`` holds out
every N-th line). With at least as many files as input streams each stream reads whole
files (``FileSource``'s file-level sharding). Files may sit on object storage
(``gs://``, ``s3://``): they are opened through ``t5x_like.system.storage``.

A column the mapping names and a file lacks is an error naming the file and its
columns; a null value is an error naming the file, the row and the column.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from collections.abc import Mapping, Sequence

from t5x_like.data import sequential
from t5x_like.data.sources import ColumnRows, FileSource, column_fields, rows_in_split, split_row
from t5x_like.errors import DataError, install_hint
from t5x_like.system import storage

# Imports inside functions: pyarrow loads only for a Parquet source.


@dataclasses.dataclass(frozen=True)
class ParquetSource(FileSource):
    """Records of Parquet files: ``fields`` maps record keys to columns (a column name
    alone is ``{"text": column}``)."""

    file_patterns: Sequence[str]
    fields: str | Mapping[str, str] = "text"
    holdout_every: int = 100
    shuffle_window: int = 2048

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "fields", column_fields(self.fields, "ParquetSource"))
        if not isinstance(self.shuffle_window, int) or self.shuffle_window < 1:
            raise ValueError(f"ParquetSource shuffle_window={self.shuffle_window!r}; use a "
                             "positive number of rows (rows are shuffled within windows of it).")

    def load_files(self, split, paths):
        return ParquetRows(tuple(paths), self.fields, split, self.holdout_every,
                           self.shuffle_window)

    def origin(self, split, index):
        rows = self.get(split)
        return rows.origin(index) if isinstance(rows, ParquetRows) else super().origin(split,
                                                                                        index)


class ParquetRows(ColumnRows):
    """The rows of ``split`` of Parquet files, by index, read a row group at a time."""

    kind = "ParquetSource"
    windowed = True  # a stream reads through ``dataset``: row groups whole, shuffled windows

    def __init__(self, paths: tuple[str, ...], fields: tuple[tuple[str, str], ...], split: str,
                 holdout_every: int, shuffle_window: int = 2048):
        self._paths, self._fields = paths, fields
        self._split, self._every = split, holdout_every
        self._window = shuffle_window
        self._groups: list[list[int]] = []  # per file: the first row of each row group
        counts = []
        for path in paths:
            metadata = self._file(path).metadata
            columns = set(metadata.schema.names)
            missing = [column for _, column in fields if column not in columns]
            if missing:
                raise DataError(f"no column {', '.join(map(repr, missing))} (its columns: "
                                f"{', '.join(sorted(columns))}); set ParquetSource's fields to "
                                "the columns to read.", where=path, field=missing[0])
            starts, total = [], 0
            for group in range(metadata.num_row_groups):
                starts.append(total)
                total += metadata.row_group(group).num_rows
            self._groups.append(starts + [total])
            counts.append(rows_in_split(total, split, holdout_every))
        self._starts = [0]
        for count in counts:
            self._starts.append(self._starts[-1] + count)
        self._cache: dict = {}

    def __getstate__(self):  # open files and read row groups stay in their process
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_cache", "_handles")} | {"_cache": {}}

    def _file(self, path: str):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError(f"ParquetSource reads Parquet with pyarrow; install it: "
                              f"{install_hint('data')}") from None
        handles = self.__dict__.setdefault("_handles", {})
        if path not in handles:
            handles[path] = pq.ParquetFile(storage.path(path).open("rb"))
        return handles[path]

    def __len__(self) -> int:
        return self._starts[-1]

    def _locate(self, index: int) -> tuple[int, int]:
        """``(file number, row in the file)`` of the split's ``index``-th row."""
        file = bisect.bisect_right(self._starts, index) - 1
        return file, split_row(index - self._starts[file], self._split, self._every)

    def origin(self, index: int) -> str:
        file, row = self._locate(index)
        return f"{self._paths[file]} row {row}"

    def dataset(self, seed: int, shuffle: bool, num_epochs: int | None):
        return self.in_windows().dataset(seed, shuffle, num_epochs)

    def in_windows(self, shard_index: int = 0, num_shards: int = 1) -> sequential.SequentialRecords:
        """Rows ``shard_index::num_shards`` read row group by row group: each group of this
        split is a segment (its rows in order), permuted per epoch when shuffled."""
        pieces = []
        for file, starts in enumerate(self._groups):
            before = self._starts[file]
            for begin, end in zip(starts, starts[1:], strict=False):
                first = rows_in_split(begin, self._split, self._every)
                count = rows_in_split(end, self._split, self._every) - first
                pieces.append((functools.partial(self._rows_from, before + first), count))
        return sequential.SequentialRecords(
            sequential.stride_segments(pieces, shard_index, num_shards), self._window)

    def _rows_from(self, start: int, offset: int):
        """The split's rows from ``start + offset`` on, in order (a segment's reader)."""
        for index in range(start + offset, len(self)):
            yield self[index]

    def _values(self, index: int) -> dict:
        file, row = self._locate(index)
        starts = self._groups[file]
        group = bisect.bisect_right(starts, row) - 1
        columns = self._row_group(file, group)
        return {column: columns[column][row - starts[group]] for _, column in self._fields}

    def _row_group(self, file: int, group: int) -> dict:
        key = (file, group)
        if key not in self._cache:
            if len(self._cache) >= 4:  # a few groups: streams read in order, shards apart
                self._cache.pop(next(iter(self._cache)))
            table = self._file(self._paths[file]).read_row_group(
                group, columns=sorted({column for _, column in self._fields}))
            self._cache[key] = table.to_pydict()
        return self._cache[key]
