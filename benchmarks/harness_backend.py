"""lm-evaluation-harness with our backend against its Hugging Face backend, same weights.

    .venv/bin/python benchmarks/harness_backend.py --checkpoint=runs/pt_gpt2 \
        [--tasks=austen_suite] [--include_path=data/lm_eval] [--limit=0] [--batch_size=16]

Exports the decoder checkpoint to a Hugging Face folder with ``convert export`` (its
tokenizer included), then runs the same harness tasks twice through lm-eval's
``simple_evaluate``: ``model="t5x_like"`` on the checkpoint, and lm-eval's ``HFLM`` on
the export (no BOS, EOS as the prefix token, the checkpoint's window), and prints every
metric of both, their difference, how many requests got the same answer
(log-likelihood within 1e-4 and is_greedy, or the same generated text), and each
side's wall time (ours a second time too, its programs then compiled).
Needs the ``lm_eval`` extra.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def run(lm, names, include_path, limit):
    import lm_eval
    from lm_eval.tasks import TaskManager
    start = time.perf_counter()
    out = lm_eval.simple_evaluate(model=lm, tasks=names, limit=limit or None,
                                  task_manager=TaskManager(include_path=include_path),
                                  log_samples=True, bootstrap_iters=0)
    return out, time.perf_counter() - start


def same_answers(ours, theirs) -> tuple[int, int]:
    """(requests whose answers agree, requests) over every task."""
    agree = total = 0
    for task, samples in theirs["samples"].items():
        mine = {s["doc_id"]: s for s in ours["samples"][task]}
        for sample in samples:
            for a, b in zip(mine[sample["doc_id"]]["resps"], sample["resps"], strict=True):
                total += 1
                a, b = a[0], b[0]
                if isinstance(b, str):
                    agree += a == b
                elif isinstance(b, (list, tuple)):
                    agree += abs(a[0] - b[0]) < 1e-4 and a[1] == b[1]
                else:
                    agree += abs(a - b) < 1e-4 * max(1.0, abs(b))
    return agree, total


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--tasks", default="austen_suite")
    parser.add_argument("--include_path", default=str(ROOT / "data" / "lm_eval"))
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--batch_size", type=int, default=16)
    args = parser.parse_args(argv)
    os.chdir(ROOT)  # the task files name their data relative to the repository

    from t5x_like.convert import __main__ as convert_cli
    from t5x_like.evaluation import harness_model
    from t5x_like.evaluation import lm_eval_harness as hf_side

    names = args.tasks.split(",")
    ours_lm = harness_model.T5xLikeLM(checkpoint=args.checkpoint, batch_size=args.batch_size)
    with tempfile.TemporaryDirectory(prefix="harness_backend_") as folder:
        assert convert_cli.main(["export", f"--checkpoint={args.checkpoint}",
                                 f"--out={folder}"]) == 0
        theirs_lm = hf_side.load_model(folder, ours_lm.max_length, args.batch_size)
        theirs, theirs_s = run(theirs_lm, names, args.include_path, args.limit)
    ours, first_s = run(ours_lm, names, args.include_path, args.limit)  # compiles
    ours, ours_s = run(ours_lm, names, args.include_path, args.limit)

    print(f"\n{ours_lm.loaded.description}, window {ours_lm.max_length}, batch "
          f"{args.batch_size}\n")
    print("| task | metric | t5x_like | HF backend | difference |")
    print("| --- | --- | --- | --- | --- |")
    for task, values in theirs["results"].items():
        for key, value in values.items():
            if "," not in key or "_stderr" in key or not isinstance(value, (int, float)):
                continue
            mine = ours["results"][task][key]
            print(f"| {task} | {key.split(',')[0]} ({key.split(',')[1]}) | {mine:.6g} | "
                  f"{value:.6g} | {abs(mine - value):.2g} |")
    agree, total = same_answers(ours, theirs)
    print(f"\nsame answer for {agree} of {total} requests; wall time t5x_like "
          f"{ours_s:.1f} s ({first_s:.1f} s the first time, compiling each width), HF "
          f"backend {theirs_s:.1f} s (t5x_like / HF speed {theirs_s / ours_s:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
