"""``ParquetSource``: the rows pyarrow reads, split, sharded by whole files, read a row group
at a time; a task over it streams and resumes exactly; a missing column and a null value
are errors naming the file (and the row)."""

import itertools
import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import t5x_like.data as td
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.data import pipeline
from t5x_like.data.parquet import ParquetRows

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


def test_a_task_over_parquet_resumes_exactly(corpus):
    name = "parquet_lm_test"
    td.TaskRegistry.add(name, td.ParquetSource(str(corpus / "part-*.parquet"), "content",
                                               holdout_every=5),
                        preprocessors=tasks.lm_steps(), output_features=tasks.features("targets"))
    try:
        def iterator():
            return pipeline.HostBatchIterator(td.get_dataset(name, {"targets": 16}, seed=3), 4)
        straight = list(itertools.islice(iter(iterator()), 6))
        interrupted = iterator()
        list(itertools.islice(iter(interrupted), 2))
        state = json.loads(json.dumps(interrupted.get_state()))
        resumed = iterator()
        resumed.set_state(state)
        for a, b in zip(straight[2:], itertools.islice(iter(resumed), 4), strict=True):
            assert all(np.array_equal(a[k], b[k]) for k in a)
    finally:
        td.TaskRegistry.remove(name)


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
