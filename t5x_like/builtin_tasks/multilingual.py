"""Multilingual pretraining tasks (XLM-R, mBART) on the multilingual SentencePiece vocabulary.

Importing registers them; no file is read until a split is asked for.

================================  ==============================================================
name                              what
================================  ==============================================================
``multilingual_{L}_mlm``          masked LM ([CLS] x [SEP], 15 %, 80/10/10) on language L's text
``multilingual_mlm``              XLM-R: the four, sampled q_i ∝ p_i^0.3 (p_i: share of characters)
``multilingual_{L}_mbart``        BART noising (30 % infilling, sentence permutation), then
                                  mBART's language ids: inputs ``noised </s> <L>``, targets
                                  ``text </s> <L>`` (the model starts the decoder with ``<L>``)
``multilingual_mbart``            mBART: the four, sampled q_i ∝ p_i^0.7 (the mBART paper's α)
``multilingual_bible_en_es``      WEB verse -> RV1909 verse, mBART's format: inputs
                                  ``en </s> en_XX``, targets ``es </s> es_XX``; bleu, chrf
``multilingual_bible_es_en``      the reverse
``multilingual_udhr_langid``      ``embedded_udhr_langid`` (same splits) on this vocabulary,
                                  inputs without the ``language:`` prefix (for a classifier head)
``embedded_bible_es_en``          ``embedded_bible_en_es`` reversed, on the English 8k vocabulary
================================  ==============================================================

Languages L: ``en`` (the English corpus), ``es`` and ``ja`` (the Bibles in ``data/multi``)
and ``udhr`` (every UDHR translation: about 400 languages, one shared language id
``xx_XX``). The vocabulary is ``data/vocab/multilingual_8k.model``
(``python -m t5x_like.train_vocab --multilingual``).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import sentencepiece as spm

from t5x_like import metrics
from t5x_like.builtin_tasks import bench as bench_tasks
from t5x_like.builtin_tasks.pretraining import CACHE, TEXT_TO_TARGETS, _LazyVocabulary, english_source, features
from t5x_like.data import embedded, sources, vocabularies
from t5x_like.data import preprocessors as pp
from t5x_like.data.dataset_providers import MixtureRegistry, TaskRegistry, temperature_probabilities
from t5x_like.data.preprocessors.text import check_minimum_length

LANGUAGES = ("en", "es", "ja", "udhr")
XLMR_ALPHA = 0.3
MBART_ALPHA = 0.7
VOCAB_MODEL = "vocab/multilingual_8k.model"
# mBART's language-id pieces (fairseq's codes); every UDHR language shares ``xx_XX``.
LANGUAGE_TOKENS = {"en": "en_XX", "es": "es_XX", "ja": "ja_XX", "udhr": "xx_XX"}


def vocab_model_path() -> str:
    return embedded.path(VOCAB_MODEL)


@functools.cache
def multilingual_vocabulary() -> vocabularies.SentencePieceVocabulary:
    return vocabularies.SentencePieceVocabulary(vocab_model_path(),
                                                extra_ids=embedded.NUM_EXTRA_IDS)


@functools.cache
def _piece_ids(model_path: str) -> dict[str, int]:
    sp = spm.SentencePieceProcessor(model_file=model_path)
    return {piece: sp.piece_to_id(piece) for piece in LANGUAGE_TOKENS.values()}


def language_id(language: str, model_path: str | None = None) -> int:
    """The id of language ``language``'s token (``en`` -> ``en_XX``) in the vocabulary."""
    piece = LANGUAGE_TOKENS[language]
    piece_id = _piece_ids(model_path or vocab_model_path())[piece]
    if piece_id == vocabularies.UNK_ID:
        raise ValueError(f"{model_path or vocab_model_path()} has no {piece} piece; retrain it "
                         "with `python -m t5x_like.train_vocab --multilingual`.")
    return piece_id


