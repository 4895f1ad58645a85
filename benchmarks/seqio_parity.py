"""Parity checks of t5x_like's data pipeline against T5 and seqio, on the same inputs.

    /work/seqio-venv/bin/python benchmarks/seqio_parity.py [--examples 2000]

Not a test (the suite must run without TensorFlow): it prints PASS or FAIL per
check, a table of them at the end, and exits 1 if any check fails. Without
``seqio``/``t5`` every check still computes our side (and the checks of our outputs
alone, such as span corruption merging back, still pass or fail); the comparisons say
"not installed" and the run exits 0. Install the comparison environment from
``benchmarks/requirements-seqio.txt``.

``--smoke``: every check on few inputs (a coarser grid, lengths up to 40, 40 chunks, 20
converter examples), a check that the script runs.

Checks, all on identical inputs:

* vocabulary: seqio's SentencePieceVocabulary on our model gives the same ids for
  the corpus, the same size, special ids and sentinel ids.
* ``random_spans_helper`` against ``t5.data.preprocessors.random_spans_helper``
  over a grid of lengths, densities, mean span lengths and extra tokens.
* noise masks: the number of noise tokens and spans for every length and setting
  equals ``t5.data.preprocessors.random_spans_noise_mask``'s.
* span corruption against ``t5.data.preprocessors.span_corruption`` (+ seqio's
  ``append_eos_after_trim``) on the same token sequences: lengths, number of
  spans, sentinel order, merge-back; and, since the random streams differ, the
  span-length statistics over many examples.
* feature converters against seqio's EncDec, LM, PrefixLM and Encoder converters:
  unpacked outputs identical (names, dtypes, values); packed outputs (ours is
  best fit, seqio's greedy) checked for the same invariants, with both fill ratios.
* metrics against ``t5.evaluation.metrics`` on fixed inputs: accuracy,
  f1_score_with_invalid and mean_multiclass_f1 (with -1 predictions),
  matthews_corrcoef (T5's CoLA wrapper), pearson/spearman (ties), sequence accuracy,
  BLEU and SQuAD exactly; ROUGE within 0.5 (T5 reports an unseeded bootstrap median).
* GLUE/SuperGLUE (``t5x_like.builtin_tasks.glue``): each task's metric set and postprocessor
  against ``t5.data.glue_utils``'s, and our inputs/targets text against T5's
  TensorFlow preprocessors (glue, stsb, wsc, record) on the same records.

``--metrics-only`` runs the last two groups only (they need ``t5`` importable).
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import t5x_like.data as td  # noqa: E402
from t5x_like.builtin_tasks import pretraining as tasks  # noqa: E402
from t5x_like.data import preprocessors as pp  # noqa: E402

# seqio's converters return int32 loss weights; ours are float32 so that a
# loss can weight positions fractionally. Values are compared exactly.
ALLOWED_DTYPE_DIFFERENCES = {"decoder_loss_weights": ("float32", "int32"),
                             "encoder_loss_weights": ("float32", "int32")}
# Ours adds BERT's segment (token type) ids; seqio's EncoderFeatureConverter has none.
ALLOWED_EXTRA_FEATURES = {"encoder_token_type_ids"}

RESULTS: list[tuple[str, bool, str]] = []


NOT_INSTALLED = "not installed"


def check(name: str, ok: bool | None, detail: str = "") -> bool | None:
    """Records a check; ``ok`` None: only our side ran (seqio/t5 not installed)."""
    RESULTS.append((name, None if ok is None else bool(ok), detail))
    verdict = NOT_INSTALLED if ok is None else "PASS" if ok else "FAIL"
    print(f"{verdict}  {name}" + (f"  ({detail})" if detail else ""), flush=True)
    return ok


def results_table() -> str:
    """Every check's verdict: PASS, FAIL, or ``not installed`` (ours ran, theirs did not)."""
    lines = ["| check | seqio / t5 | detail |", "| --- | --- | --- |"]
    for name, ok, detail in RESULTS:
        verdict = NOT_INSTALLED if ok is None else "PASS" if ok else "FAIL"
        lines.append(f"| {name} | {verdict} | {detail.replace('|', '/')[:160]} |")
    return "\n".join(lines)


def import_seqio():
    try:
        import seqio
        import tensorflow as tf
        from t5.data import preprocessors as t5p
    except ImportError as e:
        return None, None, None, e
    tf.config.set_visible_devices([], "GPU")
    return seqio, tf, t5p, None


# -- vocabulary -----------------------------------------------------------------------
def check_vocabulary(seqio, tf, docs):
    ours = tasks.embedded_vocabulary()
    if seqio is None:
        text = " ".join(f"<extra_id_{i}>" for i in range(ours.extra_ids))
        check("vocabulary (ours): the text <extra_id_k> encodes to vocab_size - 1 - k",
              ours.encode(text) == [ours.sentinel_id(i) for i in range(ours.extra_ids)])
        encoded = ours.encode_batch(docs)
        decoded = [ours.decode(ids) for ids in encoded]
        check("vocabulary: encode and decode == seqio's", None,
              f"ours encoded and decoded {len(docs)} documents "
              f"({sum(map(len, encoded))} ids, {sum(map(len, decoded))} characters)")
        return
    theirs = seqio.SentencePieceVocabulary(ours.model_path, extra_ids=ours.extra_ids)
    check("vocabulary: size, pad/eos/unk ids",
          (theirs.vocab_size, theirs.pad_id, theirs.eos_id, theirs.unk_id)
          == (ours.vocab_size, ours.pad_id, ours.eos_id, ours.unk_id),
          f"size {ours.vocab_size} vs {theirs.vocab_size}")
    text = " ".join(f"<extra_id_{i}>" for i in range(ours.extra_ids))
    sentinel_ids = theirs.encode(text)
    check("vocabulary: the text <extra_id_k> encodes to vocab_size - 1 - k in both",
          sentinel_ids == ours.encode(text) == [ours.sentinel_id(i) for i in range(ours.extra_ids)],
          f"seqio <extra_id_0> = {sentinel_ids[0]}, <extra_id_99> = {sentinel_ids[-1]}")
    rng = np.random.default_rng(0)
    id_lists = [rng.integers(0, ours.vocab_size, size=int(n)).tolist()
                for n in rng.integers(1, 60, size=500)]
    id_lists += [ours.encode(f"{d} <extra_id_{i % 100}> {d[:20]}") for i, d in enumerate(docs[:500])]
    decode_diff = [ids for ids in id_lists if ours.decode(ids) != theirs.decode(ids)]
    check("vocabulary: decode == seqio's (random ids incl. sentinels, pad, EOS; text + sentinels)",
          not decode_diff, f"{len(id_lists)} id lists, {len(decode_diff)} differ"
          + (f", e.g. {decode_diff[0][:12]}" if decode_diff else ""))
    ds = tf.data.Dataset.from_tensor_slices(docs).map(theirs.encode_tf)
    mismatches = sum(list(a) != b for a, b in zip(ds.as_numpy_iterator(), ours.encode_batch(docs), strict=False))
    check("vocabulary: seqio's encode_tf == ours on the corpus", mismatches == 0,
          f"{len(docs)} documents, {mismatches} differ")


