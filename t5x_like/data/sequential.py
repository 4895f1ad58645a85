"""Splits that are cheap to read in order and costly to seek (TFRecord files via ``tfds.load``).

The rest of the pipeline addresses examples by index, which is what makes a
stream resumable from a single number. TFRecord files have no index, so a
shuffled global permutation would reopen and skip through a file for every
example. Here a split is a list of *segments* (one file's part of the split,
possibly every n-th record of it) read front to back, and shuffling is the
seqio kind: segment (file) order is permuted every epoch, then examples are
permuted inside consecutive windows of ``window`` examples. Position
``epoch * len + i`` still names one example, so a grain iterator state still
resumes exactly: restoring reopens the file that holds the window's first
example and skips to it (at most one file's read, once).

Memory: up to three windows of raw examples per stream (``window`` x average
example size each) plus one open reader.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import itertools
import sys
import threading
import typing
from collections.abc import Callable, Iterator, Sequence

import grain
import numpy as np

_CACHED_WINDOWS = 3


class _Reader(typing.NamedTuple):
    """An open read of one epoch's examples in segment order, at ``position``."""

    seed: int
    shuffle: bool
    epoch: int
    position: int
    records: Iterator[dict]


@dataclasses.dataclass(frozen=True)
class Segment:
    """Records ``first, first + step, ...`` (``count`` of them) of a piece that ``open``
    reads in order from a record offset; ``open`` must be picklable (worker processes)."""

    open: Callable[[int], Iterator[dict]]
    first: int
    step: int
    count: int

    def read(self, start: int) -> Iterator[dict]:
        """This segment's records from its ``start``-th on."""
        records = self.open(self.first + start * self.step)
        return itertools.islice(records, 0, (self.count - start - 1) * self.step + 1, self.step)


def stride_segments(pieces: Sequence[tuple[Callable[[int], Iterator[dict]], int]],
                    shard_index: int, num_shards: int) -> list[Segment]:
    """Every ``num_shards``-th record of the concatenated pieces, from ``shard_index``:
    record sharding for when there are fewer files than shards."""
    segments, offset = [], 0
    for open_fn, length in pieces:
        first = (shard_index - offset) % num_shards
        if first < length:
            segments.append(Segment(open_fn, first, num_shards,
                                    (length - first + num_shards - 1) // num_shards))
        offset += length
    return segments


class SequentialRecords(Sequence):
    """The examples of one shard of a split, read segment by segment.

    ``records[i]`` works (the pipeline's checks and small tools use it) but reopens
    a reader each time; the training stream goes through ``dataset``.
    """

    sequential = True  # steps that draw random other documents (NSP) refuse these
    windowed = True  # a stream reads through ``dataset`` (Task.get_dataset)

    def __init__(self, segments: Sequence[Segment], window: int = 2048):
        if window < 1:
            raise ValueError(f"shuffle window must be at least 1, got {window}.")
        self.segments = tuple(s for s in segments if s.count > 0)
        self.window = window
        self._starts = [0, *itertools.accumulate(s.count for s in self.segments)]
        self._cache_clear()

    def __len__(self):
        return self._starts[-1]

    def __getitem__(self, index):
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        index %= len(self)
        which = bisect.bisect_right(self._starts, index) - 1
        return next(self.segments[which].read(index - self._starts[which]))

    def __getstate__(self):
        state = dict(self.__dict__)
        del state["_lock"], state["_windows"], state["_reader"]  # open readers stay behind
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._cache_clear()

    def _cache_clear(self):
        # grain may ask from several threads, slightly out of order: one lock, and the last
        # few windows kept, so requests a window early or late do not reopen the reader.
        self._lock = threading.Lock()
        self._windows: collections.OrderedDict = collections.OrderedDict()
        self._reader: _Reader | None = None

    def dataset(self, seed: int, shuffle: bool, num_epochs: int | None) -> grain.MapDataset:
        """Position ``epoch * len + i`` -> example; new segment order and windows each epoch."""
        if not len(self):
            raise ValueError("this shard of the split has no examples.")
        total = sys.maxsize if num_epochs is None else len(self) * num_epochs
        return grain.MapDataset.range(total).map(
            functools.partial(self.example_at, seed=seed, shuffle=shuffle))

    def example_at(self, position: int, seed: int, shuffle: bool) -> dict:
        epoch, index = divmod(position, len(self))
        window, offset = divmod(index, self.window)
        key = (seed, shuffle, epoch, window)
        with self._lock:
            if key not in self._windows:
                self._read_up_to(seed, shuffle, epoch, window)
            return self._windows[key][offset]

    def _read_up_to(self, seed, shuffle, epoch, window) -> None:
        """Caches ``window``, reading on through the windows before it when the open reader
        is a few behind (threads asked out of order), else reopening at its start."""
        reader = self._reader
        first = window
        if reader is not None and (reader.seed, reader.shuffle, reader.epoch) == (seed, shuffle,
                                                                                 epoch):
            reader_window, mid_window = divmod(reader.position, self.window)
            if 0 < window - reader_window <= _CACHED_WINDOWS - 1 and not mid_window:
                first = reader_window
        for w in range(first, window + 1):
            records = self._read_window(seed, shuffle, epoch, w)
            if shuffle:
                order = np.random.default_rng([seed, epoch, w, 1]).permutation(len(records))
                records = [records[i] for i in order]
            self._windows[(seed, shuffle, epoch, w)] = records
            while len(self._windows) > _CACHED_WINDOWS:
                self._windows.popitem(last=False)

    def _epoch_order(self, seed: int, shuffle: bool, epoch: int) -> list[int]:
        if not shuffle:
            return list(range(len(self.segments)))
        return [int(i) for i in np.random.default_rng([seed, epoch, 0]).permutation(
            len(self.segments))]

    def _read_window(self, seed, shuffle, epoch, window) -> list:
        start = window * self.window
        size = min(self.window, len(self) - start)
        reader = self._reader
        if reader is None or reader[:4] != (seed, shuffle, epoch, start):
            reader = _Reader(seed, shuffle, epoch, start,
                             self._open_at(seed, shuffle, epoch, start))
        records = list(itertools.islice(reader.records, size))
        if len(records) != size:
            raise RuntimeError(f"the split ended {size - len(records)} examples early: its files "
                               "hold fewer examples than their metadata says; re-prepare it.")
        self._reader = reader._replace(position=start + size)
        return records

    def _open_at(self, seed, shuffle, epoch, start) -> Iterator[dict]:
        """The epoch's examples in segment order, from position ``start``."""
        order = self._epoch_order(seed, shuffle, epoch)
        counts = [self.segments[i].count for i in order]
        ends = list(itertools.accumulate(counts))
        first = bisect.bisect_right(ends, start)
        skip = start - (ends[first - 1] if first else 0)
        # A generator, so each file opens only when the one before it is done.
        parts = (self.segments[i].read(skip if n == first else 0)
                 for n, i in enumerate(order) if n >= first)
        return itertools.chain.from_iterable(parts)
