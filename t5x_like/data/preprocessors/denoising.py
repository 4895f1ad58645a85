"""Sequence-to-sequence denoising objectives from the T5 paper's comparison (section 3.3).

A noise mask (T5's random spans, or i.i.d. tokens) and a pair of functions that
build inputs and targets from it. Named variants:

- ``span_corruption``:   spans -> unique sentinels; targets spell the spans out (T5).
- ``iid_replace_spans``: i.i.d. noise, consecutive noise tokens -> one sentinel.
- ``iid_drop``:          i.i.d. noise tokens dropped; targets are the dropped tokens.
- ``bert_style``:        i.i.d. 15%, 80/10/10 [MASK]/random/keep; targets the original.
- ``mass_style``:        i.i.d. noise -> [MASK]; targets the original.
- ``deshuffle``:         inputs a random permutation; targets the original (no mask).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from t5x_like.data.preprocessors.base import ExampleStep
from t5x_like.data.preprocessors.span_corruption import (
    noise_counts,
    noise_span_to_unique_sentinel,
    nonnoise_span_to_unique_sentinel,
    random_spans_noise_mask,
    require_sentinels,
)
from t5x_like.data.preprocessors.text import apply_eos

VARIANTS = ("span_corruption", "iid_replace_spans", "iid_drop", "bert_style", "mass_style",
            "deshuffle")


SENTINEL_VARIANTS = ("span_corruption", "iid_replace_spans")


def expected_noise_spans(length: int, variant: str, noise_density: float,
                         mean_noise_span_length: float) -> float:
    """Spans T5's random-spans mask makes (fixed), or i.i.d. noise makes on average."""
    if variant == "span_corruption":
        return noise_counts(max(length, 2), noise_density, mean_noise_span_length)[1]
    return length * noise_density * (1 - noise_density)


def iid_noise_mask(length: int, noise_density: float, rng: np.random.Generator) -> np.ndarray:
    """Each token is noise with probability ``noise_density``."""
    return rng.random(length) < noise_density


def noise_tokens_to(tokens: np.ndarray, noise_mask: np.ndarray, rng: np.random.Generator, *,
                    mask_id: int, random_low: int, random_high: int,
                    mask_rate: float = 1.0, random_rate: float = 0.0) -> np.ndarray:
    """Noise tokens -> [MASK] (``mask_rate``) / random (``random_rate``) / kept (the rest)."""
    draw = rng.random(tokens.size)
    out = np.where(noise_mask & (draw < mask_rate), mask_id, tokens)
    random_here = noise_mask & (draw >= mask_rate) & (draw < mask_rate + random_rate)
    return np.where(random_here, rng.integers(random_low, random_high, tokens.size), out)


def noise_mask(length: int, variant: str, rng: np.random.Generator, noise_density: float = 0.15,
               mean_noise_span_length: float = 3.0) -> np.ndarray | None:
    """The variant's noise mask (None for ``deshuffle``, which has none)."""
    if variant not in VARIANTS:
        raise ValueError(f"Unknown denoising variant {variant!r}; pick one of {VARIANTS}.")
    if variant == "deshuffle":
        return None
    if variant == "span_corruption":
        return random_spans_noise_mask(length, noise_density, mean_noise_span_length, rng)
    return iid_noise_mask(length, noise_density, rng)


def count_spans(mask: np.ndarray) -> int:
    return int(np.sum(mask & ~np.concatenate([[False], mask[:-1]])))


def apply_noise(tokens: np.ndarray, mask: np.ndarray | None, rng: np.random.Generator,
                variant: str, *, vocab_size: int, mask_id: int, random_low: int,
                random_high: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) without EOS from ``tokens`` and the variant's noise mask."""
    if variant == "deshuffle":
        return rng.permutation(tokens), tokens
    if variant in SENTINEL_VARIANTS:
        return (noise_span_to_unique_sentinel(tokens, mask, vocab_size),
                nonnoise_span_to_unique_sentinel(tokens, mask, vocab_size))
    if variant == "iid_drop":
        return tokens[~mask], tokens[mask]
    rates = {"bert_style": (0.8, 0.1), "mass_style": (1.0, 0.0)}[variant]
    inputs = noise_tokens_to(tokens, mask, rng, mask_id=mask_id, random_low=random_low,
                             random_high=random_high, mask_rate=rates[0], random_rate=rates[1])
    return inputs.astype(np.int32), tokens


def denoise(tokens: np.ndarray, rng: np.random.Generator, variant: str, *, vocab_size: int,
            mask_id: int, random_low: int, random_high: int, noise_density: float = 0.15,
            mean_noise_span_length: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) without EOS for one of ``VARIANTS``."""
    tokens = np.asarray(tokens, np.int32)
    mask = noise_mask(tokens.size, variant, rng, noise_density, mean_noise_span_length)
    return apply_noise(tokens, mask, rng, variant, vocab_size=vocab_size, mask_id=mask_id,
                       random_low=random_low, random_high=random_high)


@dataclasses.dataclass(frozen=True)
class Denoise(ExampleStep):
    """``key`` tokens -> ``inputs``/``targets`` (each + EOS) for a denoising ``variant``."""

    variant: str = "span_corruption"
    noise_density: float = 0.15
    mean_noise_span_length: float = 3.0
    key: str = "targets"

    def check(self, ctx):
        if self.variant not in VARIANTS:
            raise ValueError(f"Unknown denoising variant {self.variant!r}; pick one of {VARIANTS}.")
        if self.variant in SENTINEL_VARIANTS:
            require_sentinels(ctx, self.variant)
            expected = expected_noise_spans(ctx.length("inputs"), self.variant, self.noise_density,
                                            self.mean_noise_span_length)
            sentinels = ctx.vocabulary("inputs").extra_ids
            if expected > sentinels:
                raise ValueError(
                    f"Task {ctx.task_name!r}: {self.variant} on inputs={ctx.length('inputs')} "
                    f"makes about {expected:.0f} noise spans but the vocabulary has {sentinels} "
                    "sentinels; use shorter inputs or a lower noise_density.")

    def map(self, example, rng, ctx):
        vocab = ctx.vocabulary("inputs")
        low, high = vocab.random_token_range
        mask_id = vocab.mask_id if self.variant in ("bert_style", "mass_style") else 0
        tokens = np.asarray(example[self.key], np.int32)
        if tokens.size == 0:
            return None
        mask = noise_mask(tokens.size, self.variant, rng, self.noise_density,
                          self.mean_noise_span_length)
        if self.variant in SENTINEL_VARIANTS and count_spans(mask) > vocab.extra_ids:
            return None  # a rare i.i.d. draw above the sentinel count (check() bounds the mean)
        inputs, targets = apply_noise(tokens, mask, rng, self.variant,
                                      vocab_size=vocab.vocab_size, mask_id=mask_id,
                                      random_low=low, random_high=high)
        return {"inputs": apply_eos(inputs, vocab.eos_id), "targets": apply_eos(targets, vocab.eos_id)}
