"""Per-host batches for a global step, and an iterator whose state is one integer.

The global batch of step ``s`` is examples ``[s*B, (s+1)*B)`` of the dataset;
host ``p`` of ``P`` builds rows ``[p*B/P, (p+1)*B/P)`` of it. So a run on one
host and a run on many hosts see the same global batch, and resuming at step
``s`` needs nothing but ``s``.
"""

from __future__ import annotations

from typing import Mapping

import grain
import numpy as np

from t5x_like.data import feature_converters
from t5x_like.data.dataset_providers import TaskRegistry


def build_dataset(task_name: str, split: str, task_feature_lengths: Mapping[str, int], *,
                  seed: int, shuffle: bool, repeat: bool = True) -> grain.MapDataset:
    """Task examples converted to the encoder-decoder model's features."""
    task = TaskRegistry.get(task_name)
    converter = feature_converters.EncDecFeatureConverter()
    lengths = dict(task_feature_lengths)
    ds = task.get_dataset(split, lengths, seed=seed, shuffle=shuffle, repeat=repeat)
    return ds.map(lambda example: converter(example, lengths))


class HostBatchIterator:
    """Yields this host's share of each global batch, in step order."""

    def __init__(self, dataset: grain.MapDataset, global_batch_size: int,
                 process_index: int = 0, process_count: int = 1, start_step: int = 0):
        if global_batch_size % process_count:
            raise ValueError(f"batch_size={global_batch_size} does not divide over "
                             f"{process_count} hosts; use a multiple of {process_count}.")
        self._dataset = dataset
        self._global_batch_size = global_batch_size
        self._local_batch_size = global_batch_size // process_count
        self._first_row = process_index * self._local_batch_size
        self.step = start_step

    def local_batch(self, step: int) -> dict[str, np.ndarray]:
        start = step * self._global_batch_size + self._first_row
        rows = [self._dataset[i] for i in range(start, start + self._local_batch_size)]
        return {key: np.stack([row[key] for row in rows]) for key in rows[0]}

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = self.local_batch(self.step)
        self.step += 1
        return batch

    def get_state(self) -> dict[str, int]:
        return {"step": self.step}

    def set_state(self, state: Mapping[str, int]) -> None:
        self.step = int(state["step"])
