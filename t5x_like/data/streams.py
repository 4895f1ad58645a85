"""Fixed virtual streams: how processes share the global batch's input.

The global batch of ``B`` rows is drawn from ``V`` independent streams
(``data_streams`` in the config). Stream ``v`` reads shard ``v`` of ``V`` of every
task, is preprocessed, converted and packed on its own, and fills rows
``[v * B/V, (v + 1) * B/V)`` of every batch. Process ``p`` of ``P`` runs streams
``[p * V/P, (p + 1) * V/P)`` only, which are exactly its rows of the batch: each
process loads and preprocesses only its share. The streams do not depend on
``P``, so with the same ``V`` a run on 2 processes sees the same batches as a run
on 1, and a checkpoint (which holds every stream's state) resumes on any ``P``
that divides ``V``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

import grain
import numpy as np

from t5x_like.errors import DataError, data_error_in

# make_stream(shard_index=v, num_shards=V) -> the examples of stream v.
StreamFactory = Callable[..., grain.IterDataset]


def check_layout(global_batch_size: int, num_streams: int, process_count: int) -> None:
    """Raises ValueError unless ``B % V == 0`` and ``V % P == 0``."""
    if num_streams < 1:
        raise ValueError(f"data_streams resolves to {num_streams}; use a positive count "
                         "(or 0 in the config: chosen from the batch and the processes).")
    if global_batch_size % num_streams:
        raise ValueError(
            f"batch_size={global_batch_size} does not split into data_streams={num_streams} "
            f"equal parts; use a batch_size that is a multiple of {num_streams}, or a "
            f"data_streams that divides {global_batch_size}.")
    if num_streams % process_count:
        raise ValueError(
            f"data_streams={num_streams} does not divide over {process_count} processes; use a "
            f"multiple of {process_count} (e.g. --config.data_streams="
            f"{num_streams * process_count // np.gcd(num_streams, process_count)}), or run on a "
            f"process count that divides {num_streams}.")


def process_streams(num_streams: int, process_count: int, process_index: int) -> range:
    """The streams process ``process_index`` runs: a contiguous block of ``V/P``."""
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} is not in [0, {process_count}).")
    per_process = num_streams // process_count
    return range(process_index * per_process, (process_index + 1) * per_process)


class HostBatchIterator:
    """Yields this process's rows of each global batch, in order.

    ``streams`` makes stream ``v`` of ``V`` (``streams(shard_index=v, num_shards=V)``,
    e.g. ``functools.partial(pipeline.build_dataset, ...)``); a single dataset is one
    stream (``num_streams=1``). ``get_state`` is JSON holding this process's streams
    (``merge_states`` joins the processes' states for the checkpoint); ``set_state``
    takes the whole run's state and continues exactly.
    """

    def __init__(self, streams: StreamFactory | grain.IterDataset, global_batch_size: int,
                 num_streams: int = 1, process_count: int = 1, process_index: int = 0,
                 padding: Mapping[str, np.ndarray] | None = None):
        """``padding`` (one row of zeros per feature) is for finite streams read once, such
        as evaluation's: every example is read, a stream's short last batch (or a stream
        that has ended while others go on) is filled with padding rows, which every loss
        weighs 0, and the iterator ends when all this process's streams have."""
        check_layout(global_batch_size, num_streams, process_count)
        if isinstance(streams, grain.IterDataset):
            if num_streams != 1:
                raise ValueError(f"One dataset is one stream, but num_streams={num_streams}; pass "
                                 "a function (shard_index, num_shards) -> dataset instead.")
            dataset = streams
            streams = lambda shard_index, num_shards: dataset  # noqa: E731
        self.num_streams = num_streams
        self.stream_indices = process_streams(num_streams, process_count, process_index)
        self.rows_per_stream = global_batch_size // num_streams
        self.local_batch_size = self.rows_per_stream * len(self.stream_indices)
        self.padding = None if padding is None else dict(padding)
        self._iterators = [
            iter(streams(shard_index=v, num_shards=num_streams).batch(
                self.rows_per_stream, drop_remainder=padding is None, batch_fn=list))
            for v in self.stream_indices]
        self.step = 0

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        """The next batch. A data error raised while reading it reaches the caller as
        itself, not as the exception a worker process or a library wrapped it in
        (``errors.data_error_in``); every other error passes as it is."""
        try:
            return self._next_padded() if self.padding is not None else self._next_full()
        except DataError:
            raise
        except Exception as e:
            found = data_error_in(e)
            if found is None:
                raise
            raise found from None

    def _next_full(self) -> dict[str, np.ndarray]:
        rows = []
        for iterator in self._iterators:
            rows.extend(next(iterator))
        self.step += 1
        return {key: np.stack([row[key] for row in rows]) for key in rows[0]}

    def _next_padded(self) -> dict[str, np.ndarray]:
        rows, real = [], 0
        for iterator in self._iterators:
            stream_rows = next(iterator, [])
            real += len(stream_rows)
            rows.extend(list(stream_rows) + [self.padding] * (self.rows_per_stream
                                                                - len(stream_rows)))
        if not real:
            raise StopIteration
        self.step += 1
        return {key: np.stack([np.asarray(row[key]) for row in rows]) for key in self.padding}

    def padding_batch(self) -> dict[str, np.ndarray]:
        """This process's rows of a batch of padding only: what a process whose streams
        have ended feeds while other processes still evaluate."""
        return {key: np.stack([np.asarray(value)] * self.local_batch_size)
                for key, value in self.padding.items()}

    def get_state(self) -> dict:
        """``{"step", "num_streams", "streams": [state or None per stream]}``: only this
        process's streams are filled in."""
        states: list = [None] * self.num_streams
        for v, iterator in zip(self.stream_indices, self._iterators, strict=False):
            states[v] = _jsonable(iterator.get_state())
        return {"step": self.step, "num_streams": self.num_streams, "streams": states}

    def set_state(self, state: Mapping) -> None:
        """Restores from a whole run's state (any process count, the same stream count)."""
        state = _upgrade(state, self.num_streams)
        saved = state["num_streams"]
        if saved != self.num_streams:
            raise ValueError(
                f"The checkpoint's data state was saved with {saved} input streams, but this run "
                f"uses data_streams={self.num_streams}; the stream count fixes which examples make "
                f"each batch. Set --config.data_streams={saved} to resume (any process count that "
                "divides it works), or start a fresh workdir.")
        missing = [v for v in self.stream_indices if state["streams"][v] is None]
        if missing:
            raise ValueError(f"The data state lacks streams {missing}: it holds one process's "
                             "streams only. Save pipeline.merge_states of every process's "
                             "get_state().")
        for v, iterator in zip(self.stream_indices, self._iterators, strict=False):
            iterator.set_state(state["streams"][v])
        self.step = int(state["step"])


def merge_states(states: Sequence[Mapping]) -> dict:
    """One state from every process's ``get_state()`` (each fills in its own streams)."""
    first = states[0]
    if any(s["num_streams"] != first["num_streams"] or s["step"] != first["step"]
           for s in states):
        raise ValueError("Processes disagree on the data step or stream count: "
                         f"{[(s['step'], s['num_streams']) for s in states]}.")
    merged: list = [None] * first["num_streams"]
    for state in states:
        for v, stream_state in enumerate(state["streams"]):
            if stream_state is not None:
                if merged[v] is not None:
                    raise ValueError(f"Stream {v} is held by more than one process.")
                merged[v] = stream_state
    if None in merged:
        raise ValueError(f"No process holds streams "
                         f"{[v for v, s in enumerate(merged) if s is None]}.")
    return {"step": first["step"], "num_streams": first["num_streams"], "streams": merged}


def _upgrade(state: Mapping, num_streams: int) -> Mapping:
    """Reads the single-stream state that checkpoints held before streams existed."""
    if "streams" in state:
        return state
    if "grain" not in state:
        raise ValueError(
            "This checkpoint's data state has no 'streams' or 'grain' entry (it comes from an "
            "older pipeline that stored only the step); resume it with that version, or start "
            "a fresh workdir.")
    # The old pipeline was one stream over the whole batch: a 1-stream state.
    return {"step": state["step"], "num_streams": 1, "streams": [state["grain"]]}


def _jsonable(state):
    """grain states hold numpy scalars in places; the checkpoint stores JSON."""
    return json.loads(json.dumps(state, default=lambda x: x.item() if hasattr(x, "item") else
                                 x.tolist()))
