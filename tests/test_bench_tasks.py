"""The embedded benchmark tasks (``t5x_like.builtin_tasks.bench``) and ``embedded_bench``."""

import collections
import hashlib
import itertools
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import t5x_like.data as td
from t5x_like import metrics
from t5x_like.builtin_tasks import bench as bt
from t5x_like.data import embedded, sources

REPO = pathlib.Path(__file__).resolve().parents[1]

# The sizes data/README.md documents.
SIZES = {
    "embedded_spam": {"train": 4723, "validation": 591, "test": 592},
    "embedded_ud_pos": {"train": 12193, "validation": 1924, "test": 2077},
    "embedded_bible_paraphrase": {"train": 6000, "validation": 600, "test": 600},
    "embedded_bible_en_es": {"train": 5000, "validation": 500, "test": 500},
    "embedded_udhr_langid": {"train": 5113, "validation": 800, "test": 796},
    "embedded_austen_cloze": {"train": 2000, "validation": 156, "test": 187},
}


def split_examples(name, split):
    return td.TaskRegistry.get(name).source.get(split)


def digest(names=bt.TASKS) -> str:
    """SHA-256 over every example of every split, in order."""
    h = hashlib.sha256()
    for name in names:
        for split in bt.SPLITS:
            for example in split_examples(name, split):
                h.update(json.dumps(example, sort_keys=True, ensure_ascii=False).encode())
    return h.hexdigest()


def test_tasks_and_mixture_are_registered():
    for name in bt.TASKS:
        task = td.TaskRegistry.get(name)
        assert task.splits == ("train", "validation", "test") and task.has_metrics
    assert td.TaskRegistry.get("embedded_spam").label_options == ("ham", "spam")
    assert td.TaskRegistry.get("embedded_bible_paraphrase").label_options == (
        "not_equivalent", "equivalent")
    assert td.TaskRegistry.get("embedded_udhr_langid").label_options == ()
    mixture = td.MixtureRegistry.get("embedded_bench")
    assert sorted(name for name, _ in mixture.components) == sorted(bt.TASKS)


@pytest.mark.parametrize("name", bt.TASKS)
def test_splits_have_the_documented_sizes_and_share_no_inputs(name):
    inputs = {}
    for split in bt.SPLITS:
        examples = split_examples(name, split)
        assert len(examples) == SIZES[name][split], (name, split)
        for example in examples:
            assert example["inputs"] == " ".join(example["inputs"].split())  # normalised
            assert example["targets"] and example["targets"] == example["targets"].strip()
        inputs[split] = {example["inputs"] for example in examples}
    for a, b in itertools.combinations(bt.SPLITS, 2):
        assert not inputs[a] & inputs[b], (name, a, b)


SUBPROCESS = """
import os
import t5x_like.builtin_tasks  # registered with T5X_LIKE_DATA_DIR pointing nowhere: reads no file
import t5x_like.data as td
try:
    td.TaskRegistry.get("embedded_spam").source.get("train")
except FileNotFoundError:
    print("lazy")
del os.environ["T5X_LIKE_DATA_DIR"]  # paths are resolved when a split is first read
from tests.test_bench_tasks import digest
print(digest())
"""


