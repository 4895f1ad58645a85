"""Input-pipeline throughput per objective, one process, on the embedded corpus.

    .venv/bin/python benchmarks/data_pipeline.py [--examples 2000] [--rows span_corruption,mlm]
        [--streams 1,8 --batches 40]

For each objective: examples/s and tokens/s of finished model batches (the
feature converter's output; tokens = non-padding encoder inputs + decoder
targets), after a warm-up that reads and caches the corpus. Also the packing
fill ratio on whole documents (seqio's greedy packing versus ours), and an
estimate of the host cores needed to feed BERT-base on a TPU v5p host.

``--streams`` times the trainer's input instead: global batches of packed span
corruption assembled from V input streams in this one process (``data_streams``),
for each V given.

When ``seqio`` and ``t5`` (and TensorFlow) are installed, the same run times
seqio + t5's tf.data span corruption with packing on the same documents and
vocabulary (single process: tf.data limited to one thread).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import time

import numpy as np

import t5x_like.data as td
from t5x_like.data import pipeline, tasks

INPUTS, TARGETS = 512, 114  # T5's pretraining lengths
ROWS = {
    # name: (task, task_feature_lengths, feature converter factory)
    "span_corruption": ("embedded_en_span_corruption", {"inputs": INPUTS, "targets": TARGETS},
                        lambda: td.EncDecFeatureConverter(pack=True)),
    "span_corruption_unpacked": ("embedded_en_span_corruption",
                                 {"inputs": INPUTS, "targets": TARGETS},
                                 lambda: td.EncDecFeatureConverter()),
    "mlm": ("embedded_en_mlm", {"inputs": 512}, lambda: td.EncoderFeatureConverter()),
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


def time_stream(iterator, num_examples: int) -> tuple[float, int]:
    """Seconds and non-padding tokens for ``num_examples`` converted examples."""
    start, tokens = time.perf_counter(), 0
    for example in itertools.islice(iterator, num_examples):
        tokens += sum(int(np.count_nonzero(example[k])) for k in TOKEN_FEATURES if k in example)
    return time.perf_counter() - start, tokens


def run_row(name: str, num_examples: int) -> float:
    task, lengths, converter = ROWS[name]
    iterator = iter(td.get_dataset(task, lengths, feature_converter=converter(), seed=0))
    time_stream(iterator, 20)  # warm-up: corpus read, vocabulary tables
    seconds, tokens = time_stream(iterator, num_examples)
    print(f"{name:26s} {num_examples / seconds:9.0f} examples/s {tokens / seconds:11,.0f} tokens/s")
    return tokens / seconds


def streams_row(num_streams: int, num_batches: int, batch_size: int = 64) -> float:
    """Tokens/s of global batches (span corruption, packed) drawn from ``num_streams``
    streams, all run by this process."""
    make_stream = functools.partial(pipeline.build_dataset, "embedded_en_span_corruption",
                                    "train", {"inputs": INPUTS, "targets": TARGETS}, seed=0,
                                    shuffle=True, pack=True)
    batches = td.HostBatchIterator(make_stream, batch_size, num_streams)
    time_stream(batches, 8)  # warm-up: corpus read, vocabulary tables, packing bins filling
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


def seqio_span_corruption(num_examples: int) -> float | None:
    """seqio + t5 tf.data span corruption with packing, same documents and vocabulary."""
    try:
        import functools

        import seqio
        import tensorflow as tf
        from t5.data import preprocessors as t5_preprocessors
    except ImportError:
        print("seqio/t5/tensorflow not installed: seqio comparison skipped (see the issue for the "
              "versions that install together).")
        return None
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    docs = [e["text"] for e in tasks.english_source().get("train")]
    vocab = seqio.SentencePieceVocabulary(tasks.embedded_vocabulary().model_path, extra_ids=100)
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
                           shuffle=False, seed=0,
                           feature_converter=seqio.EncDecFeatureConverter(pack=True))
    iterator = ds.as_numpy_iterator()
    time_stream(iterator, 20)
    seconds, tokens = time_stream(iterator, num_examples)
    print(f"{'seqio span_corruption':26s} {num_examples / seconds:9.0f} examples/s "
          f"{tokens / seconds:11,.0f} tokens/s")
    return tokens / seconds


def v5p_estimate(mlm_tokens_per_second: float) -> None:
    """BERT-base on a v5p host: 4 chips x 459 TFLOP/s bf16 at 50% MFU, 6 x 110M FLOPs/token."""
    host_tokens = 4 * 459e12 * 0.5 / (6 * 110e6)
    print(f"BERT-base on a TPU v5p host needs ~{host_tokens:,.0f} tokens/s (4 chips, 50% MFU); "
          f"at {mlm_tokens_per_second:,.0f} tokens/s per core that is "
          f"~{host_tokens / mlm_tokens_per_second:.0f} cores of this machine.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--streams", help="time the trainer's input for these stream counts, "
                        "e.g. 1,8, instead of the objective rows")
    parser.add_argument("--batches", type=int, default=40, help="global batches of 64 per count")
    args = parser.parse_args()
    if args.streams:
        for count in args.streams.split(","):
            streams_row(int(count), args.batches)
        return
    results = {name: run_row(name, args.examples) for name in args.rows.split(",")}
    seqio_rate = seqio_span_corruption(args.examples)
    if seqio_rate and "span_corruption" in results:
        print(f"span corruption with packing: {results['span_corruption'] / seqio_rate:.2f}x "
              "seqio's tokens/s")
    fill_ratios()
    if "mlm" in results:
        v5p_estimate(results["mlm"])


if __name__ == "__main__":
    main()
