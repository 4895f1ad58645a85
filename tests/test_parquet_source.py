"""``ParquetSource`` and ``HfDatasetSource``: the rows pyarrow and ``datasets`` read, split,
sharded (Parquet by whole files), read lazily; a task over each streams and resumes
exactly; a missing column and a null value are errors naming the file (and the row)."""

import itertools
import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import t5x_like.data as td
from t5x_like import errors
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.data import pipeline
from t5x_like.data.parquet import ParquetRows
from t5x_like.data.sources import SPLITS

ROWS = (23, 9, 31)  # rows per file; row groups of 7


@pytest.fixture
def corpus(tmp_path):
    for f, count in enumerate(ROWS):
        table = pa.table({"content": [f"file {f} row {r}" for r in range(count)],
                          "url": [f"u{f}.{r}" for r in range(count)],
                          "score": np.arange(count, dtype=np.float32)})
        pq.write_table(table, tmp_path / f"part-{f}.parquet", row_group_size=7)
    return tmp_path


def pyarrow_rows(corpus, split: str, every: int) -> list[dict]:
    """pyarrow's own reading, with every ``every``-th row of a file held out."""
    rows = []
    for f in range(len(ROWS)):
        table = pq.read_table(corpus / f"part-{f}.parquet").to_pylist()
        rows += [{"text": r["content"], "id": r["url"]} for i, r in enumerate(table)
                 if (i % every == every - 1) == (split == "validation")]
    return rows


@pytest.mark.parametrize("split", ["train", "validation"])
def test_rows_are_pyarrows_in_file_order_split_every_nth(corpus, split):
    source = td.ParquetSource(str(corpus / "part-*.parquet"), {"text": "content", "id": "url"},
                              holdout_every=5)
    rows = source.get(split)
    assert isinstance(rows, ParquetRows)  # lazy: rows are read by index
    assert list(rows) == pyarrow_rows(corpus, split, 5)
    assert rows[-1] == list(rows)[-1] and rows[3:5] == list(rows)[3:5]
    assert source.num_examples(split) == len(pyarrow_rows(corpus, split, 5))


def test_a_column_name_alone_is_the_text_and_holdout_zero_keeps_every_row(corpus):
    source = td.ParquetSource([str(corpus / "part-1.parquet")], "content", holdout_every=0)
    assert source.splits == ("train",)
    assert [r["text"] for r in source.get("train")] == [f"file 1 row {r}" for r in range(9)]


def test_streams_read_whole_files_and_every_row_once(corpus):
    source = td.ParquetSource(str(corpus / "part-*.parquet"), "content", holdout_every=5)
    shards = [list(source.shard("train", i, 2)) for i in range(2)]
    files = [{row["text"].split()[1] for row in shard} for shard in shards]
    assert files == [{"0", "2"}, {"1"}]  # file-level sharding: files i, i + 2, ...
    assert sorted(r["text"] for shard in shards for r in shard) == sorted(
        r["text"] for r in pyarrow_rows(corpus, "train", 5))
    # ... and the rows survive a trip to a worker process.
    rows = source.get("train")
    assert list(pickle.loads(pickle.dumps(rows))) == list(rows)


def _one_epoch_texts(name, source, shuffle: bool, shard=(0, 1), seed: int = 0) -> list[str]:
    """The raw rows a task's stream reads in one epoch (no steps: the text as read)."""
    td.TaskRegistry.add(name, source, preprocessors=(), output_features=tasks.features("text"))
    try:
        ds = td.TaskRegistry.get(name).get_dataset("train", {"text": 64}, seed=seed,
                                                    shuffle=shuffle, num_epochs=1,
                                                    shard_index=shard[0], num_shards=shard[1])
        return [row["text"] for row in ds]
    finally:
        td.TaskRegistry.remove(name)


