"""Loss curves of the small pretraining recipes in bfloat16, int8 and fp8 (Qwix quantized
training, ``quantization.kind``), on this machine's CPU: XLA:CPU emulates int8 and fp8
matmuls, so the losses are what the formats give and the speeds are not the chips'.

    .venv/bin/python benchmarks/low_precision.py --steps 200 --out /tmp/low_precision.json
    .venv/bin/python benchmarks/low_precision.py --smoke   # 1-layer models, 2 steps each

Prints, per recipe (``configs/pretrain/gpt2_tiny.py``, ``t5_tiny.py``) and kind, the
training loss every ``--every`` steps, the held-out loss at the end, and the difference
from bfloat16.

``--smoke``: the rows of ``SMOKE_ROWS`` (``gpt2_tiny`` in bfloat16, the table's baseline, and
in fp8: a quantized kind, its held-out evaluation and its difference from bfloat16) with
1-layer, 32-wide models for 2 steps. Each row compiles its own train and eval steps (10-20
s on 2 busy cores; ``t5_tiny``'s encoder-decoder half as long again); int8 runs the same
code with Qwix's other kind (``tests/test_quantization.py`` trains both recipes in both),
and ``t5_tiny``'s rows run it on another recipe.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RECIPES = ("gpt2_tiny", "t5_tiny")
KINDS = ("", "int8", "fp8")
SMOKE_ROWS = (("gpt2_tiny", ""), ("gpt2_tiny", "fp8"))


def run(recipe: str, kind: str, steps: int, every: int, smoke: bool = False) -> dict:
    import t5x_like.builtin_tasks  # noqa: F401  (the embedded corpus tasks)
    from t5x_like import config_lib, train
    config = config_lib.load_config_file(str(REPO / "configs" / "pretrain" / f"{recipe}.py"))
    if smoke:  # a 1-layer, 32-wide model of the recipe on batches of 8 short rows
        import _smoke
        _smoke.tiny_model(config.model)
        config.batch_size = 8
        config.task_feature_lengths = {k: 16 for k in config.task_feature_lengths}
        config.evals.held_out.batches = 1
    config.num_train_steps = steps
    config.model.numerics.dtype = "bfloat16"
    config.quantization.kind = kind
    config.logging.every_steps = every
    config.checkpoint.every_steps = steps
    config.evals.held_out.every_steps = steps
    config.optimizer.warmup_steps = min(config.optimizer.warmup_steps, steps // 5)
    workdir = tempfile.mkdtemp(prefix=f"lp_{recipe}_{kind or 'bf16'}_")
    start = time.perf_counter()
    train.run(config, workdir, quiet=True)
    seconds = time.perf_counter() - start
    records = [json.loads(line) for line in open(pathlib.Path(workdir) / "metrics.jsonl")]
    return {"recipe": recipe, "kind": kind or "bf16", "seconds": seconds,
            "curve": [(r["step"], r["loss"]) for r in records if "loss" in r],
            "held_out": next((r["eval_loss"] for r in reversed(records) if "eval_loss" in r),
                             None)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--out", default="")
    parser.add_argument("--smoke", action="store_true",
                        help="1-layer models for 2 steps: a check that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.every = 2, 1
    rows = []
    for recipe in RECIPES:
        for kind in KINDS:
            if args.smoke and (recipe, kind) not in SMOKE_ROWS:
                continue
            rows.append(run(recipe, kind, args.steps, args.every, args.smoke))
            print(json.dumps(rows[-1]), flush=True)
            if args.out:
                pathlib.Path(args.out).write_text(json.dumps(rows, indent=1))
    steps = [s for s, _ in rows[0]["curve"]]
    print("| recipe | kind | " + " | ".join(f"loss @{s}" for s in steps)
          + " | held-out | vs bf16 (last) | wall s |")
    print("|---" * (len(steps) + 6) + "|")
    for row in rows:
        base = next(r for r in rows if r["recipe"] == row["recipe"] and r["kind"] == "bf16")
        losses = dict(row["curve"])
        held = f"{row['held_out']:.4f}" if row["held_out"] is not None else "-"
        print(f"| {row['recipe']} | {row['kind']} | "
              + " | ".join(f"{losses.get(s, float('nan')):.4f}" for s in steps)
              + f" | {held} | {row['curve'][-1][1] - base['curve'][-1][1]:+.4f} | "
              f"{row['seconds']:.0f} |")


if __name__ == "__main__":
    main()
