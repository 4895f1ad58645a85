"""``t5xl``: one command with subcommands, each the same as its ``python -m`` module.

    t5xl train --config=quickstart --workdir=/tmp/run   (a packaged config by name, or a path)
    t5xl eval --checkpoint=/tmp/run --mixture=embedded_bench --output_dir=/tmp/run_eval
    t5xl summary --config=configs/t5_1_1_base.py
    t5xl convert import --hf_dir=HF_FOLDER --out=CONVERTED
    t5xl vocab --output=data/vocab/embedded_en_8k.model
"""

from __future__ import annotations

import sys

# Imports inside functions: `t5xl --help` and `--version` import nothing else; a subcommand
# imports its own module.

COMMANDS = {
    "train": ("t5x_like.train", "pretrain, fine-tune or continue a run"),
    "configs": ("t5x_like.packaged_configs", "list the packaged configs (--config=NAME) and show one"),
    "eval": ("t5x_like.eval", "evaluate checkpoints on a benchmark task or mixture"),
    "harness": ("t5x_like.harness", "run lm-evaluation-harness tasks on a decoder checkpoint"),
    "infer": ("t5x_like.infer", "generate for a task's split or a JSONL file"),
    "serve": ("t5x_like.serve", "serve a decoder checkpoint over the OpenAI API (HTTP)"),
    "summary": ("t5x_like.summary", "parameter table of a config's model"),
    "tasks": ("t5x_like.tasks", "list, show and sample registered tasks and mixtures"),
    "peft": ("t5x_like.peft", "fold LoRA into the base weights (peft merge)"),
    "convert": ("t5x_like.convert.__main__", "import/export Hugging Face checkpoints"),
    "vocab": ("t5x_like.train_vocab", "train the embedded SentencePiece vocabulary"),
    "cache_tasks": ("t5x_like.cache_tasks", "preprocess tasks once with Apache Beam (a cache)"),
    "plot": ("t5x_like.plot", "loss and accuracy curves of a run as a PNG"),
    "embed": ("t5x_like.embed", "per-layer token, word and pooled vectors of texts as .npy"),
    "retrieval": ("t5x_like.retrieval.cli", "dense retriever, index, search, RAG training/eval"),
    "scaling": ("t5x_like.scaling.cli", "fit scaling laws to runs; compute-optimal N, D for a budget"),
    "plan": ("t5x_like.plan", "compile for a TPU topology: memory, fits-HBM, FLOPs, roofline"),
    "goodput": ("t5x_like.goodput", "productive time over wall time of a workdir, by cause"),
    "launch_local": ("t5x_like.launch_local", "rehearse a multi-host run on one machine"),
    "launch": ("launch.__main__", "run on Cloud TPU VMs, GKE (xpk) or SLURM; --dry_run prints"),
}


def version() -> str:
    """This package's version (as installed, else the source's), with JAX's and Flax's."""
    from importlib import metadata

    import t5x_like

    def installed(name: str, fallback: str = "not installed") -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return fallback
    return (f"t5x_like {installed('t5x_like', t5x_like.__version__)} (jax {installed('jax')}, "
            f"flax {installed('flax')}; python {sys.version.split()[0]})")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("--version", "-V"):
        print(version())
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = ["usage: t5xl COMMAND [ARGS...]   (t5xl --version)", "", "commands:"]
        lines += [f"  {name:<8} {help_text}  (python -m {module.removesuffix('.__main__')})"
                  for name, (module, help_text) in COMMANDS.items()]
        if argv and argv[0] not in ("-h", "--help"):
            lines.insert(0, f"t5xl: unknown command {argv[0]!r}")
        asked_for_help = bool(argv) and argv[0] in ("-h", "--help")
        print("\n".join(lines), file=sys.stdout if asked_for_help else sys.stderr)
        return 0 if asked_for_help else 2
    module_name, _ = COMMANDS[argv[0]]
    module = __import__(module_name, fromlist=["main"])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
