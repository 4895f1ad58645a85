"""The per-host pipeline: ``get_dataset`` (seqio's entry point) and host batches.

Host ``p`` of ``P`` reads shard ``p`` of every task's examples
(``source[p::P]``), so across hosts each example appears exactly once per
epoch. The stream is a pure function of the arguments; ``HostBatchIterator``
saves grain's iterator state (source position, carried tokens, partly filled
packing bins) with each checkpoint, so a resumed run sees exactly the batches
an uninterrupted run would.
"""

from __future__ import annotations

import json
from typing import Mapping

import grain
import numpy as np

from t5x_like.data import feature_converters
from t5x_like.data.dataset_providers import get_task_or_mixture


def get_dataset(name: str, task_feature_lengths: Mapping[str, int], split: str = "train",
                feature_converter: feature_converters.FeatureConverter | None = None, *,
                shuffle: bool = True, seed: int = 0, shard_index: int = 0, num_shards: int = 1,
                num_epochs: int | None = None, num_workers: int = 0) -> grain.IterDataset:
    """Examples of a task or mixture as dicts of numpy arrays.

    Without ``feature_converter`` the task features come out as they are; with one,
    the model features, padded or packed. ``num_epochs=None`` repeats forever.
    ``num_workers > 0`` runs the pipeline in that many worker processes (grain's
    ``mp_prefetch``; the output order and the iterator state stay deterministic).
    """
    provider = get_task_or_mixture(name)
    lengths = dict(task_feature_lengths)
    ds = provider.get_dataset(split, lengths, seed=seed, shuffle=shuffle, num_epochs=num_epochs,
                              shard_index=shard_index, num_shards=num_shards)
    if feature_converter is not None:
        ds = feature_converter.apply(ds, lengths)
    if num_workers > 0:
        _mark_absl_flags_parsed()
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
    return ds


def _mark_absl_flags_parsed() -> None:
    """grain's workers read absl flags; a program without ``absl.app`` has not parsed them."""
    from absl import flags
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def converter_for(structure: str, task_feature_lengths: Mapping[str, int], *, pack: bool = False
                  ) -> feature_converters.FeatureConverter:
    """The feature converter for a model structure (``encoder_decoder``, ``decoder``,
    ``encoder``); a decoder given ``inputs`` and ``targets`` lengths is a prefix LM."""
    if structure == "encoder_decoder":
        return feature_converters.EncDecFeatureConverter(pack=pack)
    if structure == "decoder":
        return feature_converters.DecoderFeatureConverter(
            pack=pack, prefix_lm="inputs" in task_feature_lengths)
    if structure == "encoder":
        return feature_converters.EncoderFeatureConverter(pack=pack)
    raise ValueError(f"Unknown model structure {structure!r}; choose encoder_decoder, decoder "
                     "or encoder.")


def build_dataset(task_name: str, split: str, task_feature_lengths: Mapping[str, int], *,
                  seed: int, shuffle: bool, repeat: bool = True, shard_index: int = 0,
                  num_shards: int = 1, structure: str = "encoder_decoder",
                  pack: bool = False) -> grain.IterDataset:
    """The trainer's stream: this host's shard of a task or mixture, converted to the
    features of a model of ``structure``, padded or packed."""
    return get_dataset(task_name, task_feature_lengths, split,
                       converter_for(structure, task_feature_lengths, pack=pack),
                       shuffle=shuffle, seed=seed, shard_index=shard_index,
                       num_shards=num_shards, num_epochs=None if repeat else 1)


def count_batches(dataset: grain.IterDataset, batch_size: int, limit: int) -> int:
    """Full batches of ``batch_size`` in a finite ``dataset``, counting no further than ``limit``."""
    count = 0
    for _ in dataset.batch(batch_size, drop_remainder=True):
        count += 1
        if count >= limit:
            break
    return count


class HostBatchIterator:
    """Yields this host's rows of each global batch, in order.

    ``dataset`` is the stream of whole global batches' examples; host ``p`` of ``P``
    keeps rows ``[p * B/P, (p + 1) * B/P)`` of each. Every host thus sees the same
    global batches whatever the host count, so a run on 2 hosts reproduces one on 1
    (the price: each host runs the preprocessing of the whole batch). ``get_state``
    is JSON (saved in the checkpoint next to the model); ``set_state`` continues
    from it exactly.
    """

    def __init__(self, dataset: grain.IterDataset, global_batch_size: int,
                 process_count: int = 1, process_index: int = 0):
        if global_batch_size % process_count:
            raise ValueError(f"batch_size={global_batch_size} does not divide over "
                             f"{process_count} hosts; use a multiple of {process_count}.")
        self.local_batch_size = global_batch_size // process_count
        first = process_index * self.local_batch_size
        rows = slice(first, first + self.local_batch_size)
        self._iterator = iter(dataset.batch(global_batch_size, drop_remainder=True,
                                            batch_fn=lambda batch: _stack(batch[rows])))
        self.step = 0

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._iterator)
        self.step += 1
        return batch

    def get_state(self) -> dict:
        return {"step": self.step, "grain": _jsonable(self._iterator.get_state())}

    def set_state(self, state: Mapping) -> None:
        if "grain" not in state:
            raise ValueError(
                "This checkpoint's data state has no 'grain' entry (it comes from an older "
                "pipeline that stored only the step); resume it with that version, or start a "
                "fresh workdir.")
        self._iterator.set_state(state["grain"])
        self.step = int(state["step"])


def _stack(rows):
    return {key: np.stack([row[key] for row in rows]) for key in rows[0]}


def _jsonable(state):
    """grain states hold numpy scalars in places; the checkpoint stores JSON."""
    return json.loads(json.dumps(state, default=lambda x: x.item() if hasattr(x, "item") else
                                 x.tolist()))