def multilingual_features(*names: str, add_eos: bool = True):
    return features(*names, vocabulary=_LazyVocabulary(multilingual_vocabulary), add_eos=add_eos)


def language_source(language: str) -> sources.Source:
    if language == "en":
        return english_source()
    if language == "udhr":
        return sources.JsonlSource((embedded.udhr_path(),), holdout_every=10)
    return sources.TextFilesSource((embedded.multilingual_bible(language),))


# -- sampling rates ---------------------------------------------------------------------------

@functools.cache
def _characters(task_name: str, split: str) -> int:
    return sum(len(example["text"]) for example in TaskRegistry.get(task_name).source.get(split))


def character_temperature_rates(task_names, alpha: float, size_fn=_characters) -> list:
    """``[(task, rate)]`` with rate(split) = q_i over the tasks' characters in that split:
    XLM-R's p_i is a language's share of the data, and documents differ in length across
    languages (a UDHR translation is one 3,000-character record, a verse ~100), so
    characters, not examples (``temperature_rates``), measure it."""
    names = tuple(task_names)

    def rate_for(name):
        def rate(split: str) -> float:
            return temperature_probabilities({n: size_fn(n, split) for n in names}, alpha)[name]
        return rate
    return [(name, rate_for(name)) for name in names]


# -- mBART's language ids ----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AppendLanguageId(pp.ExampleStep):
    """mBART's layout: each of ``keys`` (already ending with EOS) becomes
    ``tokens </s> <lang>``, trimmed first so the language id always fits its length.
    ``languages`` maps key -> language (``{"inputs": "en", "targets": "es"}``); a
    plain ``language`` sets every key's."""

    uses_rng = False
    may_drop = False

    language: str = ""
    languages: tuple = ()
    keys: tuple = ("inputs", "targets")

    def map(self, example, rng, ctx):
        by_key = dict(self.languages)
        out = dict(example)
        for key in self.keys:
            vocab = ctx.vocabulary(key)
            lang = language_id(by_key.get(key, self.language), vocabularies.model_file(vocab))
            tokens = np.asarray(example[key], np.int32)
            length = ctx.task_feature_lengths.get(key)
            if length is not None and tokens.size > length - 1:
                tokens = tokens[:length - 1].copy()
                tokens[-1] = vocab.eos_id
            out[key] = np.concatenate([tokens, [lang]]).astype(np.int32)
        return out


def mbart_chunk_length(ctx) -> int:
    """targets - 2: room for </s> and the language id."""
    return check_minimum_length(ctx, "targets", 3, "an mBART example (x </s> <lang>)") - 2


def mbart_steps(language: str) -> list:
    return [TEXT_TO_TARGETS, pp.Tokenize(), CACHE,
            pp.ConcatenateAndSplit("targets", mbart_chunk_length), pp.BartNoise(),
            AppendLanguageId(language=language)]


def mlm_steps() -> list:
    return [TEXT_TO_TARGETS, pp.Tokenize(), CACHE,
            pp.ConcatenateAndSplit("targets", pp.mlm_chunk_length), pp.MaskedLM()]


# -- translation and language id -----------------------------------------------------------------

EN_ES_PREFIX = "translate English to Spanish: "
ES_EN_PREFIX = "translate Spanish to English: "


def _en_es_pairs(split: str) -> list[dict]:
    """(english, spanish, key) of ``embedded_bible_en_es``'s split."""
    examples = bench_tasks._load_split(
        bench_tasks.bible_en_es_examples,
        (bench_tasks._data_file(embedded.WEB_BIBLE), bench_tasks._spanish_path), split)
    return [{"english": ex["inputs"][len(EN_ES_PREFIX):], "spanish": ex["targets"],
             "key": ex["key"]} for ex in examples]


def bible_translation_examples(direction: str, split: str) -> list[dict]:
    """``en_es`` or ``es_en`` pairs with bare texts (mBART's format adds the ids)."""
    source, target = ("english", "spanish") if direction == "en_es" else ("spanish", "english")
    return [{"inputs": pair[source], "targets": pair[target], "key": pair["key"]}
            for pair in _en_es_pairs(split)]


