"""Preprocessors: pure numpy algorithms, and the pipeline steps that apply them.

Lower-case names are algorithms ``(tokens, rng, ...) -> arrays``; CamelCase
names are configured steps for ``TaskRegistry.add(preprocessors=[...])``.
"""

from t5x_like.data.preprocessors.bart import (
    BartNoise,
    document_rotation,
    sentence_permutation,
    text_infilling,
    token_deletion,
    token_masking,
)
from t5x_like.data.preprocessors.base import (
    CacheMarker,
    Context,
    ExampleStep,
    FunctionStep,
    Step,
    StreamStep,
    apply_steps,
    as_step,
)
from t5x_like.data.preprocessors.denoising import Denoise, denoise, iid_noise_mask
from t5x_like.data.preprocessors.language_modeling import (
    ConcatenateAndSplit,
    PrefixLM,
    length_minus_eos,
    prefix_lm_chunk_length,
    prefix_lm_split,
)
from t5x_like.data.preprocessors.masked_lm import (
    MaskedLM,
    bert_mask,
    mlm_chunk_length,
    select_spans,
    select_tokens,
    select_whole_words,
)
from t5x_like.data.preprocessors.sentence_pairs import NextSentencePairs, next_sentence_pair
from t5x_like.data.preprocessors.span_corruption import (
    SpanCorruption,
    noise_span_to_unique_sentinel,
    nonnoise_span_to_unique_sentinel,
    random_spans_helper,
    random_spans_noise_mask,
    span_corruption,
    span_corruption_tokens_length,
)
from t5x_like.data.preprocessors.templates import ApplyTemplates, Template
from t5x_like.data.preprocessors.text import AppendEos, Filter, Rekey, Tokenize, Truncate

__all__ = [
    "AppendEos", "ApplyTemplates", "BartNoise", "CacheMarker", "ConcatenateAndSplit", "Context", "Denoise",
    "ExampleStep", "Filter", "FunctionStep", "MaskedLM", "NextSentencePairs", "PrefixLM", "Rekey",
    "SpanCorruption", "Step", "StreamStep", "Tokenize", "Truncate", "apply_steps", "as_step",
    "bert_mask", "denoise", "document_rotation", "iid_noise_mask", "length_minus_eos",
    "mlm_chunk_length", "next_sentence_pair", "noise_span_to_unique_sentinel",
    "nonnoise_span_to_unique_sentinel", "prefix_lm_chunk_length", "prefix_lm_split",
    "random_spans_helper", "random_spans_noise_mask", "select_spans", "select_tokens",
    "select_whole_words", "sentence_permutation", "span_corruption",
    "span_corruption_tokens_length", "Template", "text_infilling", "token_deletion", "token_masking",
]
