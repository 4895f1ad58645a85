"""T5 span corruption: noise masks, sentinels and T5's exact length arithmetic.

Every random choice comes from the ``rng`` handed in, which the pipeline seeds
per example; the same example index always gives the same output.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from t5x_like.data import vocabularies
from t5x_like.data.preprocessors.base import ExampleStep


def random_spans_helper(inputs_length: int, noise_density: float,
                        mean_noise_span_length: float, extra_tokens_per_span_inputs: int = 1,
                        extra_tokens_per_span_targets: int = 1) -> tuple[int, int]:
    """T5's length arithmetic: raw tokens per example so inputs fill ``inputs_length``.

    Returns ``(tokens_length, targets_length)``. ``inputs_length`` counts the EOS.
    For T5's pretraining lengths (512, 0.15, 3.0) this gives (568, 114).
    """

    def lengths_after_corruption(tokens_length: int) -> tuple[int, int]:
        num_noise = int(round(tokens_length * noise_density))
        num_spans = int(round(num_noise / mean_noise_span_length))
        return (tokens_length - num_noise + num_spans * extra_tokens_per_span_inputs + 1,
                num_noise + num_spans * extra_tokens_per_span_targets + 1)

    if inputs_length < 2:
        raise ValueError(f"inputs_length={inputs_length} is too short for span corruption; "
                         "use at least 2 (one token and EOS).")
    tokens_length = inputs_length - 1
    while lengths_after_corruption(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    corrupted_inputs_length, targets_length = lengths_after_corruption(tokens_length)
    # T5 keeps targets no longer than inputs when half of the tokens are noise; like T5,
    # compare with the inputs length the chosen tokens_length gives, which can be
    # shorter than the requested one.
    if noise_density == 0.5 and targets_length > corrupted_inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def _random_segmentation(num_items: int, num_segments: int,
                         rng: np.random.Generator) -> np.ndarray:
    """Splits ``num_items`` into ``num_segments`` non-empty parts, uniformly at random."""
    boundaries = np.zeros(num_items - 1, dtype=bool)
    boundaries[: num_segments - 1] = True
    rng.shuffle(boundaries)
    segment_ids = np.concatenate([[0], np.cumsum(boundaries)])
    return np.bincount(segment_ids, minlength=num_segments)


def noise_counts(length: int, noise_density: float,
                 mean_noise_span_length: float) -> tuple[int, int]:
    """Noise tokens and noise spans in a ``length``-token example (``length >= 2``), as T5.

    T5's mask computes both in float32 (``tf.round``: half to even), so a product
    such as 95 x 0.3 = 28.5000011 rounds up to 29 where float64 (28.4999...) gives 28;
    ``random_spans_helper`` uses Python floats, as T5's does.
    """
    num_noise = int(np.rint(np.float32(length) * np.float32(noise_density)))
    num_noise = min(max(num_noise, 1), length - 1)
    num_spans = int(np.rint(np.float32(num_noise) / np.float32(mean_noise_span_length)))
    return num_noise, max(num_spans, 1)


def random_spans_noise_mask(length: int, noise_density: float, mean_noise_span_length: float,
                            rng: np.random.Generator) -> np.ndarray:
    """Boolean mask of noise tokens, in alternating non-noise/noise spans.

    As in T5: the number of noise tokens and spans is fixed by the length, span
    lengths are a random segmentation, and the sequence starts with non-noise.
    """
    if noise_density == 0.0:
        return np.zeros(length, dtype=bool)  # as T5
    original_length = length
    length = max(length, 2)
    num_noise, num_spans = noise_counts(length, noise_density, mean_noise_span_length)
    num_nonnoise = length - num_noise
    noise_lengths = _random_segmentation(num_noise, num_spans, rng)
    nonnoise_lengths = _random_segmentation(num_nonnoise, num_spans, rng)
    interleaved = np.stack([nonnoise_lengths, noise_lengths], axis=1).reshape(-1)
    span_starts = np.cumsum(interleaved)[:-1]
    start_indicator = np.zeros(length, dtype=np.int64)
    start_indicator[span_starts] = 1
    is_noise = np.cumsum(start_indicator) % 2 == 1
    return is_noise[:original_length]


def noise_span_to_unique_sentinel(tokens: np.ndarray, noise_mask: np.ndarray,
                                  vocab_size: int) -> np.ndarray:
    """Replaces each noise span by one sentinel: ``<extra_id_0>`` = ``vocab_size - 1``, then down."""
    previous = np.concatenate([[False], noise_mask[:-1]])
    first_noise = noise_mask & ~previous
    subsequent_noise = noise_mask & previous
    sentinels = vocab_size - np.cumsum(first_noise)
    out = np.where(first_noise, sentinels, tokens)
    return out[~subsequent_noise].astype(tokens.dtype)


def nonnoise_span_to_unique_sentinel(tokens: np.ndarray, noise_mask: np.ndarray,
                                     vocab_size: int) -> np.ndarray:
    return noise_span_to_unique_sentinel(tokens, ~noise_mask, vocab_size)


def span_corruption(tokens: np.ndarray, rng: np.random.Generator, *, vocab_size: int,
                    eos_id: int, noise_density: float = 0.15,
                    mean_noise_span_length: float = 3.0,
                    num_sentinels: int = 100) -> dict[str, np.ndarray]:
    """T5's objective: noise spans become sentinels in ``inputs``; ``targets`` spell them out.

    Both end with EOS. Replacing sentinel ``k`` in inputs by the tokens that follow
    sentinel ``k`` in targets gives back ``tokens``. More spans than sentinels is an
    error (T5 would silently reuse ordinary token ids as sentinels).
    """
    tokens = np.asarray(tokens, dtype=np.int32)
    if tokens.size == 0:
        raise ValueError("span_corruption got an empty example; filter empty documents first.")
    noise_mask = random_spans_noise_mask(tokens.size, noise_density, mean_noise_span_length, rng)
    num_spans = int(np.sum(noise_mask & ~np.concatenate([[False], noise_mask[:-1]])))
    if num_spans > num_sentinels:
        raise ValueError(
            f"Span corruption of {tokens.size} tokens makes {num_spans} noise spans but the "
            f"vocabulary has only {num_sentinels} sentinels; use shorter inputs, a lower "
            "noise_density or a longer mean_noise_span_length.")
    eos = np.array([eos_id], dtype=np.int32)
    return {
        "inputs": np.concatenate([noise_span_to_unique_sentinel(tokens, noise_mask, vocab_size), eos]),
        "targets": np.concatenate([nonnoise_span_to_unique_sentinel(tokens, noise_mask, vocab_size), eos]),
    }



@dataclasses.dataclass(frozen=True)
class SpanCorruption(ExampleStep):
    """``key`` tokens (a chunk of ``span_corruption_tokens_length``) -> T5 inputs/targets.

    Chunk with ``ConcatenateAndSplit(length=span_corruption_tokens_length())`` first,
    so that inputs come out exactly ``task_feature_lengths["inputs"]`` long.
    """

    noise_density: float = 0.15
    mean_noise_span_length: float = 3.0
    key: str = "targets"

    def check(self, ctx):
        require_sentinels(ctx, "span corruption")
        span_corruption_tokens_length(self.noise_density, self.mean_noise_span_length)(ctx)

    def map(self, example, rng, ctx):
        vocab = ctx.vocabulary("inputs")
        tokens = np.asarray(example[self.key], np.int32)
        if tokens.size == 0:
            return None
        return span_corruption(tokens, rng, vocab_size=vocab.vocab_size, eos_id=vocab.eos_id,
                               noise_density=self.noise_density,
                               mean_noise_span_length=self.mean_noise_span_length,
                               num_sentinels=vocab.extra_ids)


def require_sentinels(ctx, objective: str) -> None:
    """One message for a vocabulary without sentinels (GPT-2's or BERT's tokenizer)."""
    vocabulary = ctx.vocabulary("inputs")
    if not vocabulary.extra_ids:
        raise ValueError(
            f"Task {ctx.task_name!r}: {objective} replaces spans by sentinel tokens "
            f"<extra_id_N>, and the vocabulary {vocabularies.describe(vocabulary)} has none. "
            "Use a vocabulary with sentinels (a T5 tokenizer, or the built-in SentencePiece "
            "one), or an objective without them (causal LM, masked LM).")


def span_corruption_tokens_length(noise_density: float = 0.15,
                                  mean_noise_span_length: float = 3.0):
    """``fn(ctx)``: raw tokens per example for T5's lengths; a clear error if targets are short."""

    def fn(ctx) -> int:
        lengths = ctx.task_feature_lengths
        tokens_length, targets_length = random_spans_helper(
            ctx.length("inputs"), noise_density, mean_noise_span_length)
        if targets_length > ctx.length("targets"):
            raise ValueError(
                f"Span corruption with inputs={lengths['inputs']} makes targets of "
                f"{targets_length} tokens, longer than targets={lengths['targets']}; set "
                f"task_feature_lengths.targets to at least {targets_length}.")
        return tokens_length

    fn.__qualname__ = f"span_corruption_tokens_length({noise_density}, {mean_noise_span_length})"
    return fn
