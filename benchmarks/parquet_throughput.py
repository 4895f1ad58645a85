"""Tokens per second per host from a Parquet corpus, against what a v5p host's chips consume.

    .venv/bin/python benchmarks/parquet_throughput.py [--corpus /tmp/t5xl_parquet_corpus]
        [--gigabytes 1.0] [--seconds 30] [--rows span_corruption,lm] [--smoke]

1. Builds (once; kept in ``--corpus``) a Parquet corpus of at least ``--gigabytes`` on
   disk from the embedded English corpus: documents of 8 to 64 consecutive lines of one
   book (FineWeb-sized, ~600 words on average), drawn afresh with each pass's seed until
   the files reach the size; 16 files, row groups of 1,000 rows, Snappy-compressed, a
   ``text`` column and an ``id`` column, as FineWeb's shards are laid out.
2. Reads it through ``ParquetSource`` and the built-in objectives' steps (T5 span
   corruption at 512/114, packed; causal LM at 2048, the 1B decoder's length), in one
   process, shuffled as training reads, for ``--seconds`` after a warm-up: tokens/s
   and tokens per CPU-second (non-padding encoder inputs + decoder targets of finished,
   packed rows).
3. Compares with what the chips of one TPU v5p host (4 chips; 16 hosts in v5p:4x4x4)
   consume at the planner's roofline step for T5-XL (128 x (512 + 114) tokens in
   93.6 ms) and decoder_modern_1b (512 x 2048 in 261.1 ms), from docs/low_precision.md's
   plans (``python -m t5x_like.plan --config=configs/t5_1_1_xl.py --topology=v5p:4x4x4``),
   and at the compute bound alone (100% MFU): the cores of the host's 208 vCPUs the
   input pipeline needs.

``--smoke``: a corpus of 2 files of one 50-row group each in a temporary folder (removed
after), read for half a second a row: a check that the script runs.
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import tempfile
import time

import numpy as np

import t5x_like.data as td
from t5x_like.builtin_tasks import pretraining
from t5x_like.data import embedded

FILES, ROW_GROUP_ROWS = 16, 1000
TOKEN_FEATURES = ("encoder_input_tokens", "decoder_target_tokens")
HOST_VCPUS, CHIPS_PER_HOST, HOSTS = 208, 4, 16  # v5p:4x4x4 = 64 chips on 16 hosts
# (tokens per step, roofline step s, compute-bound step s) from docs/low_precision.md's plans.
CONSUMERS = {
    "span_corruption": ("T5-XL (t5_1_1_xl), 512/114", 128 * (512 + 114), 0.0936, 0.0233),
    "lm": ("decoder_modern_1b, 2048", 512 * 2048, 0.2611, 0.2611),
}
ROWS = {
    "span_corruption": (pretraining.span_corruption_steps, ("inputs", "targets"),
                        {"inputs": 512, "targets": 114}, lambda: td.EncDecFeatureConverter(pack=True)),
    "lm": (pretraining.lm_steps, ("targets",), {"targets": 2048},
           lambda: td.DecoderFeatureConverter(pack=True)),
}


def build_corpus(folder: pathlib.Path, gigabytes: float, files: int = FILES,
                 row_group_rows: int = ROW_GROUP_ROWS) -> list[pathlib.Path]:
    """Parquet files totalling at least ``gigabytes`` on disk (kept: built once)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    done = folder / "DONE"
    if done.exists() and float(done.read_text()) >= gigabytes:
        return sorted(folder.glob("*.parquet"))
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.parquet"):
        old.unlink()
    books = _books()
    target = gigabytes * 2**30 / files
    started, doc_id = time.perf_counter(), 0
    for file_index in range(files):
        path = folder / f"train-{file_index:05d}-of-{files:05d}.parquet"
        rng = np.random.default_rng([file_index])
        with pq.ParquetWriter(path, pa.schema([("id", pa.int64()), ("text", pa.string())]),
                              compression="snappy") as writer:
            written = 0  # the writer makes the file when it opens: write one row group at least
            while not written or path.stat().st_size < target:
                texts = []
                for _ in range(row_group_rows):
                    book = books[rng.integers(len(books))]
                    start, size = rng.integers(len(book) - 64), rng.integers(8, 65)
                    texts.append("\n".join(book[start:start + size]))
                ids = np.arange(doc_id, doc_id + len(texts))
                doc_id += len(texts)
                written += len(texts)
                writer.write_table(pa.table({"id": ids, "text": texts}),
                                   row_group_size=row_group_rows)
        print(f"  {path.name}: {path.stat().st_size / 2**20:,.0f} MiB", flush=True)
    size = sum(p.stat().st_size for p in folder.glob("*.parquet"))
    print(f"corpus: {size / 2**30:.2f} GiB on disk, {doc_id:,} documents, "
          f"{time.perf_counter() - started:.0f} s to write")
    done.write_text(str(gigabytes))
    return sorted(folder.glob("*.parquet"))


def _books() -> list[list[str]]:
    import gzip
    books = []
    for path in embedded.english_files():
        with gzip.open(path, "rt", encoding="utf-8") as f:
            books.append([line.rstrip("\n") for line in f if line.strip()])
    return books


def measure(name: str, files, seconds: float) -> dict:
    steps, feature_names, lengths, converter = ROWS[name]
    task = f"parquet_bench_{name}"
    td.TaskRegistry.remove(task)  # a task of these files, not of an earlier corpus
    td.TaskRegistry.add(task, td.ParquetSource([str(f) for f in files], "text"), steps(),
                        pretraining.features(*feature_names))
    iterator = iter(td.get_dataset(task, lengths, feature_converter=converter(), seed=0))
    for _ in itertools.islice(iterator, 8):  # warm-up: footers, vocabulary, first row groups
        pass
    start, cpu_start, tokens, rows = time.perf_counter(), time.process_time(), 0, 0
    while time.perf_counter() - start < seconds:
        example = next(iterator)
        tokens += sum(int(np.count_nonzero(example[k])) for k in TOKEN_FEATURES if k in example)
        rows += 1
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {"name": name, "rows": rows, "tokens/s": tokens / wall, "tokens/cpu-s": tokens / cpu}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="/tmp/t5xl_parquet_corpus")
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rows", default="span_corruption,lm")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny corpus in a temporary folder: a check that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="parquet_smoke_") as folder:
            files = build_corpus(pathlib.Path(folder), 1e-9, files=2, row_group_rows=50)
            results = [measure(name, files, 0.5) for name in args.rows.split(",")]
    else:
        files = build_corpus(pathlib.Path(args.corpus), args.gigabytes)
        results = [measure(name, files, args.seconds) for name in args.rows.split(",")]
    print("\n| objective | ours: tokens/s (one process) | tokens per CPU-second | consumer | "
          "v5p host needs at the roofline step | at 100% MFU | cores needed (of 208 vCPUs) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in results:
        consumer, tokens, roofline, compute = CONSUMERS[row["name"]]
        need, need_peak = tokens / roofline / HOSTS, tokens / compute / HOSTS
        print(f"| {row['name']} | {row['tokens/s']:,.0f} | {row['tokens/cpu-s']:,.0f} | {consumer} "
              f"| {need:,.0f} | {need_peak:,.0f} | {need / row['tokens/cpu-s']:.2f} "
              f"({need_peak / row['tokens/cpu-s']:.2f} at 100% MFU) |")


if __name__ == "__main__":
    main()
