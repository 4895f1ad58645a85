"""What context parallelism costs on 8 fake CPU devices: the train step of a small
decoder with every row whole on its device (data parallel) against rows split over a
``context`` axis (all-gather and ring attention), at the same global batch.

    .venv/bin/python benchmarks/context_parallel_cpu.py [--length 1024] [--steps 5] [--smoke]

Fake devices share this machine's cores, so the times show the cost of the machinery
(the extra collectives, the ring's recomputed folds, the load-balancing permutes), not
a speed-up: on real chips the point is that a row no longer has to fit one chip. Each
row prints the compile time, the fastest of ``--steps`` steps after one warm-up, the
loss of the first step (equal across rows: the same model, batch and seed) and the
per-device temporary memory XLA reports for the compiled step. ``--smoke``: the row of
``SMOKE_ROWS`` (ring attention over a context axis; the all-gather row changes only
``partitioning.context_attention``, whose two strategies ``tests/test_context_parallel.py``
compares, data parallel compiles as every train step does, and the context-8 rows repeat
them on a wider axis; each row is another compile) with a 1-layer, 32-wide model of the
recipe, 64 tokens a row and one timed step, a check that the script runs (its ratio is
to itself).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from t5x_like import config_lib  # noqa: E402
from t5x_like.engine import partitioning  # noqa: E402
from t5x_like.engine import trainer as trainer_lib  # noqa: E402

ROWS = [
    # name, mesh, context attention
    ("data 8", {"data": 8}, "all_gather"),
    ("data 2 x context 4, all-gather", {"data": 2, "context": 4}, "all_gather"),
    ("data 2 x context 4, ring", {"data": 2, "context": 4}, "ring"),
    ("context 8, all-gather", {"data": 1, "context": 8}, "all_gather"),
    ("context 8, ring", {"data": 1, "context": 8}, "ring"),
]
SMOKE_ROWS = ("data 2 x context 4, ring",)


def config_for(mesh: dict, strategy: str, length: int, batch: int, smoke: bool = False):
    config = config_lib.load_config_file("configs/pretrain/gpt2_tiny.py")
    if smoke:
        import _smoke
        _smoke.tiny_model(config.model)
    config.task_feature_lengths = {"targets": length}
    config.model.positions.max_length = length
    config.batch_size = batch
    config.mesh.update(mesh)
    config.partitioning.context_attention = strategy
    config_lib.validate(config)
    return config


def measure(config, steps: int) -> dict:
    """Compile time, fastest step, first loss and temporary memory of ``config``'s train
    step on the fake devices (also ``pipeline_cpu.py``'s)."""
    batch, length = config.batch_size, config.task_feature_lengths["targets"]
    _, trainer = trainer_lib.build_on_devices(config)
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, config.model.vocab_size, (batch, length)).astype(np.int32)
    batch_arrays = {"decoder_input_tokens": tokens, "decoder_target_tokens": tokens,
                    "decoder_loss_weights": np.ones((batch, length), np.float32)}
    batch_arrays = partitioning.global_batch(batch_arrays, trainer.mesh, trainer.rules)
    state = trainer.init_state(0)
    started = time.perf_counter()
    compiled = trainer.lower_train_step(state, batch_arrays).compile()
    compile_s = time.perf_counter() - started
    temp = compiled.memory_analysis().temp_size_in_bytes
    state, metrics = trainer.train_step(state, batch_arrays)
    first_loss = float(metrics["loss"])
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        state, metrics = trainer.train_step(state, batch_arrays)
        jax.block_until_ready(metrics["loss"])
        times.append(time.perf_counter() - started)
    return {"compile_s": compile_s, "step_s": min(times), "loss": first_loss,
            "temp_mib": temp / 2**20}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny model and sizes")
    args = parser.parse_args(argv)
    if args.smoke:
        args.length, args.steps = 64, 1
    model = "1 layer, d_model 32" if args.smoke else "4 layers, d_model 128"
    print(f"gpt2_tiny ({model}), {args.batch} rows x {args.length} tokens, "
          f"{jax.device_count()} fake CPU devices\n")
    print("| mesh | compile s | step s | step vs data 8 | first loss | temp MiB / device |")
    print("|---|---|---|---|---|---|")
    base = None
    for name, mesh, strategy in ROWS:
        if args.smoke and name not in SMOKE_ROWS:
            continue
        row = measure(config_for(mesh, strategy, args.length, args.batch, args.smoke), args.steps)
        base = base or row["step_s"]
        print(f"| {name} | {row['compile_s']:.1f} | {row['step_s']:.3f} | "
              f"{row['step_s'] / base:.2f}x | {row['loss']:.6f} | {row['temp_mib']:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
