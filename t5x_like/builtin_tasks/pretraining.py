"""Built-in tasks on the corpus embedded in ``data/``. Importing registers them.

One task per pretraining objective, all on the same English text and 8k
SentencePiece vocabulary, plus a byte-level multilingual span-corruption
mixture. TFDS tasks (C4, Wikipedia, mC4) live in ``tfds_tasks``.
"""

from __future__ import annotations

import functools

from t5x_like.data import embedded, sources, vocabularies
from t5x_like.data import preprocessors as pp
from t5x_like.data.dataset_providers import Feature, MixtureRegistry, TaskRegistry

NOISE_DENSITY = 0.15
MEAN_NOISE_SPAN_LENGTH = 3.0


@functools.cache
def embedded_vocabulary() -> vocabularies.SentencePieceVocabulary:
    return vocabularies.SentencePieceVocabulary(embedded.vocab_model_path(),
                                                extra_ids=embedded.NUM_EXTRA_IDS)


@functools.cache
def byte_vocabulary() -> vocabularies.ByteVocabulary:
    return vocabularies.ByteVocabulary()


class _LazyVocabulary:
    """Loads the SentencePiece model on first use, so importing the registry is cheap."""

    def __init__(self, factory):
        self._factory = factory

    def __getattr__(self, name):
        if name.startswith("__") or name == "_factory":
            raise AttributeError(name)  # keeps pickling (worker processes) working
        return getattr(self._factory(), name)


def features(*names: str, vocabulary=None, add_eos: bool = True) -> dict[str, Feature]:
    vocab = vocabulary or _LazyVocabulary(embedded_vocabulary)
    return {name: Feature(vocab, add_eos=add_eos) for name in names}


def english_source(lines_per_document: int = 1) -> sources.TextFilesSource:
    return sources.TextFilesSource(tuple(embedded.english_files()),
                                   lines_per_document=lines_per_document)


def embedded_en_documents(split: str) -> list[str]:
    """The English documents of a split, as text (vocabulary training reads these)."""
    return [example["text"] for example in english_source().get(split)]


TEXT_TO_TARGETS = pp.Rekey({"targets": "text"})
# Where the preprocessing cache ends (python -m t5x_like.cache_tasks): the steps before it
# are deterministic; chunking and the objective's random choices run online. The marker
# takes no step number, so it changes no output.
CACHE = pp.CacheMarker()


def span_corruption_steps(density=NOISE_DENSITY, mean_span=MEAN_NOISE_SPAN_LENGTH) -> list:
    return [TEXT_TO_TARGETS, pp.Tokenize(), CACHE,
            pp.ConcatenateAndSplit("targets", pp.span_corruption_tokens_length(density, mean_span)),
            pp.SpanCorruption(density, mean_span)]


def mlm_steps(**masking) -> list:
    return [TEXT_TO_TARGETS, pp.Tokenize(), CACHE,
            pp.ConcatenateAndSplit("targets", pp.mlm_chunk_length), pp.MaskedLM(**masking)]


def lm_steps() -> list:
    return [TEXT_TO_TARGETS, pp.Tokenize(), pp.AppendEos(), CACHE,
            pp.ConcatenateAndSplit("targets", lambda ctx: ctx.length("targets"))]


def prefix_lm_steps() -> list:
    return [TEXT_TO_TARGETS, pp.Tokenize(), pp.AppendEos(), CACHE,
            pp.ConcatenateAndSplit("targets", pp.prefix_lm_chunk_length), pp.PrefixLM()]


def denoise_steps(variant: str) -> list:
    return [TEXT_TO_TARGETS, pp.Tokenize(), CACHE,
            pp.ConcatenateAndSplit("targets", pp.length_minus_eos("inputs")),
            pp.Denoise(variant), pp.Truncate()]


def bart_steps() -> list:
    return [TEXT_TO_TARGETS, pp.Tokenize(), CACHE,
            pp.ConcatenateAndSplit("targets", pp.length_minus_eos("targets")), pp.BartNoise()]


CORPUS = "the embedded English corpus (Austen, Shakespeare, KJV and WEB Bibles)"


