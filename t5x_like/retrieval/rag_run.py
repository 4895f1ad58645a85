"""Train and evaluate the generator of the WEB -> KJV task: closed book (T5 reads the
WEB verse alone) or RAG (T5 reads the WEB verse and each of the top k retrieved KJV
verses; RAG-sequence or RAG-token marginal likelihood; the retriever's query tower
trains through the document scores while the index stays fixed).

Generator inputs: ``"kjv: " + WEB verse`` then, with RAG, ``"context: " + passage``
and EOS; targets the KJV verse and EOS, cut at ``target_length``.
"""

from __future__ import annotations

import functools
import json
import pathlib

import jax
import numpy as np

from t5x_like import metrics as metric_fns
from t5x_like import structures
from t5x_like.builtin_tasks import retrieval as retrieval_tasks
from t5x_like.errors import ConfigError
from t5x_like.models import decoding
from t5x_like.retrieval import checkpoints, rag, retriever_run, text, training
from t5x_like.retrieval import index as index_lib

KINDS = ("closed_book", "sequence", "token")
QUERY_PREFIX, PASSAGE_PREFIX = "kjv: ", "context: "


def _check(config):
    if config.kind not in KINDS:
        raise ConfigError(f"kind={config.kind!r}; use one of {KINDS}.")


class Inputs:
    """The split's arrays for the generator (and the retriever's query tower)."""

    def __init__(self, run: dict, split: str, limit: int = 0, retriever_run_info=None):
        vocab = retriever_run.vocabulary()
        self.pairs = retrieval_tasks.pairs(*retrieval_tasks.default_paths())[split][:limit or None]
        queries = [QUERY_PREFIX + p["query"] for p in self.pairs]
        self.targets = text.generator_tokens(vocab, [p["target"] for p in self.pairs],
                                             run["target_length"])
        self.gold = np.asarray([p["doc"] for p in self.pairs], np.int32)
        if run["kind"] == "closed_book":
            self.inputs = text.generator_tokens(vocab, queries, run["query_length"])
        else:
            self.gen_query = text.generator_tokens(vocab, queries, run["query_length"], eos=False)
            self.tower_query = text.tower_tokens(vocab, [p["query"] for p in self.pairs],
                                                 retriever_run_info["query_length"])

    def batch(self, rows, kind: str) -> dict:
        if kind == "closed_book":
            return {"inputs": self.inputs[rows], "targets": self.targets[rows]}
        return {"query_tokens": self.tower_query[rows], "gen_query_tokens": self.gen_query[rows],
                "targets": self.targets[rows], "gold": self.gold[rows]}


def _temperature(retriever_info: dict) -> float:
    """The retriever's training temperature scales its scores into p(z|x)."""
    return float(retriever_info.get("temperature") or 1.0) if retriever_info["normalize"] else 1.0


def _passages(index: index_lib.Index, length: int) -> np.ndarray:
    return text.generator_tokens(retriever_run.vocabulary(),
                                 [PASSAGE_PREFIX + t for t in index.texts], length)


def train(config, workdir: str) -> dict:
    _check(config)
    gen_config, gen_params, _ = checkpoints.pretrained(config.generator_init, "encoder_decoder",
                                                       "--config.generator_init")
    generator = structures.build_model(gen_config)
    run = {"kind": config.kind, "generator": gen_config, "generator_init": config.generator_init,
           "query_length": config.query_length, "target_length": config.target_length,
           "config": config.to_dict()}
    params = {"generator": gen_params}
    rates = {"generator": config.learning_rate}
    extra, info = (), None
    if config.kind == "closed_book":
        loss_fn = functools.partial(rag.closed_book_loss_fn, generator)
    else:
        towers_model, retriever_params, info = retriever_run.load_retriever(config.retriever,
                                                                          flag="--config.retriever")
        index = index_lib.load(config.index)
        spec = rag.RagSpec(towers_model, generator, config.k, config.kind,
                           _temperature(info))
        params["retriever"] = {"query": retriever_params["query"]}
        rates["retriever"] = config.retriever_learning_rate
        extra = (rag.numpy_index(index.embeddings, _passages(index, config.passage_length)),)
        loss_fn = functools.partial(rag.rag_loss_fn, spec)
        run.update(retriever=config.retriever, index=config.index, k=config.k,
                   passage_length=config.passage_length, retriever_run=info)
    data = Inputs(run, "train", retriever_run_info=info)
    params, log = training.fit(
        loss_fn, params, lambda rows: data.batch(rows, config.kind), rates=rates,
        steps=config.num_train_steps, warmup=config.warmup_steps, num_examples=len(data.pairs),
        batch_size=config.batch_size, seed=config.seed, log_every=config.log_every_steps,
        workdir=workdir, extra_args=extra)
    run["final"] = log[-1] if log else {}
    checkpoints.save(workdir, params, run)
    return run


def _pad_rows(batch: dict, size: int) -> dict:
    return {k: np.concatenate([v, np.zeros((size - len(v),) + v.shape[1:], v.dtype)])
            if len(v) < size else v for k, v in batch.items()}


def evaluate(workdir: str, split: str = "test", max_examples: int = 300,
             batch_size: int = 16) -> dict:
    """Greedy generation for the first ``max_examples`` of ``split`` (canonical order):
    corpus BLEU against the KJV verses; RAG runs add recall@1/5/20 of their query tower."""
    params, run = checkpoints.load(workdir)
    generator = structures.build_model(run["generator"])
    max_length = run["target_length"]
    info = run.get("retriever_run")
    data = Inputs(run, split, max_examples, retriever_run_info=info)
    result = {"run": str(workdir), "kind": run["kind"], "split": split,
              "examples": len(data.pairs)}
    if run["kind"] == "closed_book":
        fn = jax.jit(lambda p, tokens: decoding.decode(generator, p, tokens,
                                                       max_decode_length=max_length))
        generate = lambda batch: fn(params["generator"], batch["inputs"])  # noqa: E731
    else:
        towers_model, _, _ = retriever_run.load_retriever(run["retriever"])
        index = index_lib.load(run["index"])
        spec = rag.RagSpec(towers_model, generator, run["k"], run["kind"],
                           _temperature(info))
        arrays = rag.numpy_index(index.embeddings, _passages(index, run["passage_length"]))
        fn = jax.jit(functools.partial(rag.rag_generate, spec, max_length=max_length))
        generate = lambda batch: fn(params, batch, arrays)[0]  # noqa: E731
        result.update(retriever_run.evaluate(run["retriever"], run["index"], split,
                                             query_params=params["retriever"]["query"]))
        result["split"] = split
    predictions = []
    for start in range(0, len(data.pairs), batch_size):
        rows = np.arange(start, min(start + batch_size, len(data.pairs)))
        batch = _pad_rows(data.batch(rows, run["kind"]), batch_size)
        out = np.asarray(generate(batch))[:len(rows)]
        predictions += text.detokenize(retriever_run.vocabulary(), out)
    references = [p["target"] for p in data.pairs]
    result.update(metric_fns.bleu(references, predictions))
    result["exact_match"] = 100.0 * float(np.mean([a == b for a, b in zip(predictions,
                                                                         references, strict=False)]))
    out = pathlib.Path(workdir)
    with open(out / f"predictions_{split}.jsonl", "w", encoding="utf-8") as f:
        for pair, prediction in zip(data.pairs, predictions, strict=False):
            f.write(json.dumps({"key": pair["key"], "query": pair["query"],
                                "target": pair["target"], "prediction": prediction},
                               ensure_ascii=False) + "\n")
    (out / f"eval_{split}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)
    return result
