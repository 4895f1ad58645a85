"""BART's noising functions (Lewis et al. 2019, section 2.2); targets are the original text.

Each function is ``(tokens, rng, ...) -> tokens`` and composes with the others;
``BartNoise`` applies them in BART's order: sentence permutation, document
rotation, token masking, token deletion, text infilling.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from t5x_like.data.preprocessors.base import ExampleStep
from t5x_like.data.preprocessors.text import apply_eos


def token_masking(tokens: np.ndarray, rng: np.random.Generator, rate: float,
                  mask_id: int) -> np.ndarray:
    """Each token becomes [MASK] with probability ``rate``."""
    return np.where(rng.random(tokens.size) < rate, mask_id, tokens).astype(np.int32)


def token_deletion(tokens: np.ndarray, rng: np.random.Generator, rate: float) -> np.ndarray:
    """Each token is deleted with probability ``rate`` (the model must find where)."""
    return tokens[rng.random(tokens.size) >= rate]


def text_infilling(tokens: np.ndarray, rng: np.random.Generator, rate: float, mask_id: int,
                   poisson_lambda: float = 3.0) -> np.ndarray:
    """Spans with Poisson(λ) lengths, covering ``rate`` of the tokens, each become one [MASK].

    A 0-length span inserts a [MASK] (the model must learn that nothing is missing).
    Spans start at random positions and neither overlap nor touch; a span drawn over
    0-length insertions absorbs them (its one [MASK] stands for both), so insertions
    never crowd out the removals the rate asks for (a 2-token text loses its 1 token).
    """
    n = tokens.size
    budget = int(round(n * rate))
    replaced = np.zeros(n, bool)
    mask_at = np.zeros(n + 1, bool)  # a [MASK] goes before position i (or at the end)
    covered, attempts = 0, 0
    while covered < budget and attempts < 10 * n + 10:
        attempts += 1
        length = min(int(rng.poisson(poisson_lambda)), budget - covered)
        start = int(rng.integers(n + 1 - length)) if n >= length else 0
        if replaced[max(start - 1, 0):start + length + 1].any():
            continue  # it would overlap or touch a removed span
        if length == 0 and mask_at[start]:
            continue  # one insertion per place
        mask_at[start:start + length + 1] = False  # insertions it covers or ends at
        replaced[start:start + length] = True
        mask_at[start] = True
        covered += length
    out = []
    for i in range(n + 1):
        if mask_at[i]:
            out.append(mask_id)
        if i < n and not replaced[i]:
            out.append(int(tokens[i]))
    return np.asarray(out, np.int32)


def sentence_permutation(tokens: np.ndarray, is_sentence_end: np.ndarray,
                         rng: np.random.Generator) -> np.ndarray:
    """Sentences (runs ending at a sentence-final token) in a random order."""
    ends = np.flatnonzero(is_sentence_end[:-1]) + 1 if tokens.size else np.zeros(0, int)
    sentences = np.split(tokens, ends)
    order = rng.permutation(len(sentences))
    return np.concatenate([sentences[i] for i in order]).astype(np.int32) if sentences else tokens


def document_rotation(tokens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The document, rotated to start at a uniformly random token."""
    return np.roll(tokens, -int(rng.integers(max(tokens.size, 1)))) if tokens.size else tokens


@dataclasses.dataclass(frozen=True)
class BartNoise(ExampleStep):
    """``key`` tokens -> noised ``inputs``, original ``targets`` (each + EOS).

    The defaults are BART-large's pretraining: 30% text infilling with Poisson(3)
    spans plus sentence permutation.
    """

    key: str = "targets"
    permute_sentences: bool = True
    rotate_document: bool = False
    mask_rate: float = 0.0
    delete_rate: float = 0.0
    infill_rate: float = 0.3
    poisson_lambda: float = 3.0

    def map(self, example, rng, ctx):
        vocab = ctx.vocabulary("inputs")
        tokens = np.asarray(example[self.key], np.int32)
        if tokens.size == 0:
            return None
        noised = tokens
        if self.permute_sentences:
            noised = sentence_permutation(noised, vocab.sentence_end_table[noised], rng)
        if self.rotate_document:
            noised = document_rotation(noised, rng)
        if self.mask_rate:
            noised = token_masking(noised, rng, self.mask_rate, vocab.mask_id)
        if self.delete_rate:
            noised = token_deletion(noised, rng, self.delete_rate)
        if self.infill_rate:
            noised = text_infilling(noised, rng, self.infill_rate, vocab.mask_id,
                                    self.poisson_lambda)
        return {"inputs": apply_eos(noised, vocab.eos_id), "targets": apply_eos(tokens, vocab.eos_id)}