# -- T5's length arithmetic -----------------------------------------------------------
def check_random_spans_helper(t5p, step: int = 5):
    bad, total = [], 0
    for inputs_length in list(range(64, 1025, step)) + [512, 626, 1024]:
        for density in (0.15, 0.3, 0.5):
            for mean_span in (1.0, 3.0, 8.0):
                for extra_in, extra_tg in ((1, 1), (0, 0), (1, 0), (2, 1)):
                    total += 1
                    got = pp.random_spans_helper(inputs_length, density, mean_span,
                                                 extra_in, extra_tg)
                    if t5p is None:
                        continue
                    want = t5p.random_spans_helper(
                        inputs_length=inputs_length, noise_density=density,
                        mean_noise_span_length=mean_span, extra_tokens_per_span_inputs=extra_in,
                        extra_tokens_per_span_targets=extra_tg)
                    if tuple(got) != tuple(want):
                        bad.append((inputs_length, density, mean_span, extra_in, extra_tg, got,
                                    want))
    if t5p is None:
        check("random_spans_helper == t5's (tokens_length, targets_length)", None,
              f"ours computed {total} settings")
        return
    check("random_spans_helper == t5's (tokens_length, targets_length)", not bad,
          f"{total} settings, {len(bad)} differ" + (f", first {bad[:3]}" if bad else ""))


def span_counts(mask: np.ndarray) -> tuple[int, int, bool]:
    starts = mask & ~np.concatenate([[False], mask[:-1]])
    return int(mask.sum()), int(starts.sum()), bool(mask[0]) if mask.size else False


def check_noise_mask_counts(tf, t5p, max_length: int):
    bad, t5_errors, ours_errors, total = [], [], [], 0
    for density in (0.15, 0.3, 0.5):
        for mean_span in (1.0, 3.0, 8.0):
            fn = None if t5p is None else tf.function(functools.partial(
                t5p.random_spans_noise_mask, noise_density=density,
                mean_noise_span_length=mean_span))
            for length in range(1, max_length + 1):
                total += 1
                want = None
                if fn is not None:
                    seeds = tf.constant([[length, 1], [2, length]], tf.int32)
                    try:
                        want = span_counts(fn(tf.constant(length), seeds=seeds).numpy())
                    except tf.errors.InvalidArgumentError:
                        want = "error"
                try:
                    got = span_counts(pp.random_spans_noise_mask(
                        length, density, mean_span, np.random.default_rng(length)))
                except (ValueError, IndexError):
                    got = "error"
                if want == "error":
                    t5_errors.append((length, density, mean_span, got))
                if got == "error":
                    ours_errors.append((length, density, mean_span, want))
                if want is not None and want != got and "error" not in (want, got):
                    bad.append((length, density, mean_span, got, want))
    if t5p is None:
        check("noise mask: (noise tokens, spans, starts with noise) == t5's for every length",
              None, f"ours computed {total} settings, failing on {len(ours_errors)}")
        return
    detail = (f"{total} (length, density, mean span) settings, {len(bad)} differ"
              + (f"; first (length, density, span, ours, t5): {bad[:4]}" if bad else ""))
    check("noise mask: (noise tokens, spans, starts with noise) == t5's for every length",
          not bad, detail)
    check("noise mask: ours never fails where t5 works", not [e for e in ours_errors
                                                               if e[3] != "error"],
          f"t5 fails on {len(t5_errors)} degenerate settings (e.g. {t5_errors[:2]}); "
          f"ours fails on {len(ours_errors)}")


# -- span corruption end to end --------------------------------------------------------
def corpus_chunks(docs, vocab, n_full: int, n_short: int, seed: int = 0):
    """``n_full`` chunks of 568 tokens (T5's raw length for 512/114) and ``n_short`` shorter."""
    tokens_length, _ = pp.random_spans_helper(512, 0.15, 3.0)
    stream = np.concatenate([np.asarray(ids, np.int32) for ids in vocab.encode_batch(docs)])
    rng = np.random.default_rng(seed)
    full = [stream[i * tokens_length:(i + 1) * tokens_length] for i in range(n_full)]
    offset = n_full * tokens_length
    short = []
    for n in rng.integers(1, tokens_length, size=n_short):
        short.append(stream[offset:offset + n])
        offset += n
    return full + short


def sentinel_runs(tokens, first_sentinel):
    return [int(t) for t in tokens if t > first_sentinel - 100]


def merge_back(inputs, targets, first_sentinel):
    inputs, targets = list(inputs[:-1]), list(targets[:-1])
    spans, current = {}, None
    for token in targets:
        if token > first_sentinel - 100:
            current = token
            spans[current] = []
        else:
            spans[current].append(token)
    out = []
    for token in inputs:
        out.extend(spans.get(token, []) if token > first_sentinel - 100 else [token])
    return out


def run_lengths(inputs, targets, first_sentinel):
    """Noise-span lengths (from targets) and non-noise span lengths (from inputs)."""
    noise, current = [], 0
    for token in targets[:-1]:
        if token > first_sentinel - 100:
            if current:
                noise.append(current)
            current = 0
        else:
            current += 1
    noise.append(current)
    nonnoise, current = [], 0
    for token in inputs[:-1]:
        if token > first_sentinel - 100:
            nonnoise.append(current)
            current = 0
        else:
            current += 1
    if current:
        nonnoise.append(current)
    return noise, nonnoise


def t5_span_corruption(seqio, tf, t5p, chunks, vocab):
    features = {"inputs": seqio.Feature(vocab, add_eos=True, required=False),
                "targets": seqio.Feature(vocab, add_eos=True)}
    lengths = {"inputs": 512, "targets": 114}
    ds = tf.data.Dataset.from_generator(
        lambda: ({"targets": c} for c in chunks),
        output_signature={"targets": tf.TensorSpec([None], tf.int32)})
    with seqio.utils.map_seed_manager(0):
        ds = t5p.span_corruption(ds, sequence_length=lengths, output_features=features,
                                 merge_examples_to_reduce_padding=False)
        ds = seqio.preprocessors.append_eos_after_trim(ds, sequence_length=lengths,
                                                       output_features=features)
    return [(e["inputs"], e["targets"]) for e in ds.as_numpy_iterator()]


