"""A Hugging Face ``datasets`` folder as a task source: what ``Dataset.save_to_disk`` (or
``DatasetDict.save_to_disk``) wrote, read offline and memory-mapped (Arrow), row by row.

A ``DatasetDict`` folder gives its ``train`` and ``validation`` splits; a single
``Dataset`` holds out every ``holdout_every``-th row as ``validation``, as the file
sources do. Rows are read by index from the memory-mapped Arrow files, so a folder
larger than memory streams and resumes exactly like every source. A column the mapping
names and the folder lacks is an error naming the folder and its columns; a null value
one naming the row and the column.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from t5x_like.data.sources import (
    SPLITS,
    ColumnRows,
    Source,
    column_fields,
    rows_in_split,
    split_row,
)
from t5x_like.errors import install_hint


@dataclasses.dataclass(frozen=True)
class HfDatasetSource(Source):
    """Records of a ``save_to_disk`` folder: ``fields`` maps record keys to columns (a
    column name alone is ``{"text": column}``)."""

    path: str
    fields: str | Mapping[str, str] = "text"
    holdout_every: int = 100

    def __post_init__(self):
        object.__setattr__(self, "fields", column_fields(self.fields, "HfDatasetSource"))

    @property
    def splits(self):
        from datasets import DatasetDict
        saved = _load(self.path)
        if isinstance(saved, DatasetDict):
            return tuple(s for s in SPLITS if s in saved)
        return SPLITS if self.holdout_every else ("train",)

    def load(self, split):
        return HfRows(self.path, self.fields, split, self.holdout_every)

    def origin(self, split, index):
        return self.get(split).origin(index)


def _load(path: str):
    """The folder's ``Dataset`` or ``DatasetDict``, memory-mapped (cached per process)."""
    try:
        from datasets import load_from_disk
    except ImportError:
        raise ImportError("HfDatasetSource reads save_to_disk folders with `datasets`; "
                          f"install it: {install_hint('data')}") from None
    loaded = _LOADED.get(path)
    if loaded is None:
        try:
            loaded = _LOADED[path] = load_from_disk(path)
        except FileNotFoundError as e:
            raise ValueError(f"{path}: not a folder `save_to_disk` wrote ({e}); give "
                             "HfDatasetSource the folder of a saved Dataset or DatasetDict.") \
                from None
    return loaded


_LOADED: dict = {}


class HfRows(ColumnRows):
    """The rows of ``split`` of a saved dataset folder, by index."""

    kind = "HfDatasetSource"

    def __init__(self, path: str, fields: tuple[tuple[str, str], ...], split: str,
                 holdout_every: int):
        from datasets import DatasetDict
        self._path, self._fields, self._split = path, fields, split
        saved = _load(path)
        self._key = split if isinstance(saved, DatasetDict) else None
        self._every = 0 if self._key else holdout_every
        dataset = self._dataset()
        missing = [c for _, c in fields if c not in dataset.column_names]
        if missing:
            raise ValueError(f"{path}: no column {', '.join(map(repr, missing))} (its columns: "
                             f"{', '.join(dataset.column_names)}); set HfDatasetSource's fields "
                             "to the columns to read.")
        self._len = (len(dataset) if self._key else
                     rows_in_split(len(dataset), split, self._every))

    def _dataset(self):
        saved = _load(self._path)
        return saved[self._key] if self._key else saved

    def __len__(self) -> int:
        return self._len

    def _row(self, index: int) -> int:
        return index if self._key else split_row(index, self._split, self._every)

    def origin(self, index: int) -> str:
        where = f" split {self._key!r}" if self._key else ""
        return f"{self._path}{where} row {self._row(index)}"

    def _values(self, index: int) -> dict:
        return self._dataset()[self._row(index)]