@pytest.mark.parametrize("streams", [1, 2, 5])  # 5 streams over 3 files: every 5th row each
def test_a_shuffled_stream_reads_row_groups_whole_and_every_row_once(corpus, monkeypatch,
                                                                     streams):
    """Training reads a row group once per epoch (not a group per row, as a global random
    order would), in an order permuted by the seed, and still reads every row once."""
    reads = []
    real = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group",
                        lambda self, i, **kw: reads.append(i) or real(self, i, **kw))
    source = td.ParquetSource(str(corpus / "part-*.parquet"), "content", holdout_every=5,
                              shuffle_window=6)
    expected = sorted(r["text"] for r in pyarrow_rows(corpus, "train", 5))
    shards = [_one_epoch_texts(f"pq_epoch_{i}", source, True, (i, streams)) for i in range(streams)]
    assert sorted(t for shard in shards for t in shard) == expected
    groups = sum(-(-n // 7) for n in ROWS)
    assert len(reads) <= groups * streams  # each stream reads a group at most once
    in_order = _one_epoch_texts("pq_in_order", source, False, (0, streams))
    assert in_order == [t["text"] for t in list(source.shard("train", 0, streams))]
    assert shards[0] != in_order and sorted(shards[0]) == sorted(in_order)
    assert _one_epoch_texts("pq_seed_1", source, True, (0, streams), seed=1) != shards[0]


def test_a_shuffle_window_that_is_not_a_positive_count_is_refused(corpus):
    with pytest.raises(ValueError, match="shuffle_window=0; use a positive number of rows"):
        td.ParquetSource(str(corpus / "part-*.parquet"), "content", shuffle_window=0)


def assert_task_resumes_exactly(name, source, length: int, batch: int, stop: int, total: int):
    """A causal-LM task over ``source``: batches after a resume from the state saved at
    ``stop`` equal a straight run's."""
    td.TaskRegistry.add(name, source, preprocessors=tasks.lm_steps(),
                        output_features=tasks.features("targets"))
    try:
        def iterator():
            return pipeline.HostBatchIterator(td.get_dataset(name, {"targets": length}, seed=3),
                                              batch)
        straight = list(itertools.islice(iter(iterator()), total))
        interrupted = iterator()
        list(itertools.islice(iter(interrupted), stop))
        resumed = iterator()
        resumed.set_state(json.loads(json.dumps(interrupted.get_state())))
        for a, b in zip(straight[stop:], itertools.islice(iter(resumed), total - stop),
                        strict=True):
            assert all(np.array_equal(a[k], b[k]) for k in a)
    finally:
        td.TaskRegistry.remove(name)


def test_a_task_over_parquet_resumes_exactly(corpus):
    assert_task_resumes_exactly(
        "parquet_lm_test", td.ParquetSource(str(corpus / "part-*.parquet"), "content",
                                            holdout_every=5), 16, 4, 2, 6)


def test_a_missing_column_names_the_file_and_a_null_names_the_row(corpus):
    with pytest.raises(ValueError, match=r"part-0.parquet: no column 'body' \(its columns: "
                                         r"content, score, url\)"):
        td.ParquetSource(str(corpus / "part-0.parquet"), "body").get("train")
    pq.write_table(pa.table({"content": ["a", None, "c"]}), corpus / "nulls.parquet")
    rows = td.ParquetSource(str(corpus / "nulls.parquet"), "content", holdout_every=0).get("train")
    assert rows[0] == {"text": "a"}
    with pytest.raises(ValueError, match=r"nulls.parquet row 1: column 'content' is null"):
        rows[1]
    with pytest.raises(ValueError, match="give a column name or a mapping"):
        td.ParquetSource(str(corpus / "nulls.parquet"), {})
    with pytest.raises(errors.MissingFile, match=r"No file matches '.*absent-\*\.parquet'\. "
                                                 r"Check the path"):
        td.ParquetSource(str(corpus / "absent-*.parquet"), "content").get("train")


# -- a Hugging Face datasets folder -----------------------------------------------------


@pytest.fixture
def saved(tmp_path):
    from datasets import Dataset, DatasetDict
    rows = {"content": [f"row {i}" for i in range(17)], "url": [f"u{i}" for i in range(17)]}
    Dataset.from_dict(rows).save_to_disk(str(tmp_path / "one"))
    DatasetDict({"train": Dataset.from_dict(rows),
                 "validation": Dataset.from_dict({"content": ["held"], "url": ["h"]})}
                ).save_to_disk(str(tmp_path / "dict"))
    return tmp_path


def test_a_saved_dataset_reads_as_datasets_reads_it(saved):
    from datasets import load_from_disk
    own = load_from_disk(str(saved / "one"))
    source = td.HfDatasetSource(str(saved / "one"), {"text": "content", "id": "url"},
                                holdout_every=4)
    expected = {split: [{"text": r["content"], "id": r["url"]} for i, r in enumerate(own)
                        if (i % 4 == 3) == (split == "validation")] for split in SPLITS}
    for split in SPLITS:
        assert list(source.get(split)) == expected[split]
    assert source.origin("validation", 1) == f"{saved / 'one'} row 7"
    rows = source.get("train")
    assert list(pickle.loads(pickle.dumps(rows))) == list(rows)
    shards = [list(source.shard("train", i, 3)) for i in range(3)]
    assert sorted(r["id"] for s in shards for r in s) == sorted(r["id"] for r in expected["train"])


def test_a_saved_dataset_dict_gives_its_own_splits(saved):
    source = td.HfDatasetSource(str(saved / "dict"), "content")
    assert source.splits == ("train", "validation")
    assert [r["text"] for r in source.get("validation")] == ["held"]
    assert len(source.get("train")) == 17


def test_a_task_over_a_saved_dataset_resumes_exactly(saved):
    assert_task_resumes_exactly("hf_datasets_lm_test",
                                td.HfDatasetSource(str(saved / "one"), "content"), 8, 2, 2, 5)


def test_a_saved_dataset_without_the_column_or_with_a_null_is_named(saved):
    from datasets import Dataset
    with pytest.raises(ValueError, match=r"one: no column 'body' \(its columns: content, url\)"):
        td.HfDatasetSource(str(saved / "one"), "body").get("train")
    Dataset.from_dict({"content": ["a", None]}).save_to_disk(str(saved / "nulls"))
    rows = td.HfDatasetSource(str(saved / "nulls"), "content", holdout_every=0).get("train")
    with pytest.raises(ValueError, match=r"nulls row 1: column 'content' is null"):
        rows[1]
    with pytest.raises(errors.MissingFile, match=r"absent does not exist; give HfDatasetSource "
                                                 "the folder save_to_disk wrote"):
        td.HfDatasetSource(str(saved / "absent"), "content").get("train")
    (saved / "empty").mkdir()
    with pytest.raises(ValueError, match="not a folder `save_to_disk` wrote nor a prepared"):
        td.HfDatasetSource(str(saved / "empty"), "content").get("train")


# -- a dataset in the datasets cache ----------------------------------------------------


@pytest.fixture
def cached(tmp_path):
    """A dataset load_dataset prepared in a cache folder (from local Parquet files: the
    packaged parquet builder, offline): train in two Arrow shards, validation in one."""
    import datasets
    files = {"train": [], "validation": []}
    for name, part, rows in (("train", 0, 20), ("train", 1, 10), ("validation", 0, 5)):
        path = tmp_path / f"{name}-{part}.parquet"
        pq.write_table(pa.table({"content": [f"{name} {part} {i}" for i in range(rows)]}), path)
        files[name].append(str(path))
    loaded = datasets.load_dataset("parquet", data_files=files, num_proc=2,
                                   cache_dir=str(tmp_path / "cache"))
    assert len(list((tmp_path / "cache").rglob("parquet-train-0000?-of-00002.arrow"))) == 2
    return tmp_path, loaded


def test_a_dataset_in_the_cache_reads_as_datasets_reads_it(cached):
    root, loaded = cached
    by_name = td.HfDatasetSource("parquet", "content", cache_dir=str(root / "cache"))
    assert by_name.splits == ("train", "validation")
    for split in SPLITS:
        assert [r["text"] for r in by_name.get(split)] == loaded[split]["content"]
    folder, = (root / "cache" / "parquet").glob("*/*/*/dataset_info.json")
    by_folder = td.HfDatasetSource(str(folder.parent), "content")
    assert list(by_folder.get("train")) == list(by_name.get("train"))
    assert_task_resumes_exactly("hf_cache_lm_test", by_name, 8, 2, 2, 5)


def test_a_name_not_in_the_cache_lists_what_is_there(cached):
    root, _ = cached
    with pytest.raises(errors.MissingFile, match=r"'HuggingFaceFW/fineweb' is neither a folder "
                                                 r"nor a dataset in the datasets cache .* \(it "
                                                 r"holds: parquet\); load it once"):
        td.HfDatasetSource("HuggingFaceFW/fineweb", "text", cache_dir=str(root / "cache")).get("train")
    config = next((root / "cache" / "parquet").iterdir()).name
    with pytest.raises(ValueError, match=rf"parquet: the cache holds config\(s\) {config}; "
                                         r"set HfDatasetSource's config to one of them \(not "
                                         r"'en'\)"):
        td.HfDatasetSource("parquet", "content", config="en", cache_dir=str(root / "cache")).get("train")
