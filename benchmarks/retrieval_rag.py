"""Retriever recall before and after contrastive training, and closed-book T5 against RAG
on the WEB -> KJV task (docs/retrieval.md). Runs each missing step through
``python -m t5x_like.retrieval`` (skips those whose outputs exist) and prints the tables.

    nice -n 5 python benchmarks/retrieval_rag.py            # about an hour on 2 busy CPU cores
    python benchmarks/retrieval_rag.py --only_print         # tables of what exists
    python benchmarks/retrieval_rag.py --smoke              # tiny: a check that it runs

Needs the pretraining runs runs/pt_bert (configs/pretrain/bert_tiny.py) and runs/pt_t5
(configs/pretrain/t5_tiny.py). ``--runs`` moves every ``runs/`` folder below elsewhere.

``--smoke``: the rows of ``SMOKE_ROWS`` (the trained retriever with both search backends and
RAG-sequence: every command; closed-book trains and evaluates the same generator without
the retriever, RAG-token changes the marginalisation, the other rows sizes or steps) at
tiny sizes, in this process: tiny pretraining runs in a temporary ``--runs`` (unless it
holds them), 2 steps of 8 rows of 16 tokens for each training, k = 2, 8 queries a
retriever evaluation and 4 verses a generator's. The index still holds all 31,102 KJV
verses. Each training and evaluation compiles its own programs (10-30 s on 2 busy cores).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

import _smoke

RETRIEVERS = {"pretrained BERT, no contrastive training (both towers = runs/pt_bert)":
              ("runs/pt_bert", "runs/ret_before/index"),
              "after 120 contrastive steps (configs/retrieval/retriever.py)":
              ("runs/ret_bert", "runs/ret_bert/index")}
FAISS = "runs/ret_bert/index/eval_test_faiss.json"
# name: (kind, workdir, config overrides)
GENERATORS = {
    "closed-book T5, 200 steps": ("closed_book", "runs/closed_book", []),
    "RAG-sequence, k=4, 200 steps": ("sequence", "runs/rag_sequence", []),
    "RAG-token, k=4, 200 steps": ("token", "runs/rag_token", []),
    "closed-book T5, 1000 steps": ("closed_book", "runs/closed_book_1000",
                                   ["num_train_steps=1000", "warmup_steps=100",
                                    "log_every_steps=100"]),
    "RAG-sequence, k=2, 500 steps": ("sequence", "runs/rag_sequence_k2_500",
                                     ["k=2", "num_train_steps=500", "warmup_steps=50",
                                      "log_every_steps=50"]),
}


FAISS_ROW = "the same, searched with faiss (IndexFlatIP)"
SMOKE_ROWS = ("after 120 contrastive steps (configs/retrieval/retriever.py)", FAISS_ROW,
              "RAG-sequence, k=4, 200 steps")
# What --smoke adds to each command (set by main): the sizes, and where the runs are.
SMOKE = {"runs": "runs", "train-retriever": [], "build-index": [], "evaluate-retriever": [],
         "train-rag": [], "evaluate-rag": [], "rows": None}


def at(path: str) -> str:
    """``path`` (``runs/...``) under ``--runs``."""
    return path.replace("runs", SMOKE["runs"], 1) if path.startswith("runs/") else path


def run(args: list[str]) -> str:
    """``python -m t5x_like.retrieval ARGS`` (with ``--smoke``'s additions), its output."""
    args = args + SMOKE[args[0]]
    print("+", " ".join(args), flush=True)
    return _smoke.cli("t5x_like.retrieval", args, capture=True)


def wanted(name: str) -> bool:
    return SMOKE["rows"] is None or name in SMOKE["rows"]


def retriever_rows(only_print: bool) -> list[tuple[str, dict]]:
    rows = []
    for name, (retriever, index) in RETRIEVERS.items():
        retriever, index = at(retriever), at(index)
        saved = pathlib.Path(index) / "eval_test.json"
        if not wanted(name):
            continue
        if not saved.is_file() and not only_print:
            if retriever != at("runs/pt_bert") and not (pathlib.Path(retriever) / "run.json").is_file():
                run(["train-retriever", "--config=configs/retrieval/retriever.py",
                     f"--workdir={retriever}", f"--config.init_from={at('runs/pt_bert')}"])
            if not (pathlib.Path(index) / "index.json").is_file():
                run(["build-index", f"--retriever={retriever}", f"--output={index}"])
            run(["evaluate-retriever", f"--retriever={retriever}", f"--index={index}"])
        if saved.is_file():
            rows.append((name, json.loads(saved.read_text())))
    faiss = pathlib.Path(at(FAISS))
    if not faiss.is_file() and not only_print and wanted(FAISS_ROW):
        run(["evaluate-retriever", f"--retriever={at('runs/ret_bert')}",
             f"--index={at('runs/ret_bert/index')}", "--backend=faiss"])
    if faiss.is_file():
        rows.append((FAISS_ROW, json.loads(faiss.read_text())))
    return rows


def generator_rows(only_print: bool) -> list[tuple[str, dict]]:
    rows = []
    for name, (kind, workdir, overrides) in GENERATORS.items():
        workdir = at(workdir)
        saved = pathlib.Path(workdir) / "eval_test.json"
        if not wanted(name):
            continue
        if not saved.is_file() and not only_print:
            if not (pathlib.Path(workdir) / "run.json").is_file():
                run(["train-rag", f"--config=configs/retrieval/rag.py:{kind}",
                     f"--workdir={workdir}", f"--config.generator_init={at('runs/pt_t5')}",
                     f"--config.retriever={at('runs/ret_bert')}",
                     f"--config.index={at('runs/ret_bert/index')}"]
                    + [f"--config.{o}" for o in overrides])
            run(["evaluate-rag", f"--run={workdir}"])
        if saved.is_file():
            result = json.loads(saved.read_text())
            metrics = pathlib.Path(workdir) / "metrics.jsonl"
            if metrics.is_file():
                result["train_loss"] = json.loads(metrics.read_text().splitlines()[-1])["loss"]
            rows.append((name, result))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only_print", action="store_true")
    parser.add_argument("--runs", default="", help="where runs/ is (default: runs)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny runs of every command: a check that the script runs")
    args = parser.parse_args(argv)
    if not args.smoke:
        SMOKE["runs"] = args.runs or "runs"
        return tables(args)
    _smoke.IN_PROCESS = True
    with tempfile.TemporaryDirectory(prefix="retrieval_smoke_") as scratch:
        runs = pathlib.Path(args.runs or scratch)
        _smoke.pretrained(runs, "pt_bert")
        _smoke.pretrained(runs, "pt_t5")
        sizes = ["--config.batch_size=8", "--config.num_train_steps=2",
                 "--config.warmup_steps=1", "--config.log_every_steps=1"]
        SMOKE.update(runs=str(runs), rows=SMOKE_ROWS,
                     **{"train-retriever": sizes + ["--config.query_length=16",
                                                    "--config.doc_length=16"],
                        "train-rag": sizes + ["--config.k=2", "--config.query_length=16",
                                              "--config.passage_length=16",
                                              "--config.target_length=16"],
                        "evaluate-retriever": ["--max_examples=8"],
                        "evaluate-rag": ["--max_examples=4", "--batch_size=4"]})
        return tables(args)


def tables(args) -> int:
    """Runs what is missing (unless ``--only_print``), prints both tables."""
    print("\nRetriever: WEB verse -> KJV verse of the same key among all 31,102 KJV verses "
          "(test split)\n")
    print("| retriever | queries | recall@1 | recall@5 | recall@20 |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, r in retriever_rows(args.only_print):
        print(f"| {name} | {r['queries']} | {r['recall@1']:.1f} | {r['recall@5']:.1f} | "
              f"{r['recall@20']:.1f} |")
    print("\nGenerator: KJV text from the WEB verse (first 300 test verses in canonical order; "
          "greedy; RAG-sequence by thorough decoding)\n")
    print("| model | final train loss (nats/token) | BLEU | exact match % | query tower recall@1 / @5 |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, r in generator_rows(args.only_print):
        recall = (f"{r['recall@1']:.1f} / {r['recall@5']:.1f}" if "recall@1" in r else "-")
        loss = f"{r['train_loss']:.3f}" if "train_loss" in r else "-"
        print(f"| {name} | {loss} | {r['bleu']:.1f} | {r['exact_match']:.1f} | {recall} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
