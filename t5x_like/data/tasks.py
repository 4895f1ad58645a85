"""Built-in tasks on the corpus embedded in ``data/``. Importing registers them."""

from __future__ import annotations

import functools

from t5x_like.data import embedded, preprocessors, sources, vocabularies
from t5x_like.data.dataset_providers import Task, TaskRegistry

NOISE_DENSITY = 0.15
MEAN_NOISE_SPAN_LENGTH = 3.0


@functools.lru_cache(maxsize=None)
def embedded_vocabulary() -> vocabularies.SentencePieceVocabulary:
    return vocabularies.SentencePieceVocabulary(embedded.vocab_model_path(),
                                                extra_ids=embedded.NUM_EXTRA_IDS)


def embedded_en_documents(split: str) -> list[str]:
    return sources.TextLineSource(embedded.english_files(), split=split).documents()


def _span_corruption_chunk_length(lengths) -> int:
    tokens_length, targets_length = preprocessors.random_spans_helper(
        lengths["inputs"], NOISE_DENSITY, MEAN_NOISE_SPAN_LENGTH)
    if targets_length > lengths["targets"]:
        raise ValueError(
            f"Span corruption with inputs={lengths['inputs']} makes targets of "
            f"{targets_length} tokens, longer than targets={lengths['targets']}; set "
            f"task_feature_lengths.targets to at least {targets_length}.")
    return tokens_length


def _span_corruption_example(tokens, rng, vocab):
    return preprocessors.span_corruption(
        tokens, rng, vocab_size=vocab.vocab_size, eos_id=vocab.eos_id,
        noise_density=NOISE_DENSITY, mean_noise_span_length=MEAN_NOISE_SPAN_LENGTH)


def _register_builtin_tasks() -> None:
    if "embedded_en_span_corruption" in TaskRegistry.names():
        return
    TaskRegistry.add(Task(
        name="embedded_en_span_corruption",
        documents_fn=embedded_en_documents,
        vocabulary_fn=embedded_vocabulary,
        chunk_length_fn=_span_corruption_chunk_length,
        example_fn=_span_corruption_example,
        description="T5 span corruption (density 0.15, mean span 3, unique sentinels) on "
                    "the embedded English corpus (Austen, Shakespeare, KJV and WEB Bibles).",
    ))


_register_builtin_tasks()
