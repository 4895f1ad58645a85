"""The document index on disk: embeddings written per shard, read back as one array.

A folder holds ``index.json`` (count, dimension, the shard files and their row
ranges, the document tower that made it), ``embeddings_<i>.npy`` (``[rows, dim]``
float32, one per shard, so a large corpus is written and read a piece at a time,
or one shard per host) and ``docs.jsonl`` (per row: id, text). RAG reads the same
folder and keeps it fixed while the query tower trains.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable, Sequence

import numpy as np

from t5x_like.errors import UserError

INDEX_FILE = "index.json"
DOCS_FILE = "docs.jsonl"


@dataclasses.dataclass
class Index:
    embeddings: np.ndarray     # [num_docs, dim] float32
    ids: list[str]
    texts: list[str]
    meta: dict

    @property
    def num_docs(self) -> int:
        return int(self.embeddings.shape[0])


def build(folder, ids: Sequence[str], texts: Sequence[str],
          encode: Callable[[Sequence[str]], np.ndarray], *, shard_size: int = 8192,
          meta: dict | None = None) -> dict:
    """Embeds ``texts`` with ``encode`` (a list of texts -> ``[n, dim]``), one shard of
    ``shard_size`` rows at a time, and writes the folder; returns ``index.json``'s dict."""
    if len(ids) != len(texts):
        raise ValueError(f"{len(ids)} ids for {len(texts)} texts.")
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shards, dim = [], None
    for number, start in enumerate(range(0, len(texts), shard_size)):
        vectors = np.asarray(encode(texts[start:start + shard_size]), np.float32)
        dim = vectors.shape[1]
        name = f"embeddings_{number:05d}.npy"
        np.save(folder / name, vectors)
        shards.append({"file": name, "start": start, "rows": int(vectors.shape[0])})
    with open(folder / DOCS_FILE, "w", encoding="utf-8") as f:
        for doc_id, text in zip(ids, texts, strict=False):
            f.write(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n")
    info = {"num_docs": len(texts), "dim": dim, "shards": shards, **(meta or {})}
    (folder / INDEX_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return info


def load(folder) -> Index:
    folder = pathlib.Path(folder)
    if not (folder / INDEX_FILE).is_file():
        raise UserError(f"{folder} holds no {INDEX_FILE}; build one with `python -m "
                        "t5x_like.retrieval build-index`.")
    meta = json.loads((folder / INDEX_FILE).read_text())
    parts = [np.load(folder / shard["file"]) for shard in meta["shards"]]
    embeddings = np.concatenate(parts) if parts else np.zeros((0, meta["dim"] or 0), np.float32)
    if embeddings.shape[0] != meta["num_docs"]:
        raise ValueError(f"{folder}: shards hold {embeddings.shape[0]} rows, index.json says "
                         f"{meta['num_docs']}.")
    ids, texts = [], []
    with open(folder / DOCS_FILE, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            ids.append(record["id"])
            texts.append(record["text"])
    return Index(embeddings, ids, texts, meta)
