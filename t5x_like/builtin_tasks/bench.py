"""``embedded_bench``: six small offline benchmark tasks on the labelled data in ``data/``.

Importing registers the tasks and the mixture; no file is read until a split is
asked for (``Source.get``), and each task's splits are then built once per
process and data folder. Every split is a pure function of the files: fixed
seeds (string seeds of ``random.Random``), no iteration over sets, and a fixed
pseudo-random example order, so the first ``n`` examples of an unshuffled split
are a fair sample (the spam file, for one, is sorted by label).

==============================  ========================================  =====================
task                            inputs -> targets                         metrics
==============================  ========================================  =====================
``embedded_spam``               ``spam: <email>`` -> ham / spam           accuracy, f1 of spam
``embedded_ud_pos``             ``pos: <words>`` -> UPOS tags             token_accuracy
``embedded_bible_paraphrase``   KJV verse, WEB verse -> (not_)equivalent  accuracy, f1
``embedded_bible_en_es``        WEB verse -> Reina-Valera 1909 verse      bleu, chrf
``embedded_udhr_langid``        ``language: <paragraph>`` -> lang code    accuracy, macro_f1
``embedded_austen_cloze``       Austen context -> the next word           accuracy (4 options)
==============================  ========================================  =====================

All splits are disjoint by ``inputs``: an example whose inputs also occur in a
later split of the order test, validation, train is dropped from the earlier
one (train loses what test or validation has; test is never changed). Sizes,
sources, licences and the overlap with the pretraining corpus are in
``data/README.md``.
"""

from __future__ import annotations

import bisect
import collections
import functools
import gzip
import hashlib
import json
import random
import re
from collections.abc import Iterable

from t5x_like import metrics
from t5x_like.builtin_tasks.pretraining import features
from t5x_like.data import embedded, sources
from t5x_like.data import preprocessors as pp
from t5x_like.data.dataset_providers import MixtureRegistry, TaskRegistry, rate_num_examples
from t5x_like.data.preprocessors.text import as_text

SPLITS = ("train", "validation", "test")
SPAM_LABELS = ("ham", "spam")  # index = the label (spam = 1, the positive class of f1)
PARAPHRASE_LABELS = ("not_equivalent", "equivalent")
# The 17 UD universal POS tags (all occur in EWT train, dev and test).
UPOS_TAGS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON",
             "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X")

# Caps per split, to keep every task small enough to evaluate on CPU.
PARAPHRASE_SIZES = {"train": 6000, "validation": 600, "test": 600}
EN_ES_SIZES = {"train": 5000, "validation": 500, "test": 500}
UDHR_SIZES = {"train": 8000, "validation": 800, "test": 800}
CLOZE_TRAIN_SIZE = 2000
MIXTURE_MAXIMUM = 5000  # rate_num_examples(..., maximum=): no task dominates the mix

# Bible chapters go whole to one split: sha256("Book C") % 100 < 8 test, < 16 validation.
TEST_PERCENT, VALIDATION_PERCENT = 8, 8
# Verse pairs whose lengths differ by more than this factor are dropped (merged or moved
# verses, e.g. Romans 14:23 with the doxology in the WEB, 1 John 5:7 in the KJV).
MAX_LENGTH_RATIO = 2.5
# Chapters where the RV1909 module's verses do not line up with the KJV slots (an empty
# KJV slot, another versification shifting the rest by a verse), with the following chapter
# that inherits the shift. Found on the full file of the shared data pack: its README lists
# the 18 empty slots; verse lengths correlated against neighbouring verses confirm the shifts.
MISALIGNED_SPANISH_CHAPTERS = frozenset({
    ("Numbers", 12), ("Numbers", 13), ("Numbers", 29), ("Numbers", 30),
    ("I Samuel", 23), ("I Samuel", 24), ("II Samuel", 20), ("II Samuel", 21),
    ("II Chronicles", 33), ("II Chronicles", 34), ("Job", 35), ("Job", 36), ("Job", 38),
    ("Job", 39), ("Job", 40), ("Job", 41), ("Hosea", 11), ("Hosea", 12), ("Jonah", 1),
    ("Jonah", 2), ("Acts", 19), ("Acts", 20), ("II Corinthians", 13)})

