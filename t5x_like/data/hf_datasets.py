"""Hugging Face ``datasets`` data as a task source, read offline and memory-mapped (Arrow),
row by row: what ``Dataset.save_to_disk`` (or ``DatasetDict.save_to_disk``) wrote, or a
dataset ``datasets.load_dataset`` prepared in its local cache (by name, e.g.
``"HuggingFaceFW/fineweb-edu"`` with its ``config``, or the cache folder itself).

A ``DatasetDict`` folder (and a cached dataset) gives its ``train`` and ``validation``
splits; a single ``Dataset`` holds out every ``holdout_every``-th row as ``validation``,
as the file sources do. Rows are read by index from the memory-mapped Arrow files, so a
folder larger than memory streams and resumes exactly like every source. Nothing is
downloaded: a name is looked up in the cache folder only. A column the mapping names
and the data lacks is an error naming the folder and its columns; a null value one
naming the row and the column; a name not in the cache one listing what is there.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping

from t5x_like.data.sources import (
    SPLITS,
    ColumnRows,
    Source,
    column_fields,
    rows_in_split,
    split_row,
)
from t5x_like.errors import DataError, MissingFile, install_hint

# Imports inside functions: Hugging Face `datasets` (optional) loads only for a task that
# reads it.


@dataclasses.dataclass(frozen=True)
class HfDatasetSource(Source):
    """Records of a ``save_to_disk`` folder: ``fields`` maps record keys to columns (a
    column name alone is ``{"text": column}``)."""

    path: str
    fields: str | Mapping[str, str] = "text"
    holdout_every: int = 100
    config: str = ""  # a cached dataset's config ("": its only one)
    cache_dir: str = ""  # where datasets caches ("": HF_DATASETS_CACHE, ~/.cache/huggingface/datasets)

    def __post_init__(self):
        object.__setattr__(self, "fields", column_fields(self.fields, "HfDatasetSource"))

    @property
    def where(self) -> tuple[str, str, str]:
        return (self.path, self.config, self.cache_dir)

    @property
    def splits(self):
        from datasets import DatasetDict
        saved = _load(self.where)
        if isinstance(saved, DatasetDict):
            return tuple(s for s in SPLITS if s in saved)
        return SPLITS if self.holdout_every else ("train",)

    def load(self, split):
        return HfRows(self.where, self.fields, split, self.holdout_every)

    def origin(self, split, index):
        return self.get(split).origin(index)


def _load(where: tuple[str, str, str]):
    """The ``Dataset`` or ``DatasetDict`` at ``where`` (path, config, cache_dir), memory-
    mapped (cached per process)."""
    try:
        import datasets  # noqa: F401
    except ImportError:
        raise ImportError("HfDatasetSource reads datasets folders with `datasets`; "
                          f"install it: {install_hint('data')}") from None
    loaded = _LOADED.get(where)
    if loaded is None:
        loaded = _LOADED[where] = _read(*where)
    return loaded


def _read(path: str, config: str, cache_dir: str):
    from datasets import load_from_disk
    folder = pathlib.Path(path)
    if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
        return load_from_disk(path)
    if (folder / "dataset_info.json").is_file():
        return _prepared(folder)
    if not folder.exists() and (folder.is_absolute() or path.startswith((".", "~"))):
        raise MissingFile(f"{path} does not exist; give HfDatasetSource the folder "
                          "save_to_disk wrote, a prepared folder of the datasets cache, or a "
                          "dataset's name in the cache.")
    if folder.exists():
        raise DataError("not a folder `save_to_disk` wrote nor a prepared dataset of the "
                        "datasets cache (no dataset_dict.json, state.json or "
                        "dataset_info.json); give HfDatasetSource one of those, or a dataset's "
                        "name in the cache.", where=path)
    return _prepared(_cached_folder(path, config, cache_dir))


def _cached_folder(name: str, config: str, cache_dir: str) -> pathlib.Path:
    """The newest complete preparation of dataset ``name`` in the local cache:
    ``CACHE/<owner>___<name>/<config>/<version>/<revision>/``."""
    import datasets
    root = pathlib.Path(cache_dir or datasets.config.HF_DATASETS_CACHE)
    folder = root / name.replace("/", "___")
    if not folder.is_dir():
        cached = sorted(p.name.replace("___", "/") for p in root.iterdir()
                        if p.is_dir() and not p.name.startswith(("_", "."))) if root.is_dir() else []
        raise MissingFile(f"{name!r} is neither a folder nor a dataset in the datasets cache "
                          f"{root} (it holds: {', '.join(cached) or 'nothing'}); load it once "
                          "with datasets.load_dataset where there is a network, or give the "
                          "folder save_to_disk wrote.")
    configs = sorted(p.name for p in folder.iterdir() if p.is_dir())
    if config not in configs and not (not config and len(configs) == 1):
        raise DataError(f"the cache holds config(s) {', '.join(configs)}; set "
                        f"HfDatasetSource's config to one of them"
                        f"{f' (not {config!r})' if config else ''}.", where=name)
    done = [info.parent for info in (folder / (config or configs[0])).glob("*/*/dataset_info.json")
            if not info.parent.name.endswith(".incomplete")]
    if not done:
        raise MissingFile(f"{name}: the cache has no complete preparation of config "
                          f"{config or configs[0]!r} in {folder}; load it again with "
                          "datasets.load_dataset.")
    return max(done, key=lambda p: (_version(p.parent.name), p.stat().st_mtime))


def _version(text: str) -> tuple:
    return tuple(int(part) if part.isdigit() else 0 for part in text.split("."))


def _prepared(folder: pathlib.Path):
    """A prepared cache folder's splits, each its Arrow shards memory-mapped in order."""
    from datasets import Dataset, DatasetDict, concatenate_datasets
    info = json.loads((folder / "dataset_info.json").read_text())
    prefix = info.get("dataset_name") or info.get("builder_name") or "*"
    splits = {}
    for split, about in info.get("splits", {}).items():
        files = (sorted(folder.glob(f"{prefix}-{split}.arrow"))
                 or sorted(folder.glob(f"{prefix}-{split}-[0-9]*-of-[0-9]*.arrow")))
        if not files:
            raise MissingFile(f"{folder}: no Arrow file of split {split!r} "
                              f"({prefix}-{split}*.arrow); load the dataset again.")
        parts = [Dataset.from_file(str(f)) for f in files]
        splits[split] = parts[0] if len(parts) == 1 else concatenate_datasets(parts)
        if "num_examples" in about and len(splits[split]) != about["num_examples"]:
            raise DataError(f"split {split!r} has {len(splits[split])} rows, its "
                            f"dataset_info.json says {about['num_examples']}; the cache is "
                            "incomplete, load the dataset again.", where=str(folder))
    return DatasetDict(splits)


_LOADED: dict = {}


class HfRows(ColumnRows):
    """The rows of ``split`` of a saved dataset folder, by index."""

    kind = "HfDatasetSource"

    def __init__(self, where: tuple[str, str, str], fields: tuple[tuple[str, str], ...],
                 split: str, holdout_every: int):
        from datasets import DatasetDict
        self._where, self._fields, self._split = where, fields, split
        self._path = where[0]
        saved = _load(where)
        self._key = split if isinstance(saved, DatasetDict) else None
        self._every = 0 if self._key else holdout_every
        dataset = self._dataset()
        missing = [c for _, c in fields if c not in dataset.column_names]
        if missing:
            raise DataError(f"no column {', '.join(map(repr, missing))} (its columns: "
                            f"{', '.join(dataset.column_names)}); set HfDatasetSource's fields "
                            "to the columns to read.", where=self._path, field=missing[0])
        self._len = (len(dataset) if self._key else
                     rows_in_split(len(dataset), split, self._every))

    def _dataset(self):
        saved = _load(self._where)
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
