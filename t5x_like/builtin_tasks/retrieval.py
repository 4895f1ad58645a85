"""``embedded_bible_web_to_kjv``: given a WEB verse, find (and write) the KJV verse of the
same key.

The retrieval corpus is every KJV verse, in canonical order (``kjv_corpus``); a
query is the WEB text of a verse and its gold document the KJV verse of the same
key. Chapters go whole to one split with ``bench_tasks.chapter_split``, the split of
the other Bible tasks, so no test verse (in either translation) is trained on; the
test KJV verses are still in the index, which is what retrieval is for. Pairs whose
lengths differ by more than ``bench_tasks.MAX_LENGTH_RATIO`` are dropped as there.

The registered seq2seq task (WEB -> KJV text, BLEU) is the closed-book form;
``t5x_like.retrieval`` trains the retriever and the RAG model on ``pairs``.
"""

from __future__ import annotations

import functools

from t5x_like import metrics
from t5x_like.builtin_tasks import bench
from t5x_like.builtin_tasks.pretraining import features
from t5x_like.data import embedded
from t5x_like.data.dataset_providers import TaskRegistry

TASK = "embedded_bible_web_to_kjv"
SPLITS = bench.SPLITS


@functools.cache
def kjv_corpus(kjv_path: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(keys, texts)`` of every KJV verse in file order (``"Genesis 1:1"``, text)."""
    kjv = bench._bible(kjv_path)
    return tuple(bench.verse_key(k) for k in kjv), tuple(kjv.values())


@functools.cache
def pairs(kjv_path: str, web_path: str) -> dict[str, list[dict]]:
    """Per split, in canonical order: ``{"query": WEB text, "target": KJV text, "key",
    "doc": index of the KJV verse in kjv_corpus}``."""
    kjv, web = bench._bible(kjv_path), bench._bible(web_path)
    out = {split: [] for split in SPLITS}
    for doc, (key, text) in enumerate(kjv.items()):
        if key in web and web[key] and text and bench._length_ratio_ok(text, web[key]):
            out[bench.chapter_split(key[0], key[1])].append(
                {"query": web[key], "target": text, "key": bench.verse_key(key), "doc": doc})
    return out


def default_paths() -> tuple[str, str]:
    return embedded.path(embedded.KJV_BIBLE), embedded.path(embedded.WEB_BIBLE)


def _examples(kjv_path: str, web_path: str) -> dict[str, list[dict]]:
    splits = {split: [{"inputs": "kjv: " + p["query"], "targets": p["target"], "key": p["key"]}
                      for p in rows] for split, rows in pairs(kjv_path, web_path).items()}
    splits = bench._disjoint(splits)
    return {split: bench._shuffled(TASK, split, splits[split]) for split in SPLITS}


def _register() -> None:
    if TASK in TaskRegistry.names():
        return
    TaskRegistry.add(
        TASK, bench._source(_examples, bench._data_file(embedded.KJV_BIBLE),
                            bench._data_file(embedded.WEB_BIBLE)),
        bench.steps(), features("inputs", "targets"), postprocess_fn=bench.text_postprocess,
        metric_fns=[metrics.bleu],
        description="WEB verse -> the KJV verse of the same key (closed book), split by "
                    "chapter; t5x_like.retrieval retrieves it from all KJV verses.")


_register()
