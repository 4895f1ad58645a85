"""Input-pipeline throughput per objective, one process, on the embedded corpus.

    .venv/bin/python benchmarks/data_pipeline.py [--examples 1000] [--rows span_corruption,mlm]
        [--repeats 3] [--no-seqio] [--streams 1,8 --batches 40] [--smoke]

For each objective: examples/s, tokens/s and tokens per CPU second (all threads of
the process) of finished model batches (the feature converter's output; tokens =
non-padding encoder inputs + decoder targets), after a warm-up that reads and caches
the corpus; with ``--repeats`` the fastest run of each row. Also the packing fill
ratio on whole documents (seqio's greedy packing versus ours), and an estimate of
the host cores needed to feed BERT-base on a TPU v5p host.

``--streams`` times the trainer's input instead: global batches of packed span
corruption assembled from V input streams in this one process (``data_streams``),
for each V given.

When ``seqio`` and ``t5`` (and TensorFlow) are installed (benchmarks/requirements-seqio.txt,
a separate venv), the same run compares one epoch of span corruption with packing,
512/114, file order, on both sides: ours, and T5's task (seqio + t5 tf.data) on the
same documents and vocabulary, single process with tf.data on one thread; without them
our side of that comparison still runs and the seqio row says it is not installed.

``--smoke``: every row on a few examples (the epoch row on as many), the fill ratios on
200 documents, and the streams on one batch of each count: a check that the script runs.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import itertools
import time

import numpy as np

import t5x_like.data as td
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.data import pipeline

INPUTS, TARGETS = 512, 114  # T5's pretraining lengths
ROWS = {
    # name: (task, task_feature_lengths, feature converter factory)
    "span_corruption": ("embedded_en_span_corruption", {"inputs": INPUTS, "targets": TARGETS},
                        lambda: td.EncDecFeatureConverter(pack=True)),
    "span_corruption_unpacked": ("embedded_en_span_corruption",
                                 {"inputs": INPUTS, "targets": TARGETS},
                                 lambda: td.EncDecFeatureConverter()),
    "mlm": ("embedded_en_mlm", {"inputs": 512}, lambda: td.EncoderFeatureConverter()),
    "mlm_128": ("embedded_en_mlm", {"inputs": 128}, lambda: td.EncoderFeatureConverter()),
    "mlm_whole_word": ("embedded_en_mlm_whole_word", {"inputs": 512},
                       lambda: td.EncoderFeatureConverter()),
    "mlm_nsp": ("embedded_en_mlm_nsp", {"inputs": 128}, lambda: td.EncoderFeatureConverter()),
    "span_mlm": ("embedded_en_span_mlm", {"inputs": 512}, lambda: td.EncoderFeatureConverter()),
    "lm": ("embedded_en_lm", {"targets": 1024}, lambda: td.DecoderFeatureConverter()),
    "prefix_lm": ("embedded_en_prefix_lm", {"inputs": 512, "targets": 512},
                  lambda: td.DecoderFeatureConverter(prefix_lm=True)),
    "bart": ("embedded_en_bart", {"inputs": 512, "targets": 512},
             lambda: td.EncDecFeatureConverter()),
    "iid_replace_spans": ("embedded_en_iid_replace_spans", {"inputs": 512, "targets": 512},
                          lambda: td.EncDecFeatureConverter()),
    "deshuffle": ("embedded_en_deshuffle", {"inputs": 512, "targets": 512},
                  lambda: td.EncDecFeatureConverter()),
    "multilingual_bytes": ("embedded_multilingual_span_corruption",
                           {"inputs": 1024, "targets": 229},
                           lambda: td.EncDecFeatureConverter(pack=True)),
}
TOKEN_FEATURES = ("encoder_input_tokens", "decoder_target_tokens")


def time_stream(iterator, num_examples: int | None = None,
                num_tokens: int | None = None) -> tuple[float, float, int, int]:
    """Wall seconds, CPU seconds (all threads of the process), non-padding tokens and
    examples for ``num_examples`` converted examples, or until ``num_tokens`` tokens."""
    start, cpu_start, tokens, examples = time.perf_counter(), time.process_time(), 0, 0
    for example in iterator:
        tokens += sum(int(np.count_nonzero(example[k])) for k in TOKEN_FEATURES if k in example)
        examples += 1
        if (num_tokens is not None and tokens >= num_tokens) or examples == num_examples:
            break
    return time.perf_counter() - start, time.process_time() - cpu_start, tokens, examples


def report(name: str, seconds: float, cpu_seconds: float, tokens: int, examples: int) -> dict:
    row = {"name": name, "examples/s": examples / seconds, "tokens/s": tokens / seconds,
           "tokens/cpu-s": tokens / cpu_seconds, "tokens": tokens}
    print(f"{name:26s} {row['examples/s']:9.0f} examples/s {row['tokens/s']:11,.0f} tokens/s "
          f"{row['tokens/cpu-s']:11,.0f} tokens/CPU-s", flush=True)
    return row


def run_row(name: str, num_examples: int, warm_up: int = 20) -> dict:
    task, lengths, converter = ROWS[name]
    iterator = iter(td.get_dataset(task, lengths, feature_converter=converter(), seed=0))
    time_stream(iterator, warm_up)  # warm-up: corpus read, vocabulary tables
    return report(name, *time_stream(iterator, num_examples))


def span_corruption_epoch(num_examples: int | None = None, warm_up: int = 20) -> dict:
    """Ours, for the seqio comparison: one epoch of the training split in file order
    (its first ``num_examples`` examples when given: a smoke run)."""
    task, lengths, converter = ROWS["span_corruption"]
    iterator = iter(td.get_dataset(task, lengths, feature_converter=converter(), seed=0,
                                   shuffle=False, num_epochs=1))
    time_stream(iterator, warm_up)
    return report("span_corruption, epoch", *time_stream(iterator, num_examples))


def streams_row(num_streams: int, num_batches: int, batch_size: int = 64,
                warm_up: int = 8) -> float:
    """Tokens/s of global batches (span corruption, packed) drawn from ``num_streams``
    streams, all run by this process."""
    make_stream = functools.partial(pipeline.build_dataset, "embedded_en_span_corruption",
                                    "train", {"inputs": INPUTS, "targets": TARGETS}, seed=0,
                                    shuffle=True, pack=True)
    batches = td.HostBatchIterator(make_stream, batch_size, num_streams)
    time_stream(batches, warm_up)  # warm-up: corpus read, vocabulary tables, packing bins filling
    start, tokens = time.perf_counter(), 0
    for batch in itertools.islice(batches, num_batches):
        tokens += sum(int(np.count_nonzero(batch[k])) for k in TOKEN_FEATURES)
    seconds = time.perf_counter() - start
    print(f"{num_streams:2d} streams x {batch_size // num_streams:2d} rows  "
          f"{num_batches * batch_size / seconds:7.0f} rows/s {tokens / seconds:11,.0f} tokens/s")
    return tokens / seconds


def fill_ratios(num_docs: int = 4000, length: int = 512) -> None:
    """Whole documents (one example each, cut at ``length``) packed into ``length`` rows."""
    vocab = tasks.embedded_vocabulary()
    docs = [e["text"] for e in tasks.english_source().get("train")[:num_docs * 4:4]]
    examples = [{"targets": np.asarray(ids[:length - 1] + [1], np.int32)}
                for ids in vocab.encode_batch(docs)]
    real = sum(e["targets"].size for e in examples)
    print(f"packing fill ratio, {len(examples)} documents (mean {real / len(examples):.0f} "
          f"tokens) into rows of {length}:")
    for algorithm, bins, label in [("first_fit", 1, "seqio greedy (1 open row)"),
                                   ("first_fit", 64, "first fit, 64 open rows"),
                                   ("best_fit", 64, "best fit, 64 open rows (default)")]:
        start = time.perf_counter()
        rows = td.DecoderFeatureConverter(pack=True, num_packing_bins=bins,
                                          packing_algorithm=algorithm)(examples,
                                                                       {"targets": length})
        seconds = time.perf_counter() - start
        print(f"  {label:34s} fill {real / (len(rows) * length):.3f}  "
              f"({len(rows)} rows, {real / seconds:,.0f} tokens/s)")


def seqio_span_corruption(num_examples: int | None = None, warm_up: int = 20) -> dict | None:
    """seqio + t5 tf.data span corruption with packing, same documents and vocabulary.

    T5's own task definition (c4_v220_span_corruption: rekey, tokenize,
    span_corruption, append_eos_after_trim) on our corpus and SentencePiece model,
    packed by seqio's EncDecFeatureConverter. tf.data runs on a private pool of one
    thread (seqio's maps ask for AUTOTUNE parallelism); the Python thread that reads
    the batches is the process's second thread, so tokens/CPU-s is the per-core figure.
    Like ``span_corruption_epoch``: one epoch of the same documents in the same order,
    so both sides turn the same text into (almost) the same number of tokens.
    """
    try:
        import seqio
        import tensorflow as tf
        from t5.data import preprocessors as t5_preprocessors
    except ImportError:
        print("seqio/t5/tensorflow not installed: seqio comparison skipped (install "
              "benchmarks/requirements-seqio.txt, see docs/benchmarks.md).")
        return None
    try:
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.threading.set_intra_op_parallelism_threads(1)
    except RuntimeError:
        pass  # already set by an earlier repeat (TF is initialised by then)
    docs = [e["text"] for e in tasks.english_source().get("train")]
    vocab = seqio.SentencePieceVocabulary(tasks.embedded_vocabulary().model_path, extra_ids=100)
    assert vocab.vocab_size == tasks.embedded_vocabulary().vocab_size
    source = seqio.FunctionDataSource(
        lambda split, shuffle_files, seed=None: tf.data.Dataset.from_tensor_slices({"text": docs}),
        splits=["train"])
    name = "benchmark_seqio_span_corruption"
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(name, source=source, preprocessors=[
        functools.partial(t5_preprocessors.rekey, key_map={"inputs": None, "targets": "text"}),
        seqio.preprocessors.tokenize, t5_preprocessors.span_corruption,
        seqio.preprocessors.append_eos_after_trim],
        output_features={"inputs": seqio.Feature(vocab, add_eos=True, required=False),
                         "targets": seqio.Feature(vocab, add_eos=True)})
    ds = seqio.get_dataset(name, {"inputs": INPUTS, "targets": TARGETS}, dataset_split="train",
                           shuffle=False, seed=0, num_epochs=1,
                           feature_converter=seqio.EncDecFeatureConverter(pack=True))
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    iterator = ds.with_options(options).as_numpy_iterator()
    time_stream(iterator, warm_up)
    return report("seqio span_corruption, epoch", *time_stream(iterator, num_examples))


# TPU v5p: 459 TFLOP/s bf16 peak per chip, 4 chips and 208 vCPUs per host (ct5p-hightpu-4t).
V5P_PEAK_FLOPS, V5P_CHIPS_PER_HOST, V5P_HOST_VCPUS = 459e12, 4, 208
ASSUMED_MFU = 0.5


def bert_base_train_flops_per_token(seq_len: int, masked_fraction: float = 0.15) -> float:
    """6 x non-embedding parameters, attention scores/values, and the MLM head on masked tokens."""
    layers, d, ff, vocab = 12, 768, 3072, 30522
    dense = layers * (4 * d * d + 2 * d * ff)          # 85M: QKVO and the MLP
    attention = layers * 2 * 2 * seq_len * d             # QK^T and AV, forward, per token
    head = (d * d + d * vocab) * masked_fraction         # transform + tied output layer
    return 6 * (dense + head) + 3 * attention


def v5p_estimate(results: dict) -> None:
    """Host cores to feed BERT-base on one v5p host, from the MLM rows' tokens per CPU second."""
    print(f"BERT-base on a TPU v5p host ({V5P_CHIPS_PER_HOST} chips x {V5P_PEAK_FLOPS / 1e12:.0f} "
          f"TFLOP/s bf16 at an assumed {ASSUMED_MFU:.0%} MFU, {V5P_HOST_VCPUS} vCPUs):")
    for name, seq_len in [("mlm_128", 128), ("mlm_nsp", 128), ("mlm", 512)]:
        if name not in results:
            continue
        flops = bert_base_train_flops_per_token(seq_len)
        needed = V5P_CHIPS_PER_HOST * V5P_PEAK_FLOPS * ASSUMED_MFU / flops
        per_core = results[name]["tokens/cpu-s"]
        print(f"  {name:8s} seq {seq_len}: {flops / 1e6:.0f} MFLOP/token -> {needed:,.0f} tokens/s "
              f"per host; at {per_core:,.0f} tokens/s per core: ~{needed / per_core:.1f} cores "
              f"({needed / per_core / V5P_HOST_VCPUS:.0%} of the host's vCPUs)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--repeats", type=int, default=1,
                        help="time each row this many times and keep the fastest (shared machine)")
    parser.add_argument("--no-seqio", action="store_true",
                        help="skip the one-epoch comparison with seqio + t5")
    parser.add_argument("--streams", help="time the trainer's input for these stream counts, "
                        "e.g. 1,8, instead of the objective rows")
    parser.add_argument("--batches", type=int, default=40, help="global batches of 64 per count")
    parser.add_argument("--smoke", action="store_true",
                        help="a few examples a row: a check that every row runs")
    args = parser.parse_args(argv)
    warm_up, epoch_examples, docs = 20, None, 4000
    if args.smoke:
        args.examples, args.batches, args.repeats = 5, 1, 1
        warm_up, epoch_examples, docs = 2, 5, 200
    if args.streams:
        print("| streams | rows per stream | tokens/s |\n| --- | --- | --- |")
        for count in args.streams.split(","):
            streams_row(int(count), args.batches, warm_up=min(warm_up, 8))
        return
    runs = [(name, functools.partial(run_row, name, args.examples, warm_up))
            for name in args.rows.split(",") if name]
    seqio_installed = all(importlib.util.find_spec(m) for m in ("seqio", "t5", "tensorflow"))
    if not args.no_seqio:
        runs.append(("epoch", functools.partial(span_corruption_epoch, epoch_examples, warm_up)))
        if seqio_installed:
            runs.append(("seqio", functools.partial(seqio_span_corruption, epoch_examples,
                                                    warm_up)))
        else:
            print("seqio/t5/tensorflow not installed: our side of the seqio comparison runs "
                  "alone (install benchmarks/requirements-seqio.txt in a separate venv, see "
                  "docs/benchmarks.md).")
    results = {}
    for _ in range(args.repeats):
        for key, run in runs:
            row = run()
            if row and (key not in results or row["tokens/s"] > results[key]["tokens/s"]):
                results[key] = row
    print(f"\nbest of {args.repeats}: examples/s, tokens/s (wall) and tokens per CPU second "
          "(all threads of the process)")
    print("| objective | tokens | examples/s | tokens/s | tokens/CPU-s |\n| --- | --- | --- | --- | --- |")
    for row in results.values():
        print(f"| {row['name']} | {row['tokens']:,} | {row['examples/s']:,.0f} | {row['tokens/s']:,.0f} | "
              f"{row['tokens/cpu-s']:,.0f} |")
    if "seqio" in results:
        ours, theirs = results["epoch"], results["seqio"]
        print(f"| ratio ours / seqio | | | {ours['tokens/s'] / theirs['tokens/s']:.2f}x | "
              f"{ours['tokens/cpu-s'] / theirs['tokens/cpu-s']:.2f}x |")
    elif not args.no_seqio:
        print("| seqio span_corruption, epoch | not installed | | | |")
    print()
    fill_ratios(docs)
    v5p_estimate(results)


if __name__ == "__main__":
    main()
