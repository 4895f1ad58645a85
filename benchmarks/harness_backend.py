"""lm-evaluation-harness with our backend against its Hugging Face backend, same weights.

    .venv/bin/python benchmarks/harness_backend.py --checkpoint=runs/pt_gpt2 \
        [--tasks=austen_suite] [--include_path=data/lm_eval] [--limit=0] [--batch_size=16]
    .venv/bin/python benchmarks/harness_backend.py --smoke   # tiny: a check that it runs

Exports the decoder checkpoint to a Hugging Face folder with ``convert export`` (its
tokenizer included), then runs the same harness tasks twice through lm-eval's
``simple_evaluate``: ``model="t5x_like"`` on the checkpoint, and lm-eval's ``HFLM`` on
the export (no BOS, EOS as the prefix token, the checkpoint's window), and prints every
metric of both, their difference, how many requests got the same answer
(log-likelihood within 1e-4 and is_greedy, or the same generated text), and each
side's wall time (ours a second time too, its programs then compiled).
Needs the ``lm_eval`` extra.

``--smoke``: a tiny GPT-2 pretraining run (2 steps, 1 layer, 32 wide; made in a temporary
``--runs`` unless it holds ``pt_gpt2``) unless ``--checkpoint`` is given, the first 4
documents of each task, batches of 8, and only the tasks of ``--include_path`` indexed
(not lm-eval's own thousands, which each of the three runs would index again): a check
that the script runs.
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


def run(lm, names, include_path, limit, include_defaults=True):
    """``include_defaults``: lm-eval's own tasks indexed too (all but ``--smoke``)."""
    import lm_eval
    from lm_eval.tasks import TaskManager
    start = time.perf_counter()
    out = lm_eval.simple_evaluate(model=lm, tasks=names, limit=limit or None,
                                  task_manager=TaskManager(include_path=include_path,
                                                           include_defaults=include_defaults),
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
    parser.add_argument("--checkpoint", default="", help="required but in --smoke")
    parser.add_argument("--tasks", default="austen_suite")
    parser.add_argument("--include_path", default=str(ROOT / "data" / "lm_eval"))
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny checkpoint and few documents: a check that the script runs")
    parser.add_argument("--runs", default="", help="--smoke: where the tiny pt_gpt2 run is made")
    args = parser.parse_args(argv)
    os.chdir(ROOT)  # the task files name their data relative to the repository
    if not args.smoke:
        if not args.checkpoint:
            parser.error("--checkpoint is required")
        return compare(args, args.checkpoint)
    import _smoke
    _smoke.IN_PROCESS = True
    args.limit, args.batch_size = 4, 8  # 8: a batch divides over 8 (fake) devices
    with tempfile.TemporaryDirectory(prefix="harness_backend_smoke_") as scratch:
        return compare(args, args.checkpoint or str(_smoke.pretrained(
            pathlib.Path(args.runs or scratch), "pt_gpt2")))


def compare(args, checkpoint: str) -> int:
    """Both backends on ``checkpoint``'s decoder: the table and the agreement line."""
    from t5x_like.convert import __main__ as convert_cli
    from t5x_like.evaluation import harness_model
    from t5x_like.evaluation import lm_eval_harness as hf_side

    names = args.tasks.split(",")
    defaults = not args.smoke
    ours_lm = harness_model.T5xLikeLM(checkpoint=checkpoint, batch_size=args.batch_size)
    with tempfile.TemporaryDirectory(prefix="harness_backend_") as folder:
        assert convert_cli.main(["export", f"--checkpoint={checkpoint}",
                                 f"--out={folder}"]) == 0
        theirs_lm = hf_side.load_model(folder, ours_lm.max_length, args.batch_size)
        theirs, theirs_s = run(theirs_lm, names, args.include_path, args.limit, defaults)
    ours, first_s = run(ours_lm, names, args.include_path, args.limit, defaults)  # compiles
    ours, ours_s = run(ours_lm, names, args.include_path, args.limit, defaults)

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
