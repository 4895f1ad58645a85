"""The corpus and vocabulary embedded in the repository's ``data/`` folder.

They make the quickstart and the tests run offline. An installed wheel carries its own
copy (``t5x_like.resources``); ``T5X_LIKE_DATA_DIR`` points at another.
"""

from __future__ import annotations

import pathlib

from t5x_like import resources

ENGLISH_FILES = ("en/austen.txt.gz", "en/kjv_bible.txt.gz",
                 "en/shakespeare.txt.gz", "en/web_bible.txt.gz")
VOCAB_MODEL = "vocab/embedded_en_8k.model"
# Sentinels are appended after the SentencePiece pieces, T5-style, so the
# whole id range is 8192 = 8092 pieces + 100 sentinels (a multiple of 128).
NUM_EXTRA_IDS = 100
SENTENCEPIECE_SIZE = 8192 - NUM_EXTRA_IDS


def data_dir() -> pathlib.Path:
    return resources.data_dir()


def english_files() -> list[str]:
    return [str(data_dir() / name) for name in ENGLISH_FILES]


def vocab_model_path() -> str:
    return str(data_dir() / VOCAB_MODEL)


# Multilingual samples (see data/README.md): language -> files.
MULTILINGUAL_BIBLES = {"es": "multi/spa_rv1909_bible_every4th.txt.gz",
                       "ja": "multi/jpn_kougo_bible_every4th.txt.gz"}
UDHR = "multi/udhr_3k.jsonl.gz"


def multilingual_bible(language: str) -> str:
    return str(data_dir() / MULTILINGUAL_BIBLES[language])


def udhr_path() -> str:
    return str(data_dir() / UDHR)


# Labelled data for the benchmark tasks (``bench_tasks``; see data/README.md).
SPAM = "labeled/spam_2k.jsonl.gz"
UD_EN_EWT = {"train": "labeled/ud_en_ewt/en_ewt-ud-train.conllu.gz",
             "validation": "labeled/ud_en_ewt/en_ewt-ud-dev.conllu.gz",
             "test": "labeled/ud_en_ewt/en_ewt-ud-test.conllu.gz"}
AUSTEN, KJV_BIBLE, WEB_BIBLE = "en/austen.txt.gz", "en/kjv_bible.txt.gz", "en/web_bible.txt.gz"


def path(name: str) -> str:
    """A file of the data folder by its name relative to it (``"en/austen.txt.gz"``)."""
    return str(data_dir() / name)


def spam_path() -> str:
    return path(SPAM)


def ud_en_ewt_path(split: str) -> str:
    return path(UD_EN_EWT[split])
