"""BERT's next-sentence prediction pairs: [CLS] A [SEP] B [SEP] with segment ids.

A document is text whose sentences are separated by newlines. Segment A is the
first sentences of a random run of the document; half the time B is what
follows (IsNext, label 0), half the time it comes from a random other document
of the split (NotNext, label 1), as in BERT's ``create_pretraining_data``.
One pair per document keeps the step a pure per-example function.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from t5x_like.data.preprocessors.base import ExampleStep
from t5x_like.data.preprocessors.text import as_text, check_minimum_length
from t5x_like.errors import DataError

IS_NEXT, NOT_NEXT = 0, 1


def _take_until(sentences: list[np.ndarray], start: int, budget: int) -> list[np.ndarray]:
    taken, size = [], 0
    for sentence in sentences[start:]:
        if size >= budget:
            break
        taken.append(sentence)
        size += sentence.size
    return taken


def truncate_pair(a: np.ndarray, b: np.ndarray, max_tokens: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Drops tokens from the front or back (at random) of the longer segment, as BERT does."""
    while a.size + b.size > max_tokens:
        longer_is_a = a.size > b.size
        seg = a if longer_is_a else b
        seg = seg[1:] if rng.random() < 0.5 else seg[:-1]
        a, b = (seg, b) if longer_is_a else (a, seg)
    return a, b


def next_sentence_pair(sentences: list[np.ndarray], random_sentences: list[np.ndarray],
                       rng: np.random.Generator, *, max_length: int, cls_id: int,
                       sep_id: int) -> dict[str, np.ndarray] | None:
    """One NSP example from a document's tokenized sentences; ``None`` if it has no tokens."""
    sentences = [s for s in sentences if s.size]
    if not sentences:
        return None
    budget = max_length - 3
    run = _take_until(sentences, int(rng.integers(len(sentences))), budget)
    if len(run) == 1 and run[0].size >= 2:
        # One long sentence: its two halves make the IsNext pair, so labels stay 50/50
        # (BERT forces NotNext here, which skews the labels on paragraph-long lines).
        cut = int(rng.integers(1, run[0].size))
        run = [run[0][:cut], run[0][cut:]]
    a_end = int(rng.integers(1, len(run))) if len(run) > 1 else 1
    a = np.concatenate(run[:a_end])
    random_next = len(run) == 1 or rng.random() < 0.5
    if random_next:
        others = [s for s in random_sentences if s.size] or [np.zeros(0, np.int32)]
        # At least half the budget for B: truncate_pair then trims the longer segment.
        b_run = _take_until(others, int(rng.integers(len(others))),
                            max(budget - a.size, budget // 2))
        b = np.concatenate(b_run) if b_run else np.zeros(0, np.int32)
    else:
        b = np.concatenate(run[a_end:])
    a, b = truncate_pair(a.astype(np.int32), b.astype(np.int32), budget, rng)
    tokens = np.concatenate([[cls_id], a, [sep_id], b, [sep_id]]).astype(np.int32)
    token_types = np.concatenate([np.zeros(a.size + 2), np.ones(b.size + 1)]).astype(np.int32)
    return {"targets": tokens, "token_type_ids": token_types,
            "next_sentence_labels": np.int32(NOT_NEXT if random_next else IS_NEXT)}


@dataclasses.dataclass(frozen=True)
class NextSentencePairs(ExampleStep):
    """Raw document text (``key``) -> NSP pair in ``targets``; follow with
    ``MaskedLM(add_cls_sep=False)``. The random document comes from the split's
    source, drawn with the example's own rng, so the step stays pure."""

    key: str = "text"

    def check(self, ctx):
        check_minimum_length(ctx, "inputs", 5, "next-sentence pairs ([CLS] a [SEP] b [SEP])")
        if getattr(ctx.source, "sequential", False):
            raise ValueError(f"Task {ctx.task_name!r}: next-sentence pairs draw random other "
                             "documents, which TFRecord files cannot serve fast; prepare the "
                             "dataset as array_record (tfds build --file_format=array_record).")
        if len(ctx.source) < 2:
            raise DataError(f"Task {ctx.task_name!r}: next-sentence pairs need a split with at "
                            f"least 2 documents, {ctx.split!r} has {len(ctx.source)}.")

    def map(self, example, rng, ctx):
        vocab = ctx.vocabulary("inputs")

        def sentences(text) -> list[np.ndarray]:
            lines = [line for line in as_text(text).split("\n") if line.strip()]
            return [np.asarray(ids, np.int32) for ids in vocab.encode_batch(lines)] if lines else []

        this = as_text(example[self.key])
        other = this
        for _ in range(10):  # a different document, unless the split is all duplicates
            other = as_text(ctx.source[int(rng.integers(len(ctx.source)))][self.key])
            if other != this:
                break
        return next_sentence_pair(sentences(this), sentences(other), rng,
                                  max_length=ctx.length("inputs"), cls_id=vocab.cls_id,
                                  sep_id=vocab.sep_id)
