"""Train the bi-encoder on WEB -> KJV pairs, build the KJV index, measure recall.

A retriever is named by a folder: a retrieval run (``run.json`` + params, from
``train-retriever``) or a pretraining run / pretrained folder of the encoder family
(both towers then start as that encoder: the "before training" retriever).
"""

from __future__ import annotations

import functools
import json
import pathlib

import jax
import numpy as np

from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.builtin_tasks import retrieval as retrieval_tasks
from t5x_like.objectives import rag as rag_objectives
from t5x_like.retrieval import checkpoints, search, text, towers, training
from t5x_like.retrieval import index as index_lib
from t5x_like.retrieval.faiss_backend import FaissIndex


def vocabulary():
    return tasks.embedded_vocabulary()


def _pretrained_run(path: str, pooling: str, normalize: bool, lengths: dict,
                    flag: str) -> tuple[dict, dict]:
    model_config, encoder_params, _ = checkpoints.pretrained(path, "encoder", flag)
    model = towers.bi_encoder(model_config, pooling, normalize)
    params = towers.init_params(model, encoder_params)
    return params, {"kind": "retriever", "model": model_config, "pooling": pooling,
                    "normalize": normalize, "init_from": path, "steps": 0, **lengths}


def load_retriever(path: str, pooling="mean", normalize=True, query_length=96, doc_length=96,
                   temperature=0.05, flag: str = "--retriever"):
    """``(BiEncoder, params, run description)`` of a retrieval run or an encoder checkpoint."""
    if (pathlib.Path(path) / checkpoints.RUN_FILE).is_file():
        params, run = checkpoints.load(path)
    else:
        params, run = _pretrained_run(path, pooling, normalize,
                                      {"query_length": query_length, "doc_length": doc_length,
                                       "temperature": temperature}, flag)
    return towers.bi_encoder(run["model"], run["pooling"], run["normalize"]), params, run


@functools.cache
def _encoder(model, method: str):
    return jax.jit(lambda params, tokens: model.apply({"params": params}, tokens, method=method))


def encode(model, params, tokens: np.ndarray, method: str, chunk: int = 256) -> np.ndarray:
    """``[n, d]`` vectors, ``chunk`` rows per call (the last chunk padded: one shape)."""
    fn = _encoder(model, method)
    out = []
    for start in range(0, len(tokens), chunk):
        part = tokens[start:start + chunk]
        rows = len(part)
        if rows < chunk:
            part = np.concatenate([part, np.zeros((chunk - rows,) + part.shape[1:], part.dtype)])
        out.append(np.asarray(fn(params, part))[:rows])
    return np.concatenate(out)


def train(config, workdir: str) -> dict:
    """Contrastive training with in-batch negatives on the train split's pairs."""
    vocab = vocabulary()
    lengths = {"query_length": config.query_length, "doc_length": config.doc_length}
    if config.init_from:
        params, run = _pretrained_run(config.init_from, config.pooling, config.normalize, lengths,
                                      "--config.init_from")
        model = towers.bi_encoder(run["model"], config.pooling, config.normalize)
    else:  # a fresh encoder of config.model (the no-pretraining control)
        model_config = config.model.to_dict()
        model = towers.bi_encoder(model_config, config.pooling, config.normalize)
        params = towers.init_params(model, seed=config.seed)
        run = {"kind": "retriever", "model": model_config, "pooling": config.pooling,
               "normalize": config.normalize, "init_from": "", **lengths}
    pairs = retrieval_tasks.pairs(*retrieval_tasks.default_paths())["train"]
    queries = text.tower_tokens(vocab, [p["query"] for p in pairs], config.query_length)
    docs = text.tower_tokens(vocab, [p["target"] for p in pairs], config.doc_length)

    def loss_fn(params, batch):
        q, d = model.apply({"params": params}, batch["queries"], batch["docs"])
        return rag_objectives.contrastive_loss(q, d, config.temperature)

    params, log = training.fit(
        loss_fn, params, lambda rows: {"queries": queries[rows], "docs": docs[rows]},
        rates={"query": config.learning_rate, "doc": config.learning_rate},
        steps=config.num_train_steps, warmup=config.warmup_steps, num_examples=len(pairs),
        batch_size=config.batch_size, seed=config.seed, log_every=config.log_every_steps,
        workdir=workdir)
    run.update(steps=config.num_train_steps, temperature=config.temperature,
               config=config.to_dict(), final=log[-1] if log else {})
    checkpoints.save(workdir, params, run)
    return run


def build_index(retriever: str, output: str, shard_size: int = 8192) -> dict:
    """Every KJV verse through the document tower, written per shard."""
    model, params, run = load_retriever(retriever)
    vocab = vocabulary()
    ids, texts = retrieval_tasks.kjv_corpus(retrieval_tasks.default_paths()[0])

    def encode_texts(chunk):
        return encode(model, {"doc": params["doc"]}, text.tower_tokens(vocab, chunk, run["doc_length"]),
                      "encode_doc")

    return index_lib.build(output, ids, texts, encode_texts, shard_size=shard_size,
                           meta={"retriever": str(retriever)})


def canonical_ids(texts) -> np.ndarray:
    """Per document, the index of the first document with the same text."""
    first: dict[str, int] = {}
    return np.asarray([first.setdefault(t, i) for i, t in enumerate(texts)])


def evaluate(retriever: str, index_folder: str, split: str = "test", ks=(1, 5, 20),
             backend: str = "jax", max_examples: int = 0, query_params=None) -> dict:
    """Recall@k of the split's WEB queries against the index (gold: the same key).
    ``query_params`` replaces the query tower's (a RAG run's trained tower)."""
    model, params, run = load_retriever(retriever)
    index = index_lib.load(index_folder)
    pairs = retrieval_tasks.pairs(*retrieval_tasks.default_paths())[split]
    pairs = pairs[:max_examples or None]
    queries = text.tower_tokens(vocabulary(), [p["query"] for p in pairs], run["query_length"])
    vectors = encode(model, {"query": query_params or params["query"]}, queries, "encode_query")
    k = max(ks)
    if backend == "faiss":
        _, found = FaissIndex(index.embeddings).search(vectors, k)
    else:
        _, found = search.ShardedIndex(index.embeddings).search(vectors, k)
    # Verses with the same text (repeated formulas) are one answer: a hit is the gold
    # verse or any verse of identical text, whichever of the tied ones a backend lists.
    canonical = canonical_ids(index.texts)
    gold = canonical[np.asarray([p["doc"] for p in pairs])]
    result = {"split": split, "queries": len(pairs), "docs": index.num_docs,
              **search.recall_at(canonical[found], gold, ks)}
    print(json.dumps(result), flush=True)
    return result
