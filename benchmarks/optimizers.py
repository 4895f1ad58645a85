"""Muon and schedule-free AdamW against AdamW with a cosine schedule, each at its own best
learning rate from a small sweep, on the benchmark recipe's GPT-2
(``configs/pretrain/gpt2_tiny.py``: 4 layers, 128 wide, 32 x 160 tokens a step, the
embedded corpus).

    .venv/bin/python benchmarks/optimizers.py --dir=runs/optimizers [--steps 600]
        [--learning_rates 1e-3,3e-3,1e-2] [--optimizers adamw,muon,schedule_free_adamw]
    # or a grid per optimizer:
    .venv/bin/python benchmarks/optimizers.py --dir=runs/optimizers \
        --learning_rates "adamw=3e-4,1e-3,3e-3;muon=1e-3,3e-3,1e-2"

Every point is a normal ``train`` run in ``DIR/points/<optimizer>_lr<rate>`` (a finished
point is skipped, an unfinished one resumes), evaluated on 4 held-out batches every 50
steps. AdamW and Muon decay by cosine to 10% of the peak at the run's end after 10%
warmup; schedule-free holds the peak after the same warmup (it replaces the decay) and is
evaluated on its averaged weights. The table gives, per optimizer, the held-out loss of
each learning rate at the last step, then for the best rate: the steps it took to reach
the best AdamW run's final held-out loss (interpolated between evaluations; the
speedrun's claim is ~1.35x fewer for Muon) and the median train-step time of the run
(other load on the machine shows in it).

``--time_steps N`` instead times the train step of each optimizer in this one process
(same model, batch and mesh; rounds alternate between optimizers and each keeps its
fastest round): Newton-Schulz's cost on this CPU without the noise of separate runs.

``--smoke``: both modes at tiny sizes, a check that the script runs, each optimizer once:
AdamW and schedule-free AdamW (``SMOKE_TRAINED``: the table's baseline, and the one with
its own schedule and averaged-weights evaluation) at one rate for 2 steps of a 1-layer,
32-wide model (in a temporary ``--dir`` unless one is given), then ``--time_steps 1`` of
the same model, one round, for the first other optimizer (Muon; the timing loop is the
same for each). Each training run or timed optimizer compiles its own steps (10-15 s on
2 busy cores).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile

import _smoke

REPO = pathlib.Path(__file__).resolve().parents[1]
EVAL_EVERY = 50
# What --smoke adds to every training command: tiny model, batches and evaluation.
SMOKE_OVERRIDES = ["--config.batch_size=8", "--config.task_feature_lengths.targets=16",
                   "--config.eval_batches=1"]
# The optimizers --smoke trains (the others' steps are timed; see the docstring).
SMOKE_TRAINED = ("adamw", "schedule_free_adamw")


def point_dir(root: pathlib.Path, optimizer: str, lr: float) -> pathlib.Path:
    return root / "points" / f"{optimizer}_lr{lr:g}"


def run_point(root: pathlib.Path, optimizer: str, lr: float, steps: int,
              extra: list[str] = ()) -> None:
    workdir = point_dir(root, optimizer, lr)
    if _records(workdir) and _records(workdir)[-1]["step"] >= steps:
        return
    schedule = "constant" if optimizer == "schedule_free_adamw" else "cosine"
    every = min(EVAL_EVERY, steps)
    command = ["--config=configs/pretrain/gpt2_tiny.py",
               f"--workdir={workdir}", f"--config.num_train_steps={steps}",
               f"--config.optimizer.name={optimizer}", f"--config.optimizer.learning_rate={lr}",
               f"--config.optimizer.schedule={schedule}",
               f"--config.optimizer.warmup_steps={steps // 10}",
               "--config.optimizer.final_learning_rate_fraction=0.1",
               f"--config.eval_every_steps={every}", "--config.eval_batches=4",
               f"--config.log_every_steps={every}",
               f"--config.checkpoint_every_steps={steps}", "--quiet", *extra]
    print(f"training {workdir.name} ({steps} steps)", flush=True)
    _smoke.cli("t5x_like.train", command, cwd=REPO)


def _records(workdir: pathlib.Path) -> list[dict]:
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def eval_curve(workdir: pathlib.Path) -> list[tuple[int, float]]:
    return [(r["step"], r["eval_loss"]) for r in _records(workdir) if "eval_loss" in r]


def steps_to_reach(curve: list[tuple[int, float]], target: float) -> float | None:
    """The first step whose held-out loss is at most ``target``, interpolated linearly
    between the evaluations around the crossing (None: never reached)."""
    previous = None
    for step, loss in curve:
        if loss <= target:
            if previous is None or previous[1] == loss:
                return float(step)
            (s0, l0) = previous
            return s0 + (step - s0) * (l0 - target) / (l0 - loss)
        previous = (step, loss)
    return None


def step_seconds(workdir: pathlib.Path) -> float:
    """Median seconds per train step over the logged intervals after the first (which
    includes compilation)."""
    rates = [r["steps_per_sec"] for r in _records(workdir) if "steps_per_sec" in r][1:]
    return 1.0 / statistics.median(rates)


def report(root: pathlib.Path, grid: dict[str, list[float]]) -> str:
    """The table: each optimizer's held-out loss at every rate it ran ("-" where its grid
    has no such rate), and its best rate's steps to AdamW's best final loss and step time."""
    if "adamw" not in grid:
        raise SystemExit("the table compares with adamw: include it in --optimizers")
    rates = sorted({lr for lrs in grid.values() for lr in lrs})
    finals = {(o, lr): eval_curve(point_dir(root, o, lr))[-1][1]
              for o, lrs in grid.items() for lr in lrs}
    best = {o: min(lrs, key=lambda lr, o=o: finals[(o, lr)]) for o, lrs in grid.items()}
    target = finals[("adamw", best["adamw"])]
    adamw_steps = steps_to_reach(eval_curve(point_dir(root, "adamw", best["adamw"])), target)
    adamw_time = step_seconds(point_dir(root, "adamw", best["adamw"]))
    header = ("| optimizer | " + " | ".join(f"lr {lr:g}" for lr in rates)
              + " | best lr | steps to AdamW's final loss | vs AdamW | s/step | vs AdamW |")
    lines = [header, "|" + " --- |" * (len(rates) + 6)]
    for o in grid:
        workdir = point_dir(root, o, best[o])
        reached = steps_to_reach(eval_curve(workdir), target)
        seconds = step_seconds(workdir)
        cells = [f"{finals[(o, lr)]:.4f}" if (o, lr) in finals else "-" for lr in rates]
        lines.append(
            f"| {o} | " + " | ".join(cells)
            + f" | {best[o]:g} | {'not reached' if reached is None else f'{reached:.0f}'}"
            + f" | {'-' if reached is None else f'{adamw_steps / reached:.2f}x'}"
            + f" | {seconds:.3f} | {seconds / adamw_time:.2f}x |")
    return "\n".join(lines)


def parse_grid(learning_rates: str, optimizers: list[str]) -> dict[str, list[float]]:
    """``1e-3,3e-3`` for every optimizer, or ``adamw=3e-4,1e-3;muon=1e-3,1e-2``."""
    if "=" not in learning_rates:
        rates = [float(x) for x in learning_rates.split(",")]
        return {o: rates for o in optimizers}
    grid = {}
    for part in learning_rates.split(";"):
        name, rates = part.split("=")
        grid[name.strip()] = [float(x) for x in rates.split(",")]
    return grid


def time_steps(optimizers: list[str], steps: int, rounds: int = 3, smoke: bool = False) -> str:
    """Seconds per train step of each optimizer on ``configs/pretrain/gpt2_tiny.py``."""
    import time

    import jax
    import numpy as np

    from t5x_like import config_lib, structures
    from t5x_like.engine import partitioning
    from t5x_like.engine import trainer as trainer_lib

    trainers, states, batch = {}, {}, None
    for name in optimizers:
        config = config_lib.load_config_file(str(REPO / "configs/pretrain/gpt2_tiny.py"))
        if smoke:
            _smoke.tiny_model(config.model)
            config.batch_size, config.task_feature_lengths = 8, {"targets": 16}
        config.optimizer.name = name
        config.optimizer.schedule = "constant"
        config_lib.validate(config)
        mesh = partitioning.make_mesh({"data": 1}, jax.devices()[:1])
        trainers[name] = trainer_lib.build_trainer(config, mesh)
        states[name] = trainers[name].init_state(0)
        if batch is None:
            shapes = structures.for_config(config).abstract_batch(config.task_feature_lengths,
                                                                  config.batch_size)
            rng = np.random.default_rng(0)
            batch = {k: (np.ones(v.shape, np.float32) if v.dtype == np.float32 else
                         rng.integers(4, 8000, v.shape).astype(np.int32))
                     for k, v in shapes.items()}
        for _ in range(2):  # compile and warm up
            states[name], metrics = trainers[name].train_step(states[name], batch)
        jax.block_until_ready(metrics)
    best = {name: float("inf") for name in optimizers}
    for _ in range(rounds):
        for name in optimizers:
            start = time.perf_counter()
            for _ in range(steps):
                states[name], metrics = trainers[name].train_step(states[name], batch)
            jax.block_until_ready(metrics)
            best[name] = min(best[name], (time.perf_counter() - start) / steps)
    base = best.get("adamw", next(iter(best.values())))
    lines = ["| optimizer | s/step | vs adamw |", "| --- | --- | --- |"]
    lines += [f"| {name} | {seconds:.4f} | {seconds / base:.3f}x |" for name, seconds in best.items()]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="", help="where the runs go (required but in --smoke)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--learning_rates", default="1e-3,3e-3,1e-2")
    parser.add_argument("--optimizers", default="adamw,muon,schedule_free_adamw")
    parser.add_argument("--report_only", action="store_true")
    parser.add_argument("--time_steps", type=int, default=0,
                        help="Time N train steps of each optimizer in-process instead.")
    parser.add_argument("--smoke", action="store_true",
                        help="both modes at tiny sizes: a check that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        optimizers = args.optimizers.split(",")
        trained = [o for o in optimizers if o in SMOKE_TRAINED] or optimizers[:1]
        with tempfile.TemporaryDirectory(prefix="optimizers_smoke_") as scratch:
            _smoke.IN_PROCESS = True
            extra = _smoke.tiny_overrides() + SMOKE_OVERRIDES
            root = pathlib.Path(args.dir or scratch)
            grid = {o: [1e-3] for o in trained}
            for optimizer, lrs in grid.items():
                run_point(root, optimizer, lrs[0], 2, extra)
            print("held-out loss after 2 steps (configs/pretrain/gpt2_tiny.py, tiny)")
            print(report(root, grid))
        print("train step of configs/pretrain/gpt2_tiny.py (tiny), 1 round of 1 step")
        print(time_steps([o for o in optimizers if o not in trained][:1] or optimizers[:1], 1,
                         rounds=1, smoke=True))
        return
    if not args.dir:
        parser.error("--dir is required")
    if args.time_steps:
        print(f"train step of configs/pretrain/gpt2_tiny.py, best of 3 rounds of "
              f"{args.time_steps} steps")
        print(time_steps(args.optimizers.split(","), args.time_steps))
        return
    root = pathlib.Path(args.dir)
    grid = parse_grid(args.learning_rates, args.optimizers.split(","))
    if not args.report_only:
        for index in range(max(len(lrs) for lrs in grid.values())):
            for optimizer, lrs in grid.items():  # every optimizer's i-th rate, then the next
                if index < len(lrs):
                    run_point(root, optimizer, lrs[index], args.steps)
    print(f"held-out loss after {args.steps} steps (configs/pretrain/gpt2_tiny.py)")
    print(report(root, grid))


if __name__ == "__main__":
    main()
