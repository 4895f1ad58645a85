"""``python -m t5x_like.retrieval <subcommand>``: the retriever and RAG runs.

    train-retriever     contrastive training of the bi-encoder (--config, --workdir)
    build-index         the KJV verses through the document tower, per shard (--retriever, --output)
    evaluate-retriever  recall@1/5/20 of WEB queries against an index (--retriever, --index);
                        the full split's numbers are kept in <index>/eval_<split>.json
    train-rag           RAG-sequence, RAG-token or the closed-book generator (--config, --workdir)
    evaluate-rag        BLEU of generated KJV text, and the query tower's recall (--run)

A retriever is a ``train-retriever`` workdir or an encoder checkpoint (``runs/pt_bert``:
both towers then are that encoder, the untrained baseline). Commands and measured
numbers: docs/retrieval.md.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from t5x_like import config_lib, errors

# Imports inside functions: keep JAX out of the command's start-up: a mistake in the config or
# the flags is reported before JAX loads.

SUBCOMMANDS = ("train-retriever", "build-index", "evaluate-retriever", "train-rag",
               "evaluate-rag")


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m t5x_like.retrieval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("train-retriever", "train-rag"):
        p = sub.add_parser(name)
        p.add_argument("--config", required=True)
        p.add_argument("--workdir", required=True)
    p = sub.add_parser("build-index")
    p.add_argument("--retriever", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--shard_size", type=int, default=8192)
    p = sub.add_parser("evaluate-retriever")
    p.add_argument("--retriever", required=True)
    p.add_argument("--index", required=True)
    p.add_argument("--split", default="test", choices=("train", "validation", "test"))
    p.add_argument("--backend", default="jax", choices=("jax", "faiss"))
    p.add_argument("--max_examples", type=int, default=0)
    p = sub.add_parser("evaluate-rag")
    p.add_argument("--run", required=True)
    p.add_argument("--split", default="test", choices=("train", "validation", "test"))
    p.add_argument("--max_examples", type=int, default=300)
    p.add_argument("--batch_size", type=int, default=16)
    # --config.key=value overrides are split off before argparse sees them.
    overrides = [a[len("--config."):] for a in argv if a.startswith("--config.")]
    args = parser.parse_args([a for a in argv if not a.startswith("--config.")])
    return args, overrides


def _config(path: str, overrides):
    config = config_lib.load_config_file(path, run_spec=False)
    config_lib.apply_overrides(config, overrides)
    return config


@errors.command_line("retrieval")
def main(argv=None) -> int:
    args, overrides = parse(sys.argv[1:] if argv is None else list(argv))
    from t5x_like.retrieval import rag_run, retriever_run
    if args.command == "train-retriever":
        retriever_run.train(_config(args.config, overrides), args.workdir)
    elif args.command == "build-index":
        info = retriever_run.build_index(args.retriever, args.output, args.shard_size)
        print(json.dumps({k: info[k] for k in ("num_docs", "dim")} | {"shards": len(info["shards"])}))
    elif args.command == "evaluate-retriever":
        result = retriever_run.evaluate(args.retriever, args.index, args.split,
                                        backend=args.backend, max_examples=args.max_examples)
        if not args.max_examples:  # the full split: kept beside the index
            result.update(retriever=args.retriever, backend=args.backend)
            suffix = "" if args.backend == "jax" else f"_{args.backend}"
            (pathlib.Path(args.index) / f"eval_{args.split}{suffix}.json").write_text(
                json.dumps(result, indent=2) + "\n")
    elif args.command == "train-rag":
        rag_run.train(_config(args.config, overrides), args.workdir)
    else:
        rag_run.evaluate(args.run, args.split, args.max_examples, args.batch_size)
    return 0
