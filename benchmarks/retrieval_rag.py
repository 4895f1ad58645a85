"""Retriever recall before and after contrastive training, and closed-book T5 against RAG
on the WEB -> KJV task (docs/retrieval.md). Runs each missing step through
``python -m t5x_like.retrieval`` (skips those whose outputs exist) and prints the tables.

    nice -n 5 python benchmarks/retrieval_rag.py            # about an hour on 2 busy CPU cores
    python benchmarks/retrieval_rag.py --only_print         # tables of what exists

Needs the pretraining runs runs/pt_bert (configs/pretrain/bert_tiny.py) and runs/pt_t5
(configs/pretrain/t5_tiny.py).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

CLI = [sys.executable, "-m", "t5x_like.retrieval"]
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


def run(args: list[str]) -> str:
    print("+", " ".join(args[2:]), flush=True)
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def retriever_rows(only_print: bool) -> list[tuple[str, dict]]:
    rows = []
    for name, (retriever, index) in RETRIEVERS.items():
        saved = pathlib.Path(index) / "eval_test.json"
        if not saved.is_file() and not only_print:
            if retriever != "runs/pt_bert" and not (pathlib.Path(retriever) / "run.json").is_file():
                run(CLI + ["train-retriever", "--config=configs/retrieval/retriever.py",
                           f"--workdir={retriever}"])
            if not (pathlib.Path(index) / "index.json").is_file():
                run(CLI + ["build-index", f"--retriever={retriever}", f"--output={index}"])
            run(CLI + ["evaluate-retriever", f"--retriever={retriever}", f"--index={index}"])
        if saved.is_file():
            rows.append((name, json.loads(saved.read_text())))
    if not pathlib.Path(FAISS).is_file() and not only_print:
        run(CLI + ["evaluate-retriever", "--retriever=runs/ret_bert",
                   "--index=runs/ret_bert/index", "--backend=faiss"])
    if pathlib.Path(FAISS).is_file():
        rows.append(("the same, searched with faiss (IndexFlatIP)",
                     json.loads(pathlib.Path(FAISS).read_text())))
    return rows


def generator_rows(only_print: bool) -> list[tuple[str, dict]]:
    rows = []
    for name, (kind, workdir, overrides) in GENERATORS.items():
        saved = pathlib.Path(workdir) / "eval_test.json"
        if not saved.is_file() and not only_print:
            if not (pathlib.Path(workdir) / "run.json").is_file():
                run(CLI + ["train-rag", f"--config=configs/retrieval/rag.py:{kind}",
                           f"--workdir={workdir}"] + [f"--config.{o}" for o in overrides])
            run(CLI + ["evaluate-rag", f"--run={workdir}"])
        if saved.is_file():
            result = json.loads(saved.read_text())
            metrics = pathlib.Path(workdir) / "metrics.jsonl"
            if metrics.is_file():
                result["train_loss"] = json.loads(metrics.read_text().splitlines()[-1])["loss"]
            rows.append((name, result))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only_print", action="store_true")
    args = parser.parse_args()
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