def test_import_reads_no_file_and_a_new_process_builds_the_same_splits(tmp_path):
    """A fresh process with another str hash seed builds byte-identical splits (no
    dependence on set order), and importing the registry reads no data file."""
    env = dict(os.environ, PYTHONHASHSEED="12345", T5X_LIKE_DATA_DIR=str(tmp_path / "none"))
    out = subprocess.run([sys.executable, "-c", SUBPROCESS], env=env, capture_output=True,
                         text=True, check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.stdout.split()[-2:] == ["lazy", digest()]


def test_spam_examples_and_postprocessor():
    train = split_examples("embedded_spam", "train")
    assert all(ex["inputs"].startswith("spam: Subject:") for ex in train)
    assert collections.Counter(ex["targets"] for ex in train) == {"ham": 3286, "spam": 1437}
    assert all(bt.SPAM_LABELS[ex["label"]] == ex["targets"] for ex in train)
    # A fair first page: the file is sorted by label, the split is not.
    assert {ex["targets"] for ex in train[:20]} == {"ham", "spam"}
    post = td.TaskRegistry.get("embedded_spam").postprocess
    assert [post(t) for t in ("ham", " spam\n", "Spam", "eggs", "")] == [0, 1, 1, -1, -1]
    assert post(b"spam", is_target=True) == 1
    scores = metrics.f1_score_with_invalid([1, 0, 1], [post("spam"), post("ham"), post("?")])
    assert scores["f1"] == pytest.approx(100 * 2 / 3)


def test_ud_pos_words_and_tags_align():
    assert bt.UPOS_TAGS == tuple(sorted(bt.UPOS_TAGS)) and len(bt.UPOS_TAGS) == 17
    for split in bt.SPLITS:
        for ex in split_examples("embedded_ud_pos", split):
            assert len(ex["words"]) == len(ex["tags"]) > 0
            assert ex["inputs"] == "pos: " + " ".join(ex["words"])
            assert ex["targets"] == " ".join(ex["tags"])
    train_tags = {t for ex in split_examples("embedded_ud_pos", "train") for t in ex["tags"]}
    assert train_tags == set(bt.UPOS_TAGS)
    # "Don't" is the multiword token 1-2 over the words "Do" "n't" (EWT's convention).
    first = next(ex for ex in split_examples("embedded_ud_pos", "test")
                 if ex["words"][:3] == ["Do", "n't", "worry"])
    assert first["tags"][:3] == ["AUX", "PART", "VERB"]
    assert metrics.token_accuracy(["DET NOUN", "VERB"], ["DET VERB", ""])["token_accuracy"] == (
        pytest.approx(100 / 3))


def test_paraphrase_is_balanced_with_neighbouring_negatives():
    post = td.TaskRegistry.get("embedded_bible_paraphrase").postprocess
    for split in bt.SPLITS:
        examples = split_examples("embedded_bible_paraphrase", split)
        labels = collections.Counter(ex["label"] for ex in examples)
        assert labels[0] == labels[1] == len(examples) // 2
        for ex in examples:
            assert post(ex["targets"]) == ex["label"]
            kjv_book, kjv_cv = ex["kjv_key"].rsplit(" ", 1)
            web_book, web_cv = ex["web_key"].rsplit(" ", 1)
            (kc, kv), (wc, wv) = (map(int, kjv_cv.split(":")), map(int, web_cv.split(":")))
            assert bt.chapter_split(kjv_book, kc) == split
            if ex["label"]:
                assert ex["kjv_key"] == ex["web_key"]
            else:
                assert (kjv_book, kc) == (web_book, wc) and abs(kv - wv) == 1
    assert [post(t) for t in ("equivalent", "not_equivalent", "maybe")] == [1, 0, -1]


def test_en_es_pairs_stay_in_their_chapter_split():
    for split in bt.SPLITS:
        for ex in split_examples("embedded_bible_en_es", split):
            book, cv = ex["key"].rsplit(" ", 1)
            chapter = int(cv.split(":")[0])
            assert bt.chapter_split(book, chapter) == split
            assert (book, chapter) not in bt.MISALIGNED_SPANISH_CHAPTERS
            assert ex["inputs"].startswith("translate English to Spanish: ")
    target = "Y dijo Dios: Sea la luz: y fué la luz."
    assert metrics.bleu([target], [target])["bleu"] == pytest.approx(100)
    assert 0 < metrics.chrf([target], ["Y dijo Dios: sea la luz"])["chrf"] < 100


def test_udhr_every_language_in_every_split():
    languages = {split: {ex["targets"] for ex in split_examples("embedded_udhr_langid", split)}
                 for split in bt.SPLITS}
    assert languages["train"] == languages["validation"] == languages["test"]
    assert len(languages["test"]) == 435 and "und" not in languages["test"]
    for ex in split_examples("embedded_udhr_langid", "validation"):
        assert ex["inputs"].startswith("language: ") and len(ex["inputs"]) >= 10 + 40


def test_austen_cloze_options_and_held_out_passages():
    lines = [bt.normalize_whitespace(line)
             for line in bt._lines(embedded.path(embedded.AUSTEN))]
    for split in bt.SPLITS:
        examples = split_examples("embedded_austen_cloze", split)
        assert len(examples) >= (150 if split != "train" else 2000)
        for ex in examples:
            options, answer = ex["options"], ex["targets"]
            assert len(options) == 4 and len({o.lower() for o in options}) == 4
            assert options[ex["label"]] == answer
            assert answer.replace("'", "").replace("-", "").isalpha()
            assert 20 <= len(ex["inputs"].split()) <= 100
            # Eval answers lie in lines the pretraining corpus holds out, train answers not.
            assert sources._is_validation_line(ex["line"], 100) == (split != "train")
            # LAMBADA's format: the context, a space, the answer reproduce the passage (the
            # context may start inside it, or in the paragraph before it).
            full = ex["inputs"] + " " + answer
            line = lines[ex["line"]]
            prefixes = [line[:m.end()] for m in re.finditer(rf"\b{re.escape(answer)}\b", line)]
            assert any(full.endswith(p) or p.endswith(full) for p in prefixes), full
    labels = collections.Counter(ex["label"] for ex in split_examples("embedded_austen_cloze",
                                                                       "test"))
    assert sorted(labels) == [0, 1, 2, 3]


def test_mixture_yields_tokenized_examples():
    ds = td.get_dataset("embedded_bench", {"inputs": 64, "targets": 16}, split="train", seed=0)
    examples = list(itertools.islice(iter(ds), 24))
    assert len(examples) == 24
    for ex in examples:
        assert 0 < ex["inputs"].size <= 64 and 0 < ex["targets"].size <= 16
        assert ex["inputs"].dtype == np.int32 and ex["targets"][-1] == 1  # EOS kept
        assert isinstance(ex["inputs_pretokenized"], str)
        assert isinstance(ex["targets_pretokenized"], str)
    rates = td.MixtureRegistry.get("embedded_bench").leaf_rates("train")
    assert rates["embedded_ud_pos"] == pytest.approx(rates["embedded_bible_en_es"])
    cloze = next(iter(td.get_dataset("embedded_austen_cloze", {"inputs": 128, "targets": 8},
                                     split="test", shuffle=False)))
    assert cloze["options"][cloze["label"]] == cloze["targets_pretokenized"]


def _disjoint_sizes(inputs_by_split: dict[str, list[str]]) -> dict[str, int]:
    """data/README.md's rule, written out: test keeps all; validation drops what test has;
    train drops what either has (by whitespace-normalised input text)."""
    seen, sizes = set(), {}
    for split in ("test", "validation", "train"):
        kept = [text for text in inputs_by_split[split] if text not in seen]
        seen.update(kept)
        sizes[split] = len(kept)
    return sizes


def test_spam_and_ud_sizes_and_labels_are_counted_from_the_raw_files():
    """SIZES (the documented sizes) against the raw files, read here with gzip and json or
    by counting CoNLL-U sentences, not through the task code."""
    import gzip

    records = [json.loads(line) for line in gzip.open(REPO / "data/labeled/spam_2k.jsonl.gz", "rt",
                                                      encoding="utf-8", newline="\n")]
    by_split = {split: [" ".join(r["text"].split()) for r in records if r["split"] == split]
                for split in bt.SPLITS}
    assert _disjoint_sizes(by_split) == SIZES["embedded_spam"]
    test_and_validation = set(by_split["test"]) | set(by_split["validation"])
    train_labels = collections.Counter(
        r["label"] for r in records
        if r["split"] == "train" and " ".join(r["text"].split()) not in test_and_validation)
    assert train_labels == {"ham": 3286, "spam": 1437}
    ud = {}
    for split, name in (("train", "train"), ("validation", "dev"), ("test", "test")):
        with gzip.open(REPO / f"data/labeled/ud_en_ewt/en_ewt-ud-{name}.conllu.gz", "rt",
                       encoding="utf-8") as f:
            sentences, words = [], []
            for line in f:
                line = line.rstrip("\n")
                if not line:
                    if words:
                        sentences.append(" ".join(words))
                    words = []
                elif not line.startswith("#"):
                    index, form = line.split("\t")[:2]
                    if "-" not in index and "." not in index:  # no ranges, no empty nodes
                        words.append(form)
            if words:
                sentences.append(" ".join(words))
        ud[split] = sentences
    assert {split: len(s) for split, s in ud.items()} == {"train": 12544, "validation": 2001,
                                                          "test": 2077}  # the UD release's
    assert _disjoint_sizes(ud) == SIZES["embedded_ud_pos"]