UDHR_MIN_CHARS = 40
UDHR_VALIDATION, UDHR_TEST, UDHR_PERIOD = 1, 3, 9  # eligible paragraph j: j % 9 == 1 / 3

CLOZE_MIN_CONTEXT_WORDS = 20
CLOZE_MAX_CONTEXT_WORDS = 100
CLOZE_NUM_OPTIONS = 4
CLOZE_FREQUENCY_WINDOW = 25  # distractors: within 25 frequency ranks either side
PRETRAINING_HOLDOUT_EVERY = 100  # sources.TextLineSource: line i % 100 == 99 is validation


# -- helpers ------------------------------------------------------------------------------------

def normalize_whitespace(text) -> str:
    return " ".join(as_text(text).split())


def _lines(path: str) -> list[str]:
    """Lines split at "\n" only (JSON text may hold U+2028 and other line separators)."""
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
        text = f.read()
    return text[:-1].split("\n") if text.endswith("\n") else text.split("\n")


def _disjoint(splits: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Drops from validation what test has, and from train what either has (by inputs)."""
    seen: set[str] = set()  # membership only: never iterated
    kept = {}
    for split in ("test", "validation", "train"):
        kept[split] = [ex for ex in splits[split] if ex["inputs"] not in seen]
        seen.update(ex["inputs"] for ex in kept[split])
    return {split: kept[split] for split in SPLITS}


def _shuffled(task: str, split: str, examples: list[dict], cap: int | None = None) -> list[dict]:
    """A fixed pseudo-random order (then the first ``cap``)."""
    examples = list(examples)
    random.Random(f"{task}:{split}").shuffle(examples)
    return examples if cap is None else examples[:cap]


def _bucket(text: str, buckets: int = 100) -> int:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest(), 16) % buckets


def chapter_split(book: str, chapter: int) -> str:
    """The split of a Bible chapter (shared by both Bible tasks)."""
    bucket = _bucket(f"{book} {chapter}")
    if bucket < TEST_PERCENT:
        return "test"
    return "validation" if bucket < TEST_PERCENT + VALIDATION_PERCENT else "train"


def _length_ratio_ok(a: str, b: str) -> bool:
    return 1 / MAX_LENGTH_RATIO <= len(a) / max(len(b), 1) <= MAX_LENGTH_RATIO


def _parse_key(key: str) -> tuple[str, int, int]:
    """``"II Samuel 19:35"`` -> ``("II Samuel", 19, 35)``."""
    book, _, chapter_verse = key.rpartition(" ")
    chapter, _, verse = chapter_verse.partition(":")
    return book, int(chapter), int(verse)


def _bible(path: str) -> dict[tuple[str, int, int], str]:
    """``{(book, chapter, verse): text}`` in file (canonical) order."""
    verses = {}
    for line in _lines(path):
        key, _, text = line.partition("\t")
        verses[_parse_key(key)] = normalize_whitespace(text)
    return verses


def verse_key(key: tuple[str, int, int]) -> str:
    return f"{key[0]} {key[1]}:{key[2]}"


def _word_set(text: str) -> frozenset:
    return frozenset(re.findall(r"\w+", text.lower()))


def _near_duplicate(a: frozenset, b: frozenset, threshold: float = 0.8) -> bool:
    """Word-set Jaccard similarity >= threshold (repeated verses are no hard negatives)."""
    return len(a & b) >= threshold * max(len(a | b), 1)


# -- postprocessors -----------------------------------------------------------------------------

def _label_index(text, labels) -> int:
    word = normalize_whitespace(text).lower()
    return labels.index(word) if word in labels else -1


def spam_postprocess(text, example=None, is_target=False) -> int:
    """``ham`` -> 0, ``spam`` -> 1, anything else -> -1 (counted wrong by the metrics)."""
    return _label_index(text, SPAM_LABELS)


def paraphrase_postprocess(text, example=None, is_target=False) -> int:
    """``equivalent`` -> 1, ``not_equivalent`` -> 0, anything else -> -1."""
    return _label_index(text, PARAPHRASE_LABELS)


def text_postprocess(text, example=None, is_target=False) -> str:
    return normalize_whitespace(text)


# -- the tasks' examples ------------------------------------------------------------------------

@functools.cache
def spam_examples(path: str) -> dict[str, list[dict]]:
    """The spam file's own splits (stratified 80/10/10); text whitespace-normalised."""
    splits = {split: [] for split in SPLITS}
    for line in _lines(path):
        record = json.loads(line)
        text = normalize_whitespace(record["text"])
        splits[record["split"]].append({
            "inputs": "spam: " + text, "targets": record["label"],
            "label": SPAM_LABELS.index(record["label"]), "id": record["id"], "text": text})
    splits = _disjoint(splits)
    return {split: _shuffled("embedded_spam", split, splits[split]) for split in SPLITS}


def read_conllu(path: str) -> Iterable[tuple[str, list[str], list[str]]]:
    """``(sent_id, words, upos)`` per sentence; multiword-token ranges (``1-2``) and empty
    nodes (``1.1``) are skipped, so words are the syntactic words UPOS belongs to."""
    sent_id, words, tags = "", [], []
    for line in _lines(path) + [""]:
        if not line:
            if words:
                yield sent_id, words, tags
            sent_id, words, tags = "", [], []
        elif line.startswith("#"):
            if line.startswith("# sent_id = "):
                sent_id = line[len("# sent_id = "):].strip()
        else:
            columns = line.split("\t")
            if "-" in columns[0] or "." in columns[0]:
                continue
            words.append(columns[1])
            tags.append(columns[3])


@functools.cache
def ud_pos_examples(paths: tuple[tuple[str, str], ...]) -> dict[str, list[dict]]:
    splits = {}
    for split, path in paths:
        splits[split] = [{"inputs": "pos: " + " ".join(words), "targets": " ".join(tags),
                          "words": words, "tags": tags, "sent_id": sent_id,
                          "sentence": " ".join(words)}
                         for sent_id, words, tags in read_conllu(path)]
    splits = _disjoint(splits)
    return {split: _shuffled("embedded_ud_pos", split, splits[split]) for split in SPLITS}


@functools.cache
def bible_paraphrase_examples(kjv_path: str, web_path: str) -> dict[str, list[dict]]:
    """Each selected KJV verse appears once: with its own WEB verse (equivalent) or,
    alternating in a seeded order, with the WEB text of verse v-1 or v+1 of the same
    chapter (not_equivalent; a neighbour whose word set has Jaccard similarity >= 0.8 with
    the verse's, as in repeated formulas, is not used, and a verse with no usable neighbour is skipped).
    Half of each cap is taken from each label, so the splits are exactly balanced."""
    kjv, web = _bible(kjv_path), _bible(web_path)
    candidates = {split: [] for split in SPLITS}
    for key, text in kjv.items():
        if key in web and _length_ratio_ok(text, web[key]):
            candidates[chapter_split(key[0], key[1])].append(key)
    word_sets: dict = {}

    def word_set(key):
        if key not in word_sets:
            word_sets[key] = _word_set(web[key])
        return word_sets[key]

    splits = {}
    for split, keys in candidates.items():
        rng = random.Random(f"embedded_bible_paraphrase:{split}")
        rng.shuffle(keys)
        examples = []
        for rank, key in enumerate(keys):
            other = key
            if rank % 2:  # a negative: a neighbour that is not a near-copy (else skipped)
                book, chapter, verse = key
                neighbours = [n for n in ((book, chapter, verse - 1), (book, chapter, verse + 1))
                              if n in web and n in kjv
                              and not _near_duplicate(word_set(n), word_set(key))]
                if not neighbours:
                    continue
                other = neighbours[rng.randrange(len(neighbours))]
            positive = other == key
            examples.append({
                "inputs": f"paraphrase sentence1: {kjv[key]} sentence2: {web[other]}",
                "targets": PARAPHRASE_LABELS[positive], "label": int(positive),
                "kjv_key": verse_key(key), "web_key": verse_key(other),
                "sentence1": kjv[key], "sentence2": web[other]})
        splits[split] = examples
    splits = _disjoint(splits)
    out = {}
    for split in SPLITS:  # already in a seeded order: take half the cap from each label
        half = PARAPHRASE_SIZES[split] // 2
        by_label = [[ex for ex in splits[split] if ex["label"] == label][:half]
                    for label in (0, 1)]
        out[split] = _shuffled("embedded_bible_paraphrase", split, by_label[0] + by_label[1])
    return out


@functools.cache
def bible_en_es_examples(web_path: str, spanish_path: str) -> dict[str, list[dict]]:
    """WEB -> RV1909 on the keys of the (every 4th verse) Spanish file that the WEB has."""
    web = _bible(web_path)
    splits = {split: [] for split in SPLITS}
    for line in _lines(spanish_path):
        key_text, _, text = line.partition("\t")
        key = _parse_key(key_text)
        book = key[0]
        spanish = normalize_whitespace(text)
        if (key not in web or (book, key[1]) in MISALIGNED_SPANISH_CHAPTERS
                or not _length_ratio_ok(spanish, web[key])):
            continue
        splits[chapter_split(book, key[1])].append({
            "inputs": "translate English to Spanish: " + web[key], "targets": spanish,
            "key": verse_key(key), "english": web[key]})
    splits = _disjoint(splits)
    return {split: _shuffled("embedded_bible_en_es", split, splits[split], EN_ES_SIZES[split])
            for split in SPLITS}


def udhr_paragraphs(text: str) -> list[str]:
    """Paragraphs of a UDHR text: lines of at least 40 characters after the title line
    (headings such as "Article 5" or "Preamble" are shorter)."""
    lines = [normalize_whitespace(line) for line in text.split("\n")[1:]]
    return [line for line in lines if len(line) >= UDHR_MIN_CHARS]


@functools.cache
def udhr_langid_examples(path: str) -> dict[str, list[dict]]:
    """Eligible paragraph j of each translation: j % 9 == 1 validation, == 3 test, else
    train (every translation has at least 4, so every language is in every split).
    ``und`` (undetermined) translations and paragraphs found under two languages are
    dropped. Caps keep the lowest positions first, so every translation stays."""
    records = [json.loads(line) for line in _lines(path)]
    labels = collections.defaultdict(set)
    for record in records:
        for paragraph in udhr_paragraphs(record["text"]):
            labels[paragraph].add(record["lang"])
    ranked = {split: [] for split in SPLITS}  # (rank within translation, file order, example)
    for order, record in enumerate(records):
        if record["lang"] == "und":
            continue
        counts = collections.Counter()
        for j, paragraph in enumerate(udhr_paragraphs(record["text"])):
            if len(labels[paragraph]) > 1:
                continue
            split = {UDHR_VALIDATION: "validation", UDHR_TEST: "test"}.get(j % UDHR_PERIOD,
                                                                          "train")
            ranked[split].append((counts[split], order, {
                "inputs": "language: " + paragraph, "targets": record["lang"],
                "code": record["code"], "paragraph": paragraph}))
            counts[split] += 1
    splits = {split: [example for _, _, example in sorted(
        ranked[split], key=lambda item: item[:2])[:UDHR_SIZES[split]]] for split in SPLITS}
    splits = _disjoint(splits)
    return {split: _shuffled("embedded_udhr_langid", split, splits[split]) for split in SPLITS}


# Austen cloze ----------------------------------------------------------------------------------

_CLOZE_WORD = re.compile(r"[A-Za-z]+(?:['’-][A-Za-z]+)*")
# A word followed by . ! ? ; or : (and closing quotes), then whitespace or the line end.
_CLOZE_END = re.compile(r"(?<!\S)([A-Za-z]+(?:['’-][A-Za-z]+)*)([.!?;:][\"'’”)]*)(?=\s|$)")
_SENTENCE_START = re.compile(r"[\"'‘“(]*[A-Z]")
_ABBREVIATIONS = frozenset({"Mr", "Mrs", "Dr", "St", "Col", "Capt", "Messrs", "Esq", "Rev",
                            "Gen", "Sir"})
_SENTENCE_END_TOKEN = re.compile(r"[.!?][\"'’”)]*$")


def cloze_points(line: str) -> list[tuple[int, str]]:
    """``(offset, word)`` of each word that ends a sentence (. ! ? then a capital or the
    line end; not Mr. Mrs. ...) or a clause (; :) in a paragraph."""
    points = []
    for match in _CLOZE_END.finditer(line):
        word, punctuation = match.groups()
        if punctuation[0] in ".!?":
            if punctuation[0] == "." and word in _ABBREVIATIONS:
                continue
            rest = line[match.end():].lstrip()
            if rest and not _SENTENCE_START.match(rest):
                continue
        if len(word) > 1 or word == "I":  # not initials ("Mr. E.")
            points.append((match.start(1), word))
    return points


def trim_context(words: list[str]) -> list[str]:
    """At most 100 words, starting at a sentence start where one fits (keeping >= 20)."""
    if len(words) <= CLOZE_MAX_CONTEXT_WORDS:
        return words
    last_start = len(words) - CLOZE_MIN_CONTEXT_WORDS
    for start in range(len(words) - CLOZE_MAX_CONTEXT_WORDS, last_start):
        previous = words[start - 1]
        if (_SENTENCE_END_TOKEN.search(previous) and previous.rstrip(".!?\"'’”)") not in
                _ABBREVIATIONS):
            return words[start:]
    return words[-CLOZE_MAX_CONTEXT_WORDS:]


def _frequency_pools(lines: list[str]) -> tuple[collections.Counter, dict]:
    """Word-form counts over all of Austen, and the forms distractors are drawn from,
    most frequent first (``(sort keys, forms)``): lower-case words, and capitalised forms
    that are mostly capitalised (names, titles, "I"); each form occurs at least twice."""
    counts = collections.Counter(_CLOZE_WORD.findall("\n".join(lines)))
    lower, upper = [], []
    for form, count in counts.items():
        if count < 2:
            continue
        if form[0].islower():
            lower.append(form)
        elif counts[form] > counts.get(form.lower(), 0):
            upper.append(form)
    pools = {}
    for name, forms in (("lower", lower), ("upper", upper)):
        keys = sorted((-counts[form], form) for form in forms)
        pools[name] = (keys, [form for _, form in keys])
    return counts, pools


def _distractors(answer: str, counts, pools, rng: random.Random) -> list[str]:
    keys, pool = pools["lower" if answer[0].islower() else "upper"]
    position = bisect.bisect_left(keys, (-counts[answer], answer))
    low = max(0, position - CLOZE_FREQUENCY_WINDOW)
    window = pool[low:position + CLOZE_FREQUENCY_WINDOW + 1]
    choices = [form for form in window if form.lower() != answer.lower()]
    return rng.sample(choices, CLOZE_NUM_OPTIONS - 1)


def _cloze_example(context_words: list[str], answer: str, counts, pools, line: int,
                   offset: int) -> dict:
    rng = random.Random(f"austen-cloze:{line}:{offset}")
    options = _distractors(answer, counts, pools, rng)
    label = rng.randrange(CLOZE_NUM_OPTIONS)
    options.insert(label, answer)
    context = " ".join(trim_context(context_words))
    return {"inputs": context, "targets": answer, "options": options, "label": label,
            "line": line, "context": context}


@functools.cache
def austen_cloze_examples(austen_path: str) -> dict[str, list[dict]]:
    """Validation/test: every cloze point of the Austen lines the pretraining corpus holds
    out (line i % 100 == 99; even hundreds validation, odd test); when a point has fewer
    than 20 words before it in its paragraph, the preceding paragraph is put in front.
    Train: the last cloze point of 2,000 pretraining-train lines (the first, in a seeded
    order, whose last point has >= 20 words before it), for few-shot demonstrations."""
    lines = [normalize_whitespace(line) for line in _lines(austen_path)]
    counts, pools = _frequency_pools(lines)
    splits = {split: [] for split in SPLITS}
    train_lines = []
    for index, line in enumerate(lines):
        if not sources._is_validation_line(index, PRETRAINING_HOLDOUT_EVERY):
            train_lines.append(index)
            continue
        split = "validation" if (index // PRETRAINING_HOLDOUT_EVERY) % 2 == 0 else "test"
        for offset, word in cloze_points(line):
            context = line[:offset].split()
            if len(context) < CLOZE_MIN_CONTEXT_WORDS and index > 0:
                context = lines[index - 1].split() + context
            if len(context) >= CLOZE_MIN_CONTEXT_WORDS:
                splits[split].append(_cloze_example(context, word, counts, pools, index, offset))
    random.Random("embedded_austen_cloze:train").shuffle(train_lines)
    chosen = []  # the first 2,000 lines in that order whose last point has >= 20 words before
    for index in train_lines:
        points = cloze_points(lines[index])
        if points and len(lines[index][:points[-1][0]].split()) >= CLOZE_MIN_CONTEXT_WORDS:
            chosen.append((index, points[-1]))
            if len(chosen) == CLOZE_TRAIN_SIZE:
                break
    for index, (offset, word) in sorted(chosen):
        splits["train"].append(_cloze_example(lines[index][:offset].split(), word, counts, pools,
                                              index, offset))
    splits = _disjoint(splits)
    return {split: _shuffled("embedded_austen_cloze", split, splits[split]) for split in SPLITS}


# -- registration -------------------------------------------------------------------------------

def _source(build, *paths) -> sources.FunctionSource:
    """A three-split source: ``build(*(path() for path in paths))[split]`` on the first
    ``get``. Paths are resolved then, so ``T5X_LIKE_DATA_DIR`` set after import counts."""
    return sources.FunctionSource(functools.partial(_load_split, build, paths), splits=SPLITS)


def _load_split(build, paths, split: str) -> list[dict]:
    return build(*(path() for path in paths))[split]


def _data_file(name: str):
    return functools.partial(embedded.path, name)


def _ud_paths() -> tuple[tuple[str, str], ...]:
    return tuple((split, embedded.ud_en_ewt_path(split)) for split in SPLITS)


def _spanish_path() -> str:
    return embedded.multilingual_bible("es")


def steps() -> list:
    return [pp.Tokenize(copy_pretokenized=True), pp.AppendEos(), pp.Truncate()]


TASKS = ("embedded_spam", "embedded_ud_pos", "embedded_bible_paraphrase", "embedded_bible_en_es",
         "embedded_udhr_langid", "embedded_austen_cloze")


def _register() -> None:
    if "embedded_spam" in TaskRegistry.names():
        return
    add = TaskRegistry.add
    text_features = features("inputs", "targets")
    add("embedded_spam", _source(spam_examples, embedded.spam_path), steps(), text_features,
        postprocess_fn=spam_postprocess,
        metric_fns=[metrics.accuracy, metrics.f1_score_with_invalid], label_options=SPAM_LABELS,
        description="SpamAssassin email (first 2,000 characters) -> ham/spam; f1 of spam.")
    add("embedded_ud_pos", _source(ud_pos_examples, _ud_paths), steps(), text_features,
        postprocess_fn=text_postprocess, metric_fns=[metrics.token_accuracy],
        description="UD English EWT 2.16 UPOS tagging; examples keep words/tags lists.")
    add("embedded_bible_paraphrase",
        _source(bible_paraphrase_examples, _data_file(embedded.KJV_BIBLE),
                _data_file(embedded.WEB_BIBLE)), steps(),
        text_features, postprocess_fn=paraphrase_postprocess,
        metric_fns=[metrics.accuracy, metrics.f1_score_with_invalid],
        label_options=PARAPHRASE_LABELS,
        description="KJV vs WEB verse: same verse, or a neighbouring verse (hard negative); "
                    "balanced, split by chapter.")
    add("embedded_bible_en_es",
        _source(bible_en_es_examples, _data_file(embedded.WEB_BIBLE), _spanish_path),
        steps(), text_features, postprocess_fn=text_postprocess,
        metric_fns=[metrics.bleu, metrics.chrf],
        description="WEB verse -> Reina-Valera 1909 verse, split by chapter.")
    add("embedded_udhr_langid", _source(udhr_langid_examples, embedded.udhr_path), steps(),
        text_features, postprocess_fn=text_postprocess,
        metric_fns=[metrics.accuracy, metrics.macro_f1],
        description="UDHR paragraph -> language code (435 languages, split by position).")
    add("embedded_austen_cloze", _source(austen_cloze_examples, _data_file(embedded.AUSTEN)),
        steps(), text_features, postprocess_fn=text_postprocess, metric_fns=[metrics.accuracy],
        description="LAMBADA-like: the word ending a sentence/clause of held-out Austen "
                    "text, 4 options (examples carry options and label).")
    MixtureRegistry.add("embedded_bench",
                        [(name, rate_num_examples(name, maximum=MIXTURE_MAXIMUM))
                         for name in TASKS],
                        description="The six embedded benchmark tasks, size-proportional rates "
                                    f"capped at {MIXTURE_MAXIMUM:,} examples.")


_register()
