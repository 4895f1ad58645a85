"""TFDS datasets prepared as TFRecord, read through ``tfds.load`` (needs TensorFlow).

A tiny builder is prepared for real in a temporary directory (3 train files,
1 validation file), so file sharding, slicing and resumption run on real files.
"""

import itertools
import pickle

import grain
import numpy as np
import pytest
import tensorflow  # noqa: F401  (installed by the dev extra: a missing one must fail, not skip)
import tensorflow_datasets as tfds

import t5x_like.data as td
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.data import sequential, sources
from t5x_like.data.dataset_providers import Task

TRAIN, VALIDATION = 30, 7


class T5xLikeTinyText(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"text": tfds.features.Text(), "id": np.int64}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(0, TRAIN),
                "validation": self._generate_examples(1000, VALIDATION)}

    def _generate_examples(self, first, n):
        for i in range(first, first + n):
            yield i, {"text": f"document number {i} of the tiny corpus", "id": i}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tfds"))
    builder = T5xLikeTinyText(data_dir=path, file_format="tfrecord")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=3))
    assert builder.info.splits["train"].shard_lengths == [10, 10, 10]
    return path


def source(data_dir, **kwargs):
    return sources.TfdsSource("t5x_like_tiny_text", data_dir=data_dir, **kwargs)


def ids(examples):
    return [int(example["id"]) for example in examples]


def stream(records, n, seed=0, shuffle=True, threads=0):
    """As ``Task.get_dataset`` reads (no threads), or with grain's reading threads."""
    ds = records.dataset(seed, shuffle, None).to_iter_dataset(
        grain.ReadOptions(num_threads=threads, prefetch_buffer_size=threads and 16))
    return ids(itertools.islice(iter(ds), n))


def test_auto_reader_reads_tfrecord_through_tfds_load(data_dir):
    src = source(data_dir)
    records = src.get("train")
    assert isinstance(records, sequential.SequentialRecords)
    assert src.num_examples("train") == TRAIN and src.num_examples("validation") == VALIDATION
    # Unshuffled: TFDS's own order, file after file, the same as reading the split whole.
    whole = ids(tfds.as_numpy(tfds.load("t5x_like_tiny_text", split="train", data_dir=data_dir,
                                        shuffle_files=False)))
    assert stream(records, TRAIN, shuffle=False) == whole
    assert sorted(whole) == list(range(TRAIN))
    assert records[TRAIN - 1]["id"] == whole[-1]


def test_sliced_split_reads_only_its_examples(data_dir):
    src = source(data_dir, split_map=(("train", "train[20%:]"), ("validation", "train[:20%]")))
    held_out = set(stream(src.get("validation"), 6, shuffle=False))
    train = stream(src.get("train"), 24, shuffle=False)
    assert len(held_out) == 6 and len(set(train)) == 24
    assert held_out | set(train) == set(range(TRAIN))


def test_shuffled_epochs_are_permutations_that_differ(data_dir):
    records = source(data_dir, shuffle_window=8).get("train")
    both = stream(records, 2 * TRAIN, threads=8)  # threads ask out of order: same examples
    assert both == stream(records, 2 * TRAIN)
    first, second = both[:TRAIN], both[TRAIN:]
    assert sorted(first) == sorted(second) == list(range(TRAIN))
    assert first != second and first != stream(records, TRAIN, shuffle=False)
    # Windowed shuffle: the first window's 8 examples all come from the first file read.
    unshuffled_file_of = {i: n // 10 for n, i in enumerate(stream(records, TRAIN, shuffle=False))}
    assert len({unshuffled_file_of[i] for i in first[:8]}) == 1


@pytest.mark.parametrize("num_shards", [2, 3, 4])  # 4 > 3 files: every 4th record instead
def test_shards_hold_every_example_once(data_dir, num_shards):
    src = source(data_dir)
    shards = [src.shard("train", k, num_shards) for k in range(num_shards)]
    seen = [i for records in shards for i in stream(records, len(records), seed=5)]
    assert sorted(seen) == list(range(TRAIN))


def test_resume_from_iterator_state_sees_the_same_examples(data_dir):
    records = source(data_dir, shuffle_window=8).shard("train", 1, 2)
    ds = records.dataset(seed=3, shuffle=True, num_epochs=None).to_iter_dataset(
        grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    iterator = iter(ds)
    uninterrupted = [next(iterator)["id"] for _ in range(40)]
    iterator = iter(ds)
    for _ in range(23):  # mid-window, mid-file, second epoch
        next(iterator)
    # A fresh reader, as in a restarted process (and as grain ships it to worker processes).
    fresh = pickle.loads(pickle.dumps(records))
    resumed = iter(fresh.dataset(seed=3, shuffle=True, num_epochs=None).to_iter_dataset(
        grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))
    resumed.set_state(iterator.get_state())
    assert [next(resumed)["id"] for _ in range(17)] == uninterrupted[23:]


def test_task_on_tfrecord_source_trains_causal_lm(data_dir):
    task = Task("tiny_tfrecord_lm", source(data_dir), tasks.lm_steps(),
                tasks.features("targets"))
    td.TaskRegistry.add(task)
    try:
        batches = list(itertools.islice(iter(td.get_dataset(
            "tiny_tfrecord_lm", {"targets": 16}, feature_converter=td.DecoderFeatureConverter(),
            seed=1, shard_index=0, num_shards=2)), 3))
    finally:
        td.TaskRegistry.remove("tiny_tfrecord_lm")
    assert all(b["decoder_target_tokens"].shape == (16,) for b in batches)
    text = tasks.embedded_vocabulary().decode(batches[0]["decoder_target_tokens"].tolist())
    assert "tiny corpus" in text or "document number" in text


def test_next_sentence_pairs_refuse_tfrecord(data_dir):
    task = Task("tiny_tfrecord_nsp", source(data_dir),
                [td.preprocessors.NextSentencePairs(), td.preprocessors.MaskedLM(add_cls_sep=False)],
                tasks.features("inputs", "targets"))
    td.TaskRegistry.add(task)
    try:
        with pytest.raises(ValueError, match="array_record"):
            next(iter(td.get_dataset("tiny_tfrecord_nsp", {"inputs": 32})))
    finally:
        td.TaskRegistry.remove("tiny_tfrecord_nsp")


def test_reader_choice_errors(data_dir, monkeypatch):
    with pytest.raises(ValueError, match="reader='tf'"):
        source(data_dir, reader="tf")
    with pytest.raises(FileNotFoundError, match="array_record"):
        source(data_dir, reader="array_record").get("train")
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match=r'-e "\.\[tf\]"'):
        source(data_dir).get("train")


def test_bad_tfrecord_reads_are_named(data_dir, monkeypatch):
    assert len(source(data_dir).shard("train", 30, 31)) == 0  # fewer examples than shards
    with pytest.raises(ValueError, match="shuffle window must be at least 1"):
        source(data_dir, shuffle_window=0).get("train")
    with pytest.raises(ValueError, match="has no split 'test'"):
        source(data_dir, split_map=(("train", "test"),)).get("train")
    # Files that hold fewer examples than the metadata says stop the stream with a message.
    short = sequential.Segment(lambda offset: iter([{"id": 0}] * (2 - offset)), 0, 1, 3)
    with pytest.raises(RuntimeError, match="ended 1 examples early.*re-prepare"):
        stream(sequential.SequentialRecords([short]), 3)
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match=r"reader='tfrecord'.*-e \"\.\[tf\]\""):
        source(data_dir, reader="tfrecord").get("train")
