"""The input pipeline: ``get_dataset`` (seqio's entry point) and the trainer's streams.

``build_dataset(..., shard_index=v, num_shards=V)`` is stream ``v`` of ``V``:
shard ``v`` of every task's examples (whole files when there are enough, else
every ``V``-th record; across shards each example appears exactly once per
epoch), converted to model features. ``streams.HostBatchIterator`` runs this
process's streams and assembles its rows of each global batch (see
``streams.py`` for how processes share them). A stream is a pure function of
its arguments and its grain iterator state (source position, carried tokens,
partly filled packing bins) goes into each checkpoint, so a resumed run sees
exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

import grain

from t5x_like.data import feature_converters
from t5x_like.data.dataset_providers import get_task_or_mixture, naming_records, with_vocabulary
from t5x_like.data.streams import HostBatchIterator, merge_states  # noqa: F401  (re-exported)

# Imports inside functions: absl's flags are read only when a run was started through absl.


def get_dataset(name: str, task_feature_lengths: Mapping[str, int], split: str = "train",
                feature_converter: feature_converters.FeatureConverter | None = None, *,
                shuffle: bool = True, seed: int = 0, shard_index: int = 0, num_shards: int = 1,
                num_epochs: int | None = None, num_workers: int = 0,
                vocabulary=None) -> grain.IterDataset:
    """Examples of a task or mixture as dicts of numpy arrays.

    Without ``feature_converter`` the task features come out as they are; with one,
    the model features, padded or packed. ``num_epochs=None`` repeats forever.
    ``num_workers > 0`` runs the pipeline in that many worker processes (grain's
    ``mp_prefetch``; the output order and the iterator state stay deterministic).
    ``vocabulary`` re-tokenizes the task (a checkpoint's own tokenizer).
    """
    provider = with_vocabulary(get_task_or_mixture(name), vocabulary)
    lengths = dict(task_feature_lengths)
    ds = provider.get_dataset(split, lengths, seed=seed, shuffle=shuffle, num_epochs=num_epochs,
                              shard_index=shard_index, num_shards=num_shards)
    if feature_converter is not None:
        required = getattr(feature_converter, "REQUIRED", ())
        if required:  # a stateless map: the iterator state (checkpoints) is unchanged
            ds = ds.map(_RequireFeatures(name, split, tuple(required),
                                         type(feature_converter).__name__))
        ds = feature_converter.apply(ds, lengths)
        ds = naming_records(ds, provider, split)  # a converter's error about one example
    if num_workers > 0:
        _mark_absl_flags_parsed()
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
    return ds


class _RequireFeatures:
    """Passes examples that hold the converter's features; otherwise stops with the raw
    record that lacks one (file and line for a JSONL source)."""

    def __init__(self, name: str, split: str, required: tuple[str, ...], converter: str):
        self.name, self.split, self.required, self.converter = name, split, required, converter

    def __call__(self, example):
        missing = [f for f in self.required if f not in example]
        if missing:
            raise feature_converters.MissingFeatures(self._message(example, missing))
        return example

    def _message(self, example, missing) -> str:
        tasks = get_task_or_mixture(self.name).tasks
        where = next(filter(None, (task.record_without(self.split, missing) for task in tasks)),
                     None)
        found = (f": {where}" if where else
                 f" (it has {', '.join(map(repr, sorted(example)))}); check the task's "
                 "preprocessors")
        return (f"{self.name!r}: a {self.split!r} example lacks {', '.join(map(repr, missing))}, "
                f"which {self.converter} needs{found}. Every record needs "
                f"{', '.join(map(repr, self.required))}.")


def _mark_absl_flags_parsed() -> None:
    """grain's workers read absl flags; a program without ``absl.app`` has not parsed them."""
    from absl import flags
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def build_dataset(task_name: str, split: str, task_feature_lengths: Mapping[str, int], *,
                  seed: int, shuffle: bool, repeat: bool = True, shard_index: int = 0,
                  num_shards: int = 1, pack: bool = False,
                  feature_converter: feature_converters.FeatureConverter | None = None,
                  vocabulary=None) -> grain.IterDataset:
    """The trainer's stream ``shard_index`` of ``num_shards``: that shard of a task or
    mixture, converted by ``feature_converter`` (the model structure's own, which the
    data side never chooses; by default an encoder-decoder's), padded or packed."""
    converter = feature_converter or feature_converters.EncDecFeatureConverter(pack=pack)
    return get_dataset(task_name, task_feature_lengths, split, converter,
                       shuffle=shuffle, seed=seed, shard_index=shard_index,
                       num_shards=num_shards, num_epochs=None if repeat else 1,
                       vocabulary=vocabulary)


def count_batches(batches: Iterator, limit: int) -> int:
    """Batches a finite iterator yields, counting no further than ``limit``."""
    return sum(1 for _ in itertools.islice(batches, limit))
