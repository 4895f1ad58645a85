"""Encoder objectives: BERT masked LM (token or whole-word) and SpanBERT span masking.

Selection and replacement are separate: a selection function picks the
positions the loss is taken on (15% of the maskable tokens), then each selected
token (BERT) or span (SpanBERT) becomes [MASK] 80%, a random token 10%, or stays
10%. The loss covers every selected position, including the unchanged ones, so
the example carries ``loss_weights`` instead of relying on ``inputs == [MASK]``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from t5x_like.data.preprocessors.base import ExampleStep
from t5x_like.data.preprocessors.text import check_minimum_length


def _budget(num_maskable: int, rate: float) -> int:
    return 0 if num_maskable == 0 else max(1, int(round(num_maskable * rate)))


def select_tokens(maskable: np.ndarray, rng: np.random.Generator, rate: float = 0.15) -> np.ndarray:
    """Exactly ``round(rate * maskable.sum())`` maskable positions, uniformly at random."""
    candidates = np.flatnonzero(maskable)
    chosen = rng.permutation(candidates)[:_budget(candidates.size, rate)]
    selected = np.zeros(maskable.shape, bool)
    selected[chosen] = True
    return selected


def word_ids(word_start: np.ndarray, maskable: np.ndarray) -> np.ndarray:
    """Index of the word each token belongs to; -1 for tokens that may not be masked."""
    # A word never spans a special token, and the first token always starts one.
    starts = word_start | ~np.concatenate([[False], maskable[:-1]])
    ids = np.cumsum(starts & maskable) - 1
    return np.where(maskable, ids, -1)


def select_whole_words(maskable: np.ndarray, word_start: np.ndarray, rng: np.random.Generator,
                       rate: float = 0.15) -> np.ndarray:
    """Whole words in random order while they fit the budget (BERT's whole-word masking)."""
    ids = word_ids(word_start, maskable)
    budget = _budget(int(maskable.sum()), rate)
    num_words = int(ids.max()) + 1 if maskable.any() else 0
    sizes = np.bincount(ids[ids >= 0], minlength=num_words)
    chosen, count = np.zeros(num_words, bool), 0
    for word in rng.permutation(num_words):
        if count >= budget:
            break
        if count + sizes[word] <= budget:
            chosen[word], count = True, count + sizes[word]
    return maskable & chosen[np.maximum(ids, 0)]


def _truncated_geometric(rng: np.random.Generator, p: float, maximum: int) -> int:
    """Geometric(p) on 1..maximum, renormalised (SpanBERT's "clipped"; mean 3.8 for 0.2, 10)."""
    while True:
        value = int(rng.geometric(p))
        if value <= maximum:
            return value


def select_spans(maskable: np.ndarray, word_start: np.ndarray, rng: np.random.Generator,
                 rate: float = 0.15, geometric_p: float = 0.2, max_span_words: int = 10,
                 ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """SpanBERT: spans of Geometric(p) whole words, clipped at ``max_span_words``, at random
    word starts, until 15% of the tokens are selected. Returns the mask and the token spans."""
    ids = word_ids(word_start, maskable)
    budget = _budget(int(maskable.sum()), rate)
    num_words = int(ids.max()) + 1 if maskable.any() else 0
    if num_words == 0:
        return np.zeros(maskable.shape, bool), []
    first_token = np.full(num_words, -1)
    last_token = np.full(num_words, -1)
    positions = np.flatnonzero(ids >= 0)
    first_token[ids[positions[::-1]]] = positions[::-1]
    last_token[ids[positions]] = positions
    taken = np.zeros(num_words, bool)
    spans, count = [], 0
    for _ in range(20 * budget + 20):  # bounded: a long sequence of unlucky draws just stops
        if count >= budget:
            break
        span_words = _truncated_geometric(rng, geometric_p, max_span_words)
        start = int(rng.integers(num_words))
        stop = min(start + span_words, num_words)
        if taken[start:stop].any():
            continue
        size = int(last_token[stop - 1] - first_token[start] + 1)
        if count + size > budget:
            continue
        taken[start:stop] = True
        spans.append((int(first_token[start]), int(last_token[stop - 1]) + 1))
        count += size
    selected = np.zeros(maskable.shape, bool)
    for begin, end in spans:
        selected[begin:end] = True
    return selected & maskable, sorted(spans)


def replace_selected(tokens: np.ndarray, units: list[np.ndarray], rng: np.random.Generator, *,
                     mask_id: int, random_low: int, random_high: int,
                     mask_rate: float = 0.8, random_rate: float = 0.1) -> np.ndarray:
    """Each unit (a position array) becomes [MASK] 80%, random tokens 10%, unchanged 10%."""
    out = tokens.copy()
    for positions in units:
        draw = rng.random()
        if draw < mask_rate:
            out[positions] = mask_id
        elif draw < mask_rate + random_rate:
            out[positions] = rng.integers(random_low, random_high, size=len(positions))
    return out


def bert_mask(tokens: np.ndarray, maskable: np.ndarray, rng: np.random.Generator, *,
              mask_id: int, random_low: int, random_high: int, rate: float = 0.15,
              word_start: np.ndarray | None = None, spans: bool = False,
              mask_rate: float = 0.8, random_rate: float = 0.1) -> dict[str, np.ndarray]:
    """inputs (masked), targets (original) and loss_weights (1.0 on every selected position).

    ``word_start`` switches to whole-word selection; with ``spans`` too, SpanBERT spans
    (replacement decided per span, as in SpanBERT). ``mask_rate``/``random_rate``: the
    shares of selected units made [MASK] and random (BERT 0.8/0.1, ELECTRA 0.85/0).
    """
    tokens = np.asarray(tokens, np.int32)
    if spans:
        starts = word_start if word_start is not None else np.ones(tokens.shape, bool)
        selected, token_spans = select_spans(maskable, starts, rng, rate)
        units = [np.arange(b, e)[maskable[b:e]] for b, e in token_spans]
    else:
        selected = (select_tokens(maskable, rng, rate) if word_start is None
                    else select_whole_words(maskable, word_start, rng, rate))
        units = [np.array([p]) for p in np.flatnonzero(selected)]
    inputs = replace_selected(tokens, units, rng, mask_id=mask_id, random_low=random_low,
                              random_high=random_high, mask_rate=mask_rate,
                              random_rate=random_rate)
    return {"inputs": inputs.astype(np.int32), "targets": tokens,
            "loss_weights": selected.astype(np.float32)}


@dataclasses.dataclass(frozen=True)
class MaskedLM(ExampleStep):
    """BERT's MLM on ``key`` tokens; ``add_cls_sep`` wraps a single segment as [CLS] x [SEP].

    ``whole_word`` selects whole words; ``span_masking`` uses SpanBERT's geometric spans.
    Other features (``token_type_ids``, ``next_sentence_labels``) pass through.
    ``mask_rate``/``random_rate``: how selected tokens are replaced (BERT's 80/10/10;
    ELECTRA's release makes 85% [MASK] and keeps the rest).
    """

    key: str = "targets"
    rate: float = 0.15
    whole_word: bool = False
    span_masking: bool = False
    add_cls_sep: bool = True
    mask_rate: float = 0.8
    random_rate: float = 0.1

    def check(self, ctx):
        check_minimum_length(ctx, "inputs", 3 if self.add_cls_sep else 1, "masked LM")
        vocab = ctx.vocabulary("inputs")
        for name in ("mask_id", "cls_id", "sep_id"):
            getattr(vocab, name)  # a clear error now if the vocabulary lacks the piece

    def map(self, example, rng, ctx):
        vocab = ctx.vocabulary("inputs")
        tokens = np.asarray(example[self.key], np.int32)
        if self.add_cls_sep:
            tokens = np.concatenate([[vocab.cls_id], tokens[:ctx.length("inputs") - 2],
                                     [vocab.sep_id]]).astype(np.int32)
        maskable = ~np.isin(tokens, vocab.special_ids)
        word_start = (vocab.word_start_mask(tokens)
                      if (self.whole_word or self.span_masking) else None)
        low, high = vocab.random_token_range
        out = {k: v for k, v in example.items() if k != self.key}
        out.update(bert_mask(tokens, maskable, rng, mask_id=vocab.mask_id, random_low=low,
                             random_high=high, rate=self.rate, word_start=word_start,
                             spans=self.span_masking, mask_rate=self.mask_rate,
                             random_rate=self.random_rate))
        return out


def mlm_chunk_length(ctx) -> int:
    """inputs - 2: room for [CLS] and [SEP]."""
    return check_minimum_length(ctx, "inputs", 3, "masked LM ([CLS] x [SEP])") - 2