def embedded_es_en_examples(split: str) -> list[dict]:
    return [{"inputs": ES_EN_PREFIX + pair["spanish"], "targets": pair["english"],
             "key": pair["key"]} for pair in _en_es_pairs(split)]


def udhr_langid_examples(split: str) -> list[dict]:
    examples = bench_tasks._load_split(bench_tasks.udhr_langid_examples,
                                       (embedded.udhr_path,), split)
    prefix = "language: "
    return [dict(ex, inputs=ex["inputs"][len(prefix):]) for ex in examples]


def translation_steps(source_language: str, target_language: str) -> list:
    return [pp.Tokenize(copy_pretokenized=True), pp.AppendEos(), pp.Truncate(),
            AppendLanguageId(languages=(("inputs", source_language),
                                        ("targets", target_language)))]


# -- registration ---------------------------------------------------------------------------------

def _register() -> None:
    if "multilingual_en_mlm" in TaskRegistry.names():
        return
    add = TaskRegistry.add
    text = multilingual_features("inputs", "targets")
    for language in LANGUAGES:
        where = "UDHR, ~400 languages" if language == "udhr" else f"{language} text"
        add(f"multilingual_{language}_mlm", language_source(language), mlm_steps(), text,
            description=f"XLM-R masked LM (15%, 80/10/10) on the embedded {where}, "
                        "multilingual 8k vocabulary.")
        add(f"multilingual_{language}_mbart", language_source(language), mbart_steps(language),
            text, description=f"mBART denoising (30% infilling, sentence permutation) with the "
                              f"language id {LANGUAGE_TOKENS[language]} on the embedded {where}.")
    MixtureRegistry.add(
        "multilingual_mlm",
        character_temperature_rates([f"multilingual_{lang}_mlm" for lang in LANGUAGES],
                                    XLMR_ALPHA),
        description=f"XLM-R: masked LM per language, q_i ∝ p_i^{XLMR_ALPHA} over characters.")
    MixtureRegistry.add(
        "multilingual_mbart",
        character_temperature_rates([f"multilingual_{lang}_mbart" for lang in LANGUAGES],
                                    MBART_ALPHA),
        description=f"mBART: denoising per language, q_i ∝ p_i^{MBART_ALPHA} over characters.")
    for direction, (src, tgt) in (("en_es", ("en", "es")), ("es_en", ("es", "en"))):
        add(f"multilingual_bible_{direction}",
            sources.FunctionSource(functools.partial(bible_translation_examples, direction),
                                   splits=bench_tasks.SPLITS),
            translation_steps(src, tgt), text, postprocess_fn=bench_tasks.text_postprocess,
            metric_fns=[metrics.bleu, metrics.chrf],
            description=f"embedded_bible_en_es's verses, {src} -> {tgt}, mBART's format "
                        f"(inputs x </s> {LANGUAGE_TOKENS[src]}, targets y </s> "
                        f"{LANGUAGE_TOKENS[tgt]}).")
    add("multilingual_udhr_langid",
        sources.FunctionSource(udhr_langid_examples, splits=bench_tasks.SPLITS),
        bench_tasks.steps(), text, postprocess_fn=bench_tasks.text_postprocess,
        metric_fns=[metrics.accuracy, metrics.macro_f1],
        description="embedded_udhr_langid (same splits) on the multilingual vocabulary; "
                    "inputs are the bare paragraph.")
    add("embedded_bible_es_en",
        sources.FunctionSource(embedded_es_en_examples, splits=bench_tasks.SPLITS),
        bench_tasks.steps(), features("inputs", "targets"),
        postprocess_fn=bench_tasks.text_postprocess, metric_fns=[metrics.bleu, metrics.chrf],
        description="RV1909 verse -> WEB verse: embedded_bible_en_es reversed.")


_register()