def _register_english() -> None:
    add = TaskRegistry.add
    add("embedded_en_span_corruption", english_source(), span_corruption_steps(),
        features("inputs", "targets"),
        description=f"T5 span corruption (density 0.15, mean span 3, unique sentinels) on {CORPUS}.")
    add("embedded_en_mlm", english_source(), mlm_steps(), features("inputs", "targets"),
        description=f"BERT masked LM (15%, 80/10/10, [CLS] x [SEP]) on {CORPUS}. "
                    "Lengths: inputs (targets = inputs).")
    add("embedded_en_mlm_whole_word", english_source(), mlm_steps(whole_word=True),
        features("inputs", "targets"), description=f"BERT whole-word masked LM on {CORPUS}.")
    add("embedded_en_span_mlm", english_source(), mlm_steps(span_masking=True),
        features("inputs", "targets"),
        description=f"SpanBERT span masking (geometric p=0.2, <= 10 words, 15%) on {CORPUS}.")
    add("embedded_en_electra", english_source(), mlm_steps(mask_rate=0.85, random_rate=0.0),
        features("inputs", "targets"),
        description=f"ELECTRA pretraining batches: 15% of tokens selected, 85% of those "
                    f"[MASK], the rest kept ([CLS] x [SEP]) on {CORPUS}; the generator's "
                    "samples replace them in the model (models.electra).")
    add("embedded_en_mlm_nsp", english_source(lines_per_document=8),
        [pp.NextSentencePairs(), pp.MaskedLM(add_cls_sep=False)], features("inputs", "targets"),
        description=f"BERT MLM + next-sentence pairs; documents are 8 consecutive lines of {CORPUS}.")
    add("embedded_en_lm", english_source(), lm_steps(), features("targets"),
        description=f"Causal LM over concatenated documents (each ends with EOS) of {CORPUS}.")
    add("embedded_en_prefix_lm", english_source(), prefix_lm_steps(),
        features("inputs", "targets"),
        description=f"Prefix LM: a random split of each chunk into inputs and targets, {CORPUS}.")
    add("embedded_en_bart", english_source(), bart_steps(), features("inputs", "targets"),
        description=f"BART noising (30% text infilling, Poisson(3) spans, sentence permutation) "
                    f"on {CORPUS}.")
    for variant in ("iid_replace_spans", "iid_drop", "bert_style", "mass_style", "deshuffle"):
        add(f"embedded_en_{variant}", english_source(), denoise_steps(variant),
            features("inputs", "targets"),
            description=f"T5-paper seq2seq objective {variant!r} on {CORPUS}.")


def _register_multilingual() -> None:
    """Byte-level (ByT5) span corruption per language, mixed with XLM-R temperature 0.3."""
    byte_features = features("inputs", "targets", vocabulary=byte_vocabulary())
    language_sources = {
        "en": english_source(),
        "es": sources.TextFilesSource((embedded.multilingual_bible("es"),)),
        "ja": sources.TextFilesSource((embedded.multilingual_bible("ja"),)),
        "udhr": sources.JsonlSource((embedded.udhr_path(),), holdout_every=10),
    }
    TaskRegistry.add("embedded_bytes_en_lm", english_source(), lm_steps(),
                     features("targets", vocabulary=byte_vocabulary()),
                     description=f"Byte-level causal LM of {CORPUS}: a 384-id vocabulary, so "
                                 "tiny models are not mostly embedding (scaling sweeps).")
    names = []
    for language, source in language_sources.items():
        name = f"embedded_bytes_{language}_span_corruption"
        TaskRegistry.add(name, source, span_corruption_steps(), byte_features,
                         description=f"ByT5-style byte span corruption on the embedded {language} "
                                     "text" + (" (UDHR, 438 languages)" if language == "udhr" else ""))
        names.append(name)
    MixtureRegistry.add("embedded_multilingual_span_corruption", names, temperature_alpha=0.3,
                        description="English, Spanish, Japanese and UDHR byte span corruption, "
                                    "sampled q_i ∝ p_i^0.3 (XLM-R).")


def _register_builtin_tasks() -> None:
    if "embedded_en_span_corruption" in TaskRegistry.names():
        return
    _register_english()
    _register_multilingual()


_register_builtin_tasks()