def histogram(values, top: int):
    counts = collections.Counter(min(v, top) for v in values)
    total = sum(counts.values())
    return np.array([counts.get(k, 0) / total for k in range(1, top + 1)])


def check_span_corruption(seqio, tf, t5p, docs, num_examples: int):
    ours_vocab = tasks.embedded_vocabulary()
    vocab = (seqio.SentencePieceVocabulary(ours_vocab.model_path, extra_ids=ours_vocab.extra_ids)
             if seqio is not None else None)
    first_sentinel = ours_vocab.vocab_size - 1
    chunks = corpus_chunks(docs, ours_vocab, num_examples, num_examples // 4)
    theirs = t5_span_corruption(seqio, tf, t5p, chunks, vocab) if seqio is not None else None
    ours = []
    for i, chunk in enumerate(chunks):
        out = pp.span_corruption(chunk, np.random.default_rng(i), vocab_size=ours_vocab.vocab_size,
                                 eos_id=ours_vocab.eos_id)
        ours.append((out["inputs"], out["targets"]))
    if theirs is None:
        span_corruption_ours_only(ours, chunks, first_sentinel, num_examples)
        return
    check("span corruption: one output per input sequence", len(theirs) == len(ours) == len(chunks),
          f"{len(chunks)} sequences ({num_examples} of 568 tokens, the rest 1-567)")
    n = min(len(theirs), len(ours))
    length_diff = [i for i in range(n) if (len(ours[i][0]), len(ours[i][1]))
                   != (len(theirs[i][0]), len(theirs[i][1]))]
    full_lengths = {(len(a), len(b)) for a, b in theirs[:num_examples]}
    check("span corruption: input and target lengths == t5's, example by example",
          not length_diff, f"568-token chunks give {sorted(full_lengths)} in t5; "
          f"{len(length_diff)} of {n} differ")
    spans_diff = [i for i in range(n) if len(sentinel_runs(ours[i][0], first_sentinel))
                  != len(sentinel_runs(theirs[i][0], first_sentinel))]
    check("span corruption: number of noise spans == t5's, example by example", not spans_diff,
          f"{len(spans_diff)} of {n} differ")

    for label, outputs in (("t5", theirs), ("ours", ours)):
        check_span_corruption_outputs(label, outputs, chunks, first_sentinel)

    stats = {}
    for label, outputs in (("t5", theirs[:num_examples]), ("ours", ours[:num_examples])):
        noise, nonnoise, noise_tokens, total = [], [], 0, 0
        for a, b in outputs:
            ns, nn = run_lengths(a, b, first_sentinel)
            noise += ns
            nonnoise += nn
            noise_tokens += sum(ns)
            total += sum(ns) + sum(nn)
        stats[label] = {"noise_fraction": noise_tokens / total,
                        "mean_noise_span": float(np.mean(noise)),
                        "mean_nonnoise_span": float(np.mean(nonnoise)),
                        "noise_hist": histogram(noise, 10), "nonnoise_hist": histogram(nonnoise, 40)}
    t, o = stats["t5"], stats["ours"]
    check("span corruption: noise fraction and mean span lengths == t5's (568-token chunks)",
          all(abs(t[k] - o[k]) < 1e-9 for k in ("noise_fraction", "mean_noise_span",
                                                 "mean_nonnoise_span")),
          f"noise fraction {o['noise_fraction']:.4f} vs {t['noise_fraction']:.4f}, mean noise "
          f"span {o['mean_noise_span']:.3f} vs {t['mean_noise_span']:.3f}, mean non-noise span "
          f"{o['mean_nonnoise_span']:.3f} vs {t['mean_nonnoise_span']:.3f}")
    tv_noise = 0.5 * np.abs(t["noise_hist"] - o["noise_hist"]).sum()
    tv_nonnoise = 0.5 * np.abs(t["nonnoise_hist"] - o["nonnoise_hist"]).sum()
    check("span corruption: span-length distributions close to t5's (total variation < 0.03)",
          tv_noise < 0.03 and tv_nonnoise < 0.03,
          f"noise spans 1..10+: TV {tv_noise:.4f}; non-noise spans 1..40+: TV {tv_nonnoise:.4f}; "
          f"P(noise span = 1,2,3) ours {np.round(o['noise_hist'][:3], 3).tolist()} t5 "
          f"{np.round(t['noise_hist'][:3], 3).tolist()}")


def check_span_corruption_outputs(label: str, outputs, chunks, first_sentinel: int) -> None:
    """What one side's span corruption must hold alone: sentinel order, EOS, merge-back."""
    def sentinel_order_ok(inputs, targets):
        s_in, s_tg = sentinel_runs(inputs, first_sentinel), sentinel_runs(targets, first_sentinel)
        expected = list(range(first_sentinel, first_sentinel - len(s_in), -1))
        return s_in == s_tg == expected and targets[0] == first_sentinel

    check(f"span corruption ({label}): sentinels <extra_id_0>={first_sentinel} descending, "
          "same order in inputs and targets, targets open with <extra_id_0>",
          all(sentinel_order_ok(a, b) for a, b in outputs))
    check(f"span corruption ({label}): both end in EOS, inputs start with a non-noise token, "
          "merge back to the original",
          all(a[-1] == 1 and b[-1] == 1 and a[0] <= first_sentinel - 100
              and merge_back(a, b, first_sentinel) == chunk.tolist()
              for (a, b), chunk in zip(outputs, chunks, strict=False)))


def span_corruption_ours_only(ours, chunks, first_sentinel: int, num_examples: int) -> None:
    """Without t5: our outputs' own checks, and our statistics where t5's would be compared."""
    check_span_corruption_outputs("ours", ours, chunks, first_sentinel)
    noise, total = 0, 0
    for a, b in ours[:num_examples]:
        spans, kept = run_lengths(a, b, first_sentinel)
        noise += sum(spans)
        total += sum(spans) + sum(kept)
    check("span corruption: lengths, spans and span-length statistics == t5's", None,
          f"ours on {len(chunks)} sequences, noise fraction {noise / max(total, 1):.4f}")


# -- feature converters --------------------------------------------------------------
def random_examples(rng, n, lengths, keys, mask_id=None):
    examples = []
    for _ in range(n):
        example = {}
        for key in keys:
            size = int(rng.integers(1, lengths[key] + 1))
            tokens = rng.integers(4, 8000, size=size).astype(np.int32)
            tokens[-1] = 1
            example[key] = tokens
        if mask_id is not None:  # BERT: inputs are targets with some positions masked
            example["targets"] = example["inputs"].copy()
            example["targets"][rng.random(example["inputs"].size) < 0.3] = 5
            masked = rng.random(example["inputs"].size) < 0.15
            example["inputs"] = np.where(masked, mask_id, example["targets"]).astype(np.int32)
        examples.append(example)
    return examples


def seqio_convert(tf, converter, examples, lengths):
    keys = list(examples[0])
    ds = tf.data.Dataset.from_generator(
        lambda: iter(examples),
        output_signature={k: tf.TensorSpec([None], tf.int32) for k in keys})
    return list(converter(ds, lengths).as_numpy_iterator())


def compare_rows(ours, theirs):
    """Names, dtypes and values; returns a list of problems."""
    problems = []
    if len(ours) != len(theirs):
        return [f"{len(ours)} rows vs {len(theirs)}"]
    names_ours, names_theirs = set(ours[0]), set(theirs[0])
    if names_theirs - names_ours:
        problems.append(f"missing {sorted(names_theirs - names_ours)}")
    if names_ours - names_theirs - ALLOWED_EXTRA_FEATURES:
        problems.append(f"extra {sorted(names_ours - names_theirs - ALLOWED_EXTRA_FEATURES)}")
    for name in sorted(names_ours & names_theirs):
        dtypes = (str(ours[0][name].dtype), str(theirs[0][name].dtype))
        if dtypes[0] != dtypes[1] and ALLOWED_DTYPE_DIFFERENCES.get(name) != dtypes:
            problems.append(f"{name} dtype {dtypes[0]} vs {dtypes[1]}")
        bad = sum(not np.array_equal(np.asarray(a[name], np.float64),
                                     np.asarray(b[name], np.float64))
                  for a, b in zip(ours, theirs, strict=False))
        if bad:
            problems.append(f"{name} differs in {bad} rows")
    return problems


def unpacked_cases(seqio, rng, mask_id):
    """The converter pairs; seqio's side None when seqio is not installed."""
    theirs = (lambda name, **kw: getattr(seqio, name)(pack=False, **kw)) if seqio else (
        lambda name, **kw: None)
    return [
        ("EncDecFeatureConverter", td.EncDecFeatureConverter(),
         theirs("EncDecFeatureConverter"), {"inputs": 40, "targets": 12},
         ["inputs", "targets"], None),
        ("LM (DecoderFeatureConverter / LMFeatureConverter)", td.DecoderFeatureConverter(),
         theirs("LMFeatureConverter"), {"targets": 48}, ["targets"], None),
        ("prefix LM (DecoderFeatureConverter(prefix_lm=True) / PrefixLMFeatureConverter)",
         td.DecoderFeatureConverter(prefix_lm=True), theirs("PrefixLMFeatureConverter"),
         {"inputs": 24, "targets": 20}, ["inputs", "targets"], None),
        ("prefix LM, loss on inputs too",
         td.DecoderFeatureConverter(prefix_lm=True, loss_on_targets_only=False),
         theirs("PrefixLMFeatureConverter", loss_on_targets_only=False),
         {"inputs": 24, "targets": 20}, ["inputs", "targets"], None),
        ("EncoderFeatureConverter (mask_id rule)", td.EncoderFeatureConverter(mask_id=mask_id),
         theirs("EncoderFeatureConverter", mask_id=mask_id),
         {"inputs": 40, "targets": 40}, ["inputs"], mask_id),
    ]


def check_unpacked_converters(seqio, tf, num_examples):
    rng = np.random.default_rng(0)
    mask_id = 7
    for label, ours_conv, seqio_conv, lengths, keys, mask in unpacked_cases(seqio, rng, mask_id):
        examples = random_examples(rng, num_examples, lengths, keys, mask)
        ours = [ours_conv(e, lengths) for e in examples]
        if seqio_conv is None:
            check(f"unpacked {label}: same names, dtypes, values", None,
                  f"ours converted {len(examples)} examples into {len(ours)} rows of "
                  f"{', '.join(sorted(ours[0]))}")
            continue
        theirs = seqio_convert(tf, seqio_conv, examples, lengths)
        problems = compare_rows(ours, theirs)
        check(f"unpacked {label}: same names, dtypes, values", not problems,
              "; ".join(problems) or f"{len(examples)} examples; allowed: loss weights float32 vs "
              "int32" + (", extra encoder_token_type_ids" if "Encoder" in label else ""))


def segments_of(row, token_key, segment_key):
    out = {}
    for seg in np.unique(row[segment_key]):
        if seg:
            out[int(seg)] = row[token_key][row[segment_key] == seg]
    return out


def packed_invariants(rows, examples, kind, lengths, tf_shift):
    """Problems with ``rows`` (one side's packed output) for the examples packed into them."""
    problems = []
    expected = collections.Counter()
    for e in examples:
        if kind == "encdec":
            expected[(tuple(e["inputs"][:lengths["inputs"]]),
                      tuple(e["targets"][:lengths["targets"]]))] += 1
        elif kind == "lm":
            expected[tuple(e["targets"][:lengths["targets"]])] += 1
        elif kind == "prefix_lm":
            total = lengths["inputs"] + lengths["targets"]
            expected[tuple(np.concatenate([e["inputs"], e["targets"]])[:total])] += 1
        else:
            expected[tuple(e["inputs"][:lengths["inputs"]])] += 1
    found = collections.Counter()
    prefix = "encoder" if kind == "encoder" else "decoder"
    for row in rows:
        if kind == "encdec":
            enc = segments_of(row, "encoder_input_tokens", "encoder_segment_ids")
            dec = segments_of(row, "decoder_target_tokens", "decoder_segment_ids")
            if set(enc) != set(dec):
                problems.append("encoder and decoder segments differ in a row")
            for seg in enc:
                found[(tuple(enc[seg]), tuple(dec.get(seg, ())))] += 1
        else:
            key = "encoder_input_tokens" if kind == "encoder" else "decoder_target_tokens"
            for tokens in segments_of(row, key, f"{prefix}_segment_ids").values():
                found[tuple(tokens)] += 1
        for side in (("encoder", "decoder") if kind == "encdec" else (prefix,)):
            seg, pos = row[f"{side}_segment_ids"], row[f"{side}_positions"]
            ids = [s for s in np.unique(seg) if s]
            if ids != list(range(1, len(ids) + 1)):
                problems.append(f"{side} segment ids are not 1..n")
            occupied = np.flatnonzero(seg)
            if np.any(pos[seg == 0]) or not np.array_equal(occupied, np.arange(occupied.size)):
                problems.append(f"{side} padding is not at the end or has positions")
            for s in ids:
                if not np.array_equal(pos[seg == s], np.arange(int((seg == s).sum()))):
                    problems.append(f"{side} positions do not restart at 0 in segment {s}")
        if kind != "encoder":
            targets, seg = row["decoder_target_tokens"], row["decoder_segment_ids"]
            want = row["decoder_input_tokens"] if tf_shift is None else tf_shift(targets, seg)
            if not np.array_equal(row["decoder_input_tokens"], want):
                problems.append("decoder_input_tokens != seqio.utils.make_autoregressive_inputs")
        if kind == "prefix_lm":
            # Per segment: causal attention over the inputs + 1, loss on the targets only.
            widths = {}
            for e in examples:
                total = lengths["inputs"] + lengths["targets"]
                widths[tuple(np.concatenate([e["inputs"], e["targets"]])[:total])] = e["inputs"].size
            seg, pos = row["decoder_segment_ids"], row["decoder_positions"]
            for s, tokens in segments_of(row, "decoder_target_tokens", "decoder_segment_ids").items():
                w = widths[tuple(tokens)]
                p = pos[seg == s]
                if not (np.array_equal(row["decoder_causal_attention"][seg == s], p < w + 1)
                        and np.array_equal(row["decoder_loss_weights"][seg == s], p >= w)):
                    problems.append("prefix LM causal attention / loss weights wrong in a segment")
            if np.any(row["decoder_causal_attention"][seg == 0]) or np.any(
                    row["decoder_loss_weights"][seg == 0]):
                problems.append("prefix LM padding has attention or loss")
        elif kind == "encoder":
            weights = row["encoder_loss_weights"]
            if not np.array_equal(weights, (row["encoder_input_tokens"] == 7)):
                problems.append("encoder loss weights != (inputs == mask_id)")
        else:
            if not np.array_equal(row["decoder_loss_weights"], row["decoder_target_tokens"] != 0):
                problems.append("decoder loss weights != non-padding")
    if found != expected:
        problems.append(f"segments are not the examples ({sum(found.values())} found, "
                        f"{sum(expected.values())} expected)")
    return sorted(set(problems))


def fill(rows, key, segment_key):
    return sum(int((r[segment_key] > 0).sum()) for r in rows) / sum(r[key].size for r in rows)


def check_packed_converters(seqio, tf, num_examples):
    rng = np.random.default_rng(1)
    if seqio is None:  # our rows' invariants alone (the shifted inputs are compared to seqio's)
        packed_converters_ours_only(rng, num_examples)
        return

    @functools.cache
    def shift_fn():
        return tf.function(lambda t, s: seqio.utils.make_autoregressive_inputs(t, sequence_id=s))

    def tf_shift(targets, segments):
        return shift_fn()(tf.constant(targets), tf.constant(segments)).numpy()

    cases = [
        ("EncDecFeatureConverter", "encdec", td.EncDecFeatureConverter(pack=True),
         seqio.EncDecFeatureConverter(pack=True), {"inputs": 64, "targets": 32},
         ["inputs", "targets"], None, "decoder_target_tokens", "decoder_segment_ids"),
        ("LM", "lm", td.DecoderFeatureConverter(pack=True), seqio.LMFeatureConverter(pack=True),
         {"targets": 64}, ["targets"], None, "decoder_target_tokens", "decoder_segment_ids"),
        ("prefix LM", "prefix_lm", td.DecoderFeatureConverter(pack=True, prefix_lm=True),
         seqio.PrefixLMFeatureConverter(pack=True), {"inputs": 24, "targets": 24},
         ["inputs", "targets"], None, "decoder_target_tokens", "decoder_segment_ids"),
        ("EncoderFeatureConverter", "encoder", td.EncoderFeatureConverter(pack=True, mask_id=7),
         seqio.EncoderFeatureConverter(mask_id=7, pack=True), {"inputs": 64, "targets": 64},
         ["inputs"], 7, "encoder_input_tokens", "encoder_segment_ids"),
    ]
    for label, kind, ours_conv, seqio_conv, lengths, keys, mask, key, seg_key in cases:
        gen_lengths = dict(lengths)
        if kind == "encdec":  # short examples, so that several share a row
            gen_lengths = {"inputs": 30, "targets": 14}
        examples = random_examples(rng, num_examples, gen_lengths, keys, mask)
        ours = ours_conv(examples, lengths)
        theirs = seqio_convert(tf, seqio_conv, examples, lengths)
        problems = {"ours": packed_invariants(ours, examples, kind, lengths, tf_shift),
                    "seqio": packed_invariants(theirs, examples, kind, lengths, tf_shift)}
        names = (set(ours[0]) - ALLOWED_EXTRA_FEATURES) == set(theirs[0])
        dtypes = [n for n in set(ours[0]) & set(theirs[0])
                  if str(ours[0][n].dtype) != str(theirs[0][n].dtype)
                  and ALLOWED_DTYPE_DIFFERENCES.get(n) != (str(ours[0][n].dtype),
                                                           str(theirs[0][n].dtype))]
        detail = (f"{num_examples} examples: ours {len(ours)} rows, fill "
                  f"{fill(ours, key, seg_key):.3f} (best fit, 64 rows); seqio {len(theirs)} rows, "
                  f"fill {fill(theirs, key, seg_key):.3f} (greedy)")
        if problems["ours"] or problems["seqio"] or not names or dtypes:
            detail += f"; problems: {problems}, names equal {names}, dtype differences {dtypes}"
        check(f"packed {label}: same segments, ids/positions, shifted decoder inputs, weights, "
              "names and dtypes", not (problems["ours"] or problems["seqio"]) and names
              and not dtypes, detail)


def packed_converters_ours_only(rng, num_examples: int) -> None:
    """Without seqio: our packed rows checked for the same invariants, alone."""
    cases = [("EncDecFeatureConverter", "encdec", td.EncDecFeatureConverter(pack=True),
              {"inputs": 64, "targets": 32}, ["inputs", "targets"], None,
              "decoder_target_tokens", "decoder_segment_ids"),
             ("LM", "lm", td.DecoderFeatureConverter(pack=True), {"targets": 64}, ["targets"],
              None, "decoder_target_tokens", "decoder_segment_ids"),
             ("prefix LM", "prefix_lm", td.DecoderFeatureConverter(pack=True, prefix_lm=True),
              {"inputs": 24, "targets": 24}, ["inputs", "targets"], None,
              "decoder_target_tokens", "decoder_segment_ids"),
             ("EncoderFeatureConverter", "encoder",
              td.EncoderFeatureConverter(pack=True, mask_id=7), {"inputs": 64, "targets": 64},
              ["inputs"], 7, "encoder_input_tokens", "encoder_segment_ids")]
    for label, kind, ours_conv, lengths, keys, mask, key, seg_key in cases:
        gen_lengths = {"inputs": 30, "targets": 14} if kind == "encdec" else dict(lengths)
        examples = random_examples(rng, num_examples, gen_lengths, keys, mask)
        ours = ours_conv(examples, lengths)
        problems = packed_invariants(ours, examples, kind, lengths, None)
        check(f"packed {label} (ours): segments, ids/positions, weights", not problems,
              f"{num_examples} examples: {len(ours)} rows, fill {fill(ours, key, seg_key):.3f}"
              + (f"; problems: {problems}" if problems else ""))
        check(f"packed {label}: shifted decoder inputs, names and dtypes == seqio's", None,
              "seqio's make_autoregressive_inputs and converter not run")


# -- metrics and GLUE formats against t5.evaluation.metrics / t5.data --------------------
def import_t5_metrics():
    """``t5.evaluation.metrics`` (importing it imports ``t5.data``: seqio, TensorFlow)."""
    try:
        from t5.evaluation import metrics as t5_metrics
    except ImportError as e:
        return None, e
    return t5_metrics, None


def same_scores(ours: dict, theirs: dict, tolerance: float = 1e-6) -> tuple[bool, str]:
    """Same keys and values within ``tolerance`` (absolute, on the 0-100 scale)."""
    if set(ours) != set(theirs):
        return False, f"keys {sorted(ours)} vs t5 {sorted(theirs)}"
    worst = max((abs(float(ours[k]) - float(theirs[k])) for k in ours), default=0.0)
    shown = ", ".join(f"{k} {float(ours[k]):.4f} vs {float(theirs[k]):.4f}" for k in sorted(ours))
    return worst <= tolerance, shown


def metric_inputs(seed: int = 0) -> dict:
    """Fixed inputs for every metric: labels with invalid (-1) predictions, scores with
    ties, and text pairs from the embedded corpus with words dropped and swapped."""
    rng = np.random.default_rng(seed)
    binary = rng.integers(0, 2, 300).tolist()
    classes = rng.integers(0, 3, 300).tolist()

    def noisy(labels, high):
        return [t if rng.random() < 0.7 else int(rng.integers(-1, high)) for t in labels]
    scores = np.round(rng.uniform(0, 5, 200) * 5) / 5
    docs = [d for d in tasks.embedded_en_documents("validation") if len(d.split()) >= 8][:150]
    hypotheses = []
    for doc in docs:
        words = [w for w in doc.split() if rng.random() > 0.2]
        if len(words) > 3 and rng.random() < 0.5:
            i = int(rng.integers(0, len(words) - 1))
            words[i], words[i + 1] = words[i + 1], words[i]
        hypotheses.append(" ".join(words) or "empty")
    squad_targets = [["The Eiffel Tower", "Eiffel Tower"], ["Paris"], ["New York City"],
                     ["1,000 people"], ["red"], ["Barack Obama", "Obama"], ["the cat's hat"]]
    squad_predictions = ["eiffel tower", "Paris, France.", "york", "1000 people", "blue",
                         "obama", "a cat hat"]
    return {"binary": (binary, noisy(binary, 2)), "classes": (classes, noisy(classes, 3)),
            "scores": (scores.tolist(), (scores + rng.normal(0, 0.7, scores.size)).tolist()),
            "text": (docs, hypotheses), "squad": (squad_targets, squad_predictions)}


class _Absent:
    """A missing module's stand-in: every attribute None (its side is not run)."""

    def __getattr__(self, name):
        return None


def check_metrics(t5_metrics):
    from t5x_like import metrics
    inputs = metric_inputs()
    binary, classes, scores = inputs["binary"], inputs["classes"], inputs["scores"]
    docs, hypotheses = inputs["text"]
    t5 = t5_metrics or _Absent()
    t5_mcc = (t5_metrics.sklearn_metrics_wrapper("matthews_corrcoef",
                                                 metric_post_process_fn=lambda x: 100 * x)
              if t5_metrics else None)
    cases = [
        ("accuracy", metrics.accuracy, t5.accuracy, classes),
        ("accuracy on strings", metrics.accuracy, t5.accuracy,
         ([str(t) for t in classes[0]], [str(p) for p in classes[1]])),
        ("f1_score_with_invalid (-1 predictions)", metrics.f1_score_with_invalid,
         t5.f1_score_with_invalid, binary),
        ("mean_multiclass_f1(3) (-1 predictions)", metrics.mean_multiclass_f1(3),
         t5_metrics.mean_multiclass_f1(num_classes=3) if t5_metrics else None, classes),
        ("matthews_corrcoef (T5's CoLA metric)", metrics.matthews_corrcoef, t5_mcc, classes),
        ("pearson_corrcoef", metrics.pearson_corrcoef, t5.pearson_corrcoef, scores),
        ("spearman_corrcoef (ties)", metrics.spearman_corrcoef, t5.spearman_corrcoef,
         scores),
        ("sequence_accuracy", metrics.sequence_accuracy, t5.sequence_accuracy,
         (docs, [d if i % 3 else h for i, (d, h) in enumerate(zip(docs, hypotheses, strict=False))])),
        ("bleu (intl, one reference)", metrics.bleu, t5.bleu, (docs, hypotheses)),
        ("squad (EM and F1, max over answers)", metrics.squad, t5.squad,
         inputs["squad"]),
    ]
    for name, ours_fn, t5_fn, (targets, predictions) in cases:
        ours = ours_fn(list(targets), list(predictions))
        if t5_fn is None:
            check(f"metrics: {name} == t5's", None,
                  "ours: " + ", ".join(f"{k} {float(v):.4f}" for k, v in sorted(ours.items())))
            continue
        ok, detail = same_scores(ours, t5_fn(list(targets), list(predictions)))
        check(f"metrics: {name} == t5's", ok, detail)
    # T5's rouge is the median of 1000 unseeded bootstrap means; ours is the mean itself.
    np.random.seed(0)
    if t5_metrics is None:
        ours = metrics.rouge(docs, hypotheses)
        check("metrics: rouge1/rouge2/rougeLsum == t5's (within its bootstrap noise, 0.5)", None,
              "ours: " + ", ".join(f"{k} {float(v):.4f}" for k, v in sorted(ours.items())))
        return
    ok, detail = same_scores(metrics.rouge(docs, hypotheses), t5_metrics.rouge(docs, hypotheses),
                             tolerance=0.5)
    check("metrics: rouge1/rouge2/rougeLsum == t5's (within its bootstrap noise, 0.5)", ok,
          f"{len(docs)} pairs: {detail}")


def glue_metric_inputs(task_name: str, rng):
    """(targets, predictions) for a task's metrics, as its postprocessors produce them."""
    from t5x_like.builtin_tasks import glue
    b = glue.BENCHMARKS[task_name]
    n = 120
    if b.short_name == "stsb":
        targets = np.round(rng.uniform(0, 5, n) * 5) / 5
        predictions = np.where(rng.random(n) < 0.05, -1.0,
                               np.clip(np.round((targets + rng.normal(0, 0.8, n)) * 5) / 5, 0, 5))
        return targets.tolist(), predictions.tolist()
    if b.config == "record":
        targets, predictions = [], []
        for query in range(40):
            answers = [f"entity {query}", f"the entity {query}"][:int(rng.integers(1, 3))]
            predicted = [f"entity {query}", f"entity {query + 1}", "entity"][int(rng.integers(3))]
            for _ in range(len(answers)):  # T5's copies, one per answer
                targets.append({"value": answers, "group": (query // 4, query)})
                predictions.append({"value": predicted})
        return targets, predictions
    labels = rng.integers(0, len(b.labels), n)
    predictions = np.where(rng.random(n) < 0.7, labels, rng.integers(-1, len(b.labels), n))
    if b.short_name == "multirc":
        questions = np.sort(rng.integers(0, 30, n))
        return ([{"value": int(t), "group": int(q)} for t, q in zip(labels, questions, strict=False)],
                [{"value": int(p)} for p in predictions])
    return labels.tolist(), predictions.tolist()


def check_glue_metrics_and_postprocessors(t5_metrics, tf):
    """Each GLUE/SuperGLUE task's metric set and postprocessor against T5's
    (``t5.data.glue_utils``), on the same postprocessed values."""
    if t5_metrics is None:
        glue_metrics_ours_only()
        return
    import tensorflow_datasets as tfds
    from t5.data import glue_utils

    from t5x_like.builtin_tasks import glue
    rng = np.random.default_rng(1)
    configs = {"glue": tfds.text.glue.Glue.builder_configs,
               "super_glue": tfds.text.super_glue.SuperGlue.builder_configs}
    for task_name, b in glue.BENCHMARKS.items():
        task = td.TaskRegistry.get(task_name)
        if b.short_name == "wsc":  # T5's SuperGLUE metric table has no classification WSC
            t5_fns = [t5_metrics.accuracy]
        elif b.collection == "glue":
            t5_fns = glue_utils.get_glue_metric(b.short_name)
        else:
            t5_fns = glue_utils.get_super_glue_metric(b.short_name)
        targets, predictions = glue_metric_inputs(task_name, rng)
        ours, theirs = {}, {}
        for fn in task.metric_fns:
            ours.update(fn(targets, predictions))
        for fn in t5_fns:
            theirs.update(fn(targets, predictions))
        ok, detail = same_scores(ours, theirs)
        check(f"GLUE metrics: {task_name} metric set == t5's", ok, detail)

        t5_post = glue_utils.get_glue_postprocess_fn(configs[b.collection][b.config])
        words = list(b.labels or glue.STSB_VALUES) + ["<unk>", "garbage", "", "1.5", "True "]
        if b.config == "record":
            example = {"answers": [b"Obama", b"Barack Obama"], "idx/passage": 3, "idx/query": 4}
            pairs = [(task.postprocess(w, example=example, is_target=t),
                      t5_post(w, example=example, is_target=t))
                     for w in ["Obama", "x"] for t in (False, True)]
        else:
            example = {"idx/paragraph": 1, "idx/question": 2}
            pairs = [(task.postprocess(w, example=example), t5_post(w, example=example))
                     for w in words]
            if b.short_name == "multirc":  # our group adds the paragraph id (see glue.py)
                pairs += [(task.postprocess(w, example=example, is_target=True)["value"],
                           t5_post(w, example=example, is_target=True)["value"]) for w in words]
        differ = [(o, t) for o, t in pairs if o != t]
        check(f"GLUE postprocessor: {task_name} == t5's", not differ,
              f"{len(pairs)} strings" + (f", differ: {differ[:3]}" if differ else ""))


def glue_metrics_ours_only() -> None:
    """Without t5: each task's metric set and postprocessor run on the same inputs."""
    from t5x_like.builtin_tasks import glue
    rng = np.random.default_rng(1)
    for task_name, b in glue.BENCHMARKS.items():
        task = td.TaskRegistry.get(task_name)
        targets, predictions = glue_metric_inputs(task_name, rng)
        ours = {}
        for fn in task.metric_fns:
            ours.update(fn(targets, predictions))
        words = list(b.labels or glue.STSB_VALUES) + ["<unk>", "garbage", "", "1.5", "True "]
        example = ({"answers": [b"Obama"], "idx/passage": 3, "idx/query": 4}
                   if b.config == "record" else {"idx/paragraph": 1, "idx/question": 2})
        posted = [task.postprocess(w, example=example) for w in words]
        check(f"GLUE metrics and postprocessor: {task_name} == t5's", None,
              f"ours: {', '.join(sorted(ours))} on {len(targets)} values; {len(posted)} strings "
              "postprocessed")


def glue_format_records():
    """Raw TFDS-like records per (collection, config), with the text T5 handles specially."""
    text = {"sentence": b"The sailors rode the breeze clear of the rocks.",
            "sentence1": "He said \"no\" — twice.", "sentence2": b"He refused.",
            "question1": b"Why do I get bored?", "question2": b"Why am I bored?",
            "question": b"Is it raining?", "premise": "The man broke his toe.",
            "hypothesis": b"The man is hurt.", "passage": b"Rain fell all day.",
            "choice1": b"He dropped a hammer.", "choice2": b"He got a hole in his sock.",
            "word": b"rode"}
    records = {}
    for b_name in ("cola", "sst2", "mrpc", "qqp", "mnli", "qnli", "rte", "wnli"):
        records[("glue", b_name)] = [dict(text, label=label, idx=7 + label)
                                     for label in (0, 1, -1)]
    records[("glue", "stsb")] = [dict(text, label=np.float32(x), idx=i) for i, x in
                                 enumerate((0.0, 1.1, 2.5, 3.1, 3.3, 4.9, 0.1, 0.3, 5.0))]
    for b_name in ("boolq", "cb", "copa", "rte", "wic"):
        records[("super_glue", b_name)] = [dict(text, label=label, idx=3) for label in (0, 1, -1)]
    records[("super_glue", "multirc")] = [{
        "paragraph": b"<b>Sent 1: </b>It rained.<br><b>Sent 2: </b>We stayed in.<br>",
        "question": b"Why?", "answer": b"Rain", "label": 1,
        "idx": {"paragraph": 4, "question": 9, "answer": 2}}]
    records[("super_glue", "wsc.fixed")] = [
        {"text": b"Mitchell asked Tom if he could lend some money.", "span1_text": b"Tom",
         "span1_index": 2, "span2_text": b"he", "span2_index": 4, "label": 1, "idx": 0},
        {"text": b"He said Mr. Farley was late because he overslept.", "span1_text": b"Mr. Farley",
         "span1_index": 2, "span2_text": b"He", "span2_index": 0, "label": 0, "idx": 1}]
    records[("super_glue", "record")] = [{
        "passage": b"Obama spoke.\n@highlight\nHe was in Paris\n@highlight\nIt rained",
        "query": b"@placeholder spoke in Paris.", "entities": [b"Obama", b"Paris"],
        "answers": [b"Obama", b"Barack Obama"], "idx": {"passage": 1, "query": 2}}]
    return records


def check_glue_formats(tf):
    """Our GLUE/SuperGLUE text against T5's (TensorFlow) preprocessors on the same records."""
    if tf is None:
        glue_formats_ours_only()
        return
    import tensorflow_datasets as tfds
    from t5.data import glue_utils

    from t5x_like.builtin_tasks import glue
    configs = {"glue": tfds.text.glue.Glue.builder_configs,
               "super_glue": tfds.text.super_glue.SuperGlue.builder_configs}
    by_config = {(b.collection, b.config): b for b in glue.BENCHMARKS.values()}
    for (collection, config), records in glue_format_records().items():
        b = by_config[(collection, config)]
        if config not in ("multirc", "wsc.fixed", "record"):  # T5 reads every other key
            records = [{k: v for k, v in r.items() if k in set(b.features) | {"label", "idx"}}
                       for r in records]
        if config == "record":
            ours = [e for r in records for e in glue.record_examples(r, explode=True)]
        else:
            ours = [b.format_step().fn(r) for r in records]
        preprocess = glue_utils.get_glue_text_preprocessor(configs[collection][config])
        ds = tf.data.Dataset.from_generator(
            lambda records=records: iter(records),
            output_signature=_signature(tf, records[0]))
        theirs = list(tfds.as_numpy(preprocess(ds)))
        pairs = [((o["inputs"], o["targets"]),
                  (t["inputs"].decode(), t["targets"].decode())) for o, t in zip(ours, theirs, strict=False)]
        differ = [p for p in pairs if p[0] != p[1]]
        check(f"GLUE format: {collection}/{config} inputs and targets == t5's preprocessor",
              len(ours) == len(theirs) and not differ,
              f"{len(ours)} vs {len(theirs)} examples" + (f", e.g. ours {differ[0][0]!r} "
                                                          f"t5 {differ[0][1]!r}" if differ else ""))


def glue_formats_ours_only() -> None:
    """Without t5: our inputs/targets text of the same records."""
    from t5x_like.builtin_tasks import glue
    by_config = {(b.collection, b.config): b for b in glue.BENCHMARKS.values()}
    for (collection, config), records in glue_format_records().items():
        b = by_config[(collection, config)]
        if config not in ("multirc", "wsc.fixed", "record"):  # as check_glue_formats reads them
            records = [{k: v for k, v in r.items() if k in set(b.features) | {"label", "idx"}}
                       for r in records]
        if config == "record":
            ours = [e for r in records for e in glue.record_examples(r, explode=True)]
        else:
            ours = [b.format_step().fn(r) for r in records]
        check(f"GLUE format: {collection}/{config} inputs and targets == t5's preprocessor", None,
              f"ours formatted {len(records)} records into {len(ours)} examples")


def _signature(tf, record: dict) -> dict:
    """TFDS's types: text is a string, a list a string vector, STS-B's label float32."""
    spec = {}
    for key, value in record.items():
        if isinstance(value, dict):
            spec[key] = _signature(tf, value)
        elif isinstance(value, list):
            spec[key] = tf.TensorSpec([None], tf.string)
        elif isinstance(value, (bytes, str)):
            spec[key] = tf.TensorSpec([], tf.string)
        elif isinstance(value, (float, np.floating)):
            spec[key] = tf.TensorSpec([], tf.float32)
        else:
            spec[key] = tf.TensorSpec([], tf.int64 if key == "label" else tf.int32)
    return spec


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=2000,
                        help="568-token chunks for the span-corruption statistics")
    parser.add_argument("--max-mask-length", type=int, default=700,
                        help="noise-mask counts are compared for lengths 1..this")
    parser.add_argument("--metrics-only", action="store_true",
                        help="only the metric, GLUE metric/postprocessor and format checks")
    parser.add_argument("--smoke", action="store_true",
                        help="every check on few inputs: a check that the script runs")
    args = parser.parse_args(argv)
    RESULTS.clear()
    docs_every, grid_step, unpacked, packed = 10, 5, 200, 300
    if args.smoke:
        args.examples, args.max_mask_length = 40, 40
        docs_every, grid_step, unpacked, packed = 200, 120, 20, 20
    t5_metrics, error = import_t5_metrics()
    tf = None
    if t5_metrics is None:
        print(f"t5.evaluation.metrics not importable ({error}): the metric and GLUE checks run "
              "our side alone. Install benchmarks/requirements-seqio.txt and t5 (see there).")
    else:
        import tensorflow as tf
        tf.config.set_visible_devices([], "GPU")
    check_metrics(t5_metrics)
    check_glue_metrics_and_postprocessors(t5_metrics, tf)
    check_glue_formats(tf)
    if not args.metrics_only:
        seqio, tf, t5p, error = import_seqio()
        if seqio is None:
            print(f"seqio/t5 not importable ({error}): the data checks run our side alone. "
                  "Install benchmarks/requirements-seqio.txt in a separate venv (see "
                  "docs/benchmarks.md).")
        docs = tasks.embedded_en_documents("train")
        check_vocabulary(seqio, tf, docs[::docs_every])
        check_random_spans_helper(t5p, grid_step)
        check_noise_mask_counts(tf, t5p, args.max_mask_length)
        check_span_corruption(seqio, tf, t5p, docs, args.examples)
        check_unpacked_converters(seqio, tf, unpacked)
        check_packed_converters(seqio, tf, packed)
    print("\n" + results_table())
    failed = [name for name, ok, _ in RESULTS if ok is False]
    compared = [name for name, ok, _ in RESULTS if ok is not None]
    print(f"\n{len(compared) - len(failed)} passed, {len(failed)} failed, "
          f"{len(RESULTS) - len(compared)} not compared (seqio/t5 not installed)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
