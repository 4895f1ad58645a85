"""Loop overhead of ``train.py``: data, metrics and async checkpoints as % of step time.

    python benchmarks/loop_overhead.py [--steps 200] [--repeats 2] [--smoke]

For the quickstart config, on this machine's devices:

1. the bare jitted train step, back to back on one batch already on device;
2. the real loop (``train.run``: data pipeline, host->device batches, metrics
   fetch + metrics.jsonl + TensorBoard every logging.every_steps, an async orbax
   checkpoint every checkpoint.every_steps), timed from its metrics.jsonl
   intervals after the first (compiling) step; evaluation is left out of the
   intervals, as it is not overhead of training.

Overhead = loop time per step / bare step time - 1; the target is under 5 %.
Each measurement is repeated and the fastest kept (this machine is shared).
The component rows time each part alone, on the host, for the same steps.

``--smoke``: the quickstart recipe with a 1-layer, 32-wide model, batches of 8 rows of
32/8 tokens, 4 steps logged every step and checkpointed every 2, once, without the final
evaluation (outside what is measured, and another compile): a check that the script runs
(its percentages mean nothing at that size).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import jax

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from t5x_like import config_lib, train  # noqa: E402
from t5x_like.checkpoints import checkpoint_store  # noqa: E402
from t5x_like.data import pipeline  # noqa: E402
from t5x_like.engine import partitioning  # noqa: E402
from t5x_like.engine import trainer as trainer_lib  # noqa: E402
from t5x_like.telemetry import metrics_writer  # noqa: E402


def quickstart(steps: int, smoke: bool = False):
    config = config_lib.load_config_file(str(REPO / "configs" / "quickstart.py"))
    if smoke:
        import _smoke
        _smoke.tiny_model(config.model)
        config.batch_size, config.task_feature_lengths = 8, {"inputs": 32, "targets": 8}
        config.logging.every_steps, config.checkpoint.every_steps = 1, 2
        config.evals.held_out.batches = 1
    config.num_train_steps = steps
    # only the final evaluation, outside the intervals (--smoke: none)
    config.evals.held_out.every_steps = 0 if smoke else 10 * steps
    config_lib.validate(config)
    return config


def bare_step_seconds(config, steps: int) -> float:
    mesh = partitioning.make_mesh(config_lib.validate_for_devices(config, jax.device_count()))
    trainer = trainer_lib.build_trainer(config, mesh)
    state = trainer.init_state(0)
    dataset = pipeline.build_dataset(config.task, "train", dict(config.task_feature_lengths),
                                     seed=0, shuffle=True)
    batch = partitioning.global_batch(next(pipeline.HostBatchIterator(dataset, config.batch_size)),
                                      mesh)
    state, metrics = trainer.train_step(state, batch)  # compile
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = trainer.train_step(state, batch)
    jax.block_until_ready((state, metrics))
    return (time.perf_counter() - start) / steps


def loop_step_seconds(config, workdir: str) -> float:
    train.run(config, workdir, quiet=True)
    records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    seconds, steps, previous = 0.0, 0, records[0]["step"]
    for record in records[1:]:
        interval = record["step"] - previous
        seconds += interval / record["steps_per_sec"]
        steps += interval
        previous = record["step"]
    return seconds / steps


def component_seconds(config, steps: int, workdir: str) -> dict[str, float]:
    """Per-step host time of each loop part, run alone."""
    mesh = partitioning.make_mesh(config_lib.validate_for_devices(config, jax.device_count()))
    dataset = pipeline.build_dataset(config.task, "train", dict(config.task_feature_lengths),
                                     seed=0, shuffle=True)
    batches = pipeline.HostBatchIterator(dataset, config.batch_size)
    start = time.perf_counter()
    for _ in range(steps):
        jax.block_until_ready(partitioning.global_batch(next(batches), mesh))
    data = (time.perf_counter() - start) / steps

    writer = metrics_writer.MetricsWriter(workdir)
    record = {k: 1.0 for k in ("loss", "z_loss", "accuracy", "learning_rate", "grad_norm",
                               "num_target_tokens", "tokens_per_sec", "steps_per_sec")}
    logs = max(steps // config.logging.every_steps, 1)
    start = time.perf_counter()
    for step in range(logs):
        writer.write(step, record)
    metrics = (time.perf_counter() - start) / steps
    writer.close()

    trainer = trainer_lib.build_trainer(config, mesh)
    state = trainer.init_state(0)
    checkpointer = checkpoint_store.Checkpointer(os.path.join(workdir, "ckpt"), keep=2)
    saves = max(steps // config.checkpoint.every_steps, 1)
    start = time.perf_counter()
    for index in range(saves):
        checkpointer.save(index + 1, state, {"step": index}, config.to_dict())
    checkpoint = (time.perf_counter() - start) / steps  # the blocking part; writing is async
    checkpointer.close()
    return {"data (pipeline + host->device)": data, "metrics (jsonl + TensorBoard)": metrics,
            "checkpoint (blocking part of async save)": checkpoint}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny model for 4 steps: a check that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.repeats = 4, 1
    config = quickstart(args.steps, args.smoke)
    bare, loop = [], []
    for _ in range(args.repeats):
        bare.append(bare_step_seconds(config, args.steps))
        with tempfile.TemporaryDirectory() as workdir:
            loop.append(loop_step_seconds(config, workdir))
    with tempfile.TemporaryDirectory() as workdir:
        parts = component_seconds(config, args.steps, workdir)
    step, full = min(bare), min(loop)
    overhead = full / step - 1
    devices = f"{jax.device_count()} x {jax.devices()[0].device_kind}"
    print(f"loop overhead, quickstart config, {args.steps} steps, {devices}, "
          f"log every {config.logging.every_steps}, checkpoint every "
          f"{config.checkpoint.every_steps} steps (best of {args.repeats})")
    print(f"{'':48s} {'ms/step':>9s} {'% of step':>10s}")
    print(f"{'bare train step':48s} {1e3 * step:9.2f} {100.0:9.1f}%")
    print(f"{'full loop (train.run)':48s} {1e3 * full:9.2f} {100 * full / step:9.1f}%")
    print(f"{'  overhead':48s} {1e3 * (full - step):9.2f} {100 * overhead:9.1f}%  "
          f"(target < 5%: {'met' if overhead < 0.05 else 'NOT met'})")
    for name, seconds in parts.items():
        print(f"{'  alone: ' + name:48s} {1e3 * seconds:9.2f} {100 * seconds / step:9.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
