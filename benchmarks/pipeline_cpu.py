"""What pipeline stages cost on 8 fake CPU devices: the train step of a small decoder
with every layer on every device (data parallel) against layers split over a ``stage``
axis (GPipe and circular schedules), at the same global batch.

    .venv/bin/python benchmarks/pipeline_cpu.py [--length 256] [--batch 32] [--steps 5] [--smoke]

Fake devices share this machine's cores, so the times show the cost of the machinery
(the bubble's wasted stage-iterations, the hand-overs, the per-stage gathers of each
microbatch's masks), not a speed-up: on real chips the point is that a model whose
layers do not fit FSDP x tensor on one slice can be split, and that only activations
cross slow links. Columns as ``context_parallel_cpu.py``'s, plus the bubble. ``--smoke``:
the row of ``SMOKE_ROWS`` (circular: stages that hand microbatches on, lap after lap;
GPipe runs the same pipeline function for one lap, data parallel compiles as every train
step does, and the other rows change sizes or add FSDP to a stage; each row's compile
takes 15-20 s on 2 busy cores) with the same 8 layers at 32 wide, 32 tokens a row and one
timed step, a check that the script runs (its ratio is to itself).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import jax  # noqa: E402
from context_parallel_cpu import measure  # noqa: E402

from t5x_like import config_lib  # noqa: E402
from t5x_like.models import pipeline_parallel

LAYERS = 8
ROWS = [
    # name, mesh, schedule, microbatches, layers a visit
    ("data 8", {"data": 8}, "gpipe", 0, 1),
    ("stage 2 x data 4, gpipe, 4 microbatches", {"stage": 2, "data": 4}, "gpipe", 4, 1),
    ("stage 4 x data 2, gpipe, 4 microbatches", {"stage": 4, "data": 2}, "gpipe", 4, 1),
    ("stage 4 x data 2, gpipe, 16 microbatches", {"stage": 4, "data": 2}, "gpipe", 16, 1),
    ("stage 4 x data 2, circular (2 laps), 4 microbatches", {"stage": 4, "data": 2},
     "circular", 4, 1),
    ("stage 2 x fsdp 2 x data 2, gpipe, 4 microbatches", {"stage": 2, "fsdp": 2, "data": 2},
     "gpipe", 4, 1),
]
SMOKE_ROWS = ("stage 4 x data 2, circular (2 laps), 4 microbatches",)


def config_for(mesh: dict, schedule: str, microbatches: int, per_visit: int, length: int,
               batch: int, smoke: bool = False):
    config = config_lib.load_config_file("configs/pretrain/gpt2_tiny.py")
    if smoke:
        import _smoke
        _smoke.tiny_model(config.model, layers=LAYERS)
    config.task_feature_lengths = {"targets": length}
    config.model.positions.max_length = length
    config.model.num_layers = LAYERS
    config.model.numerics.scan_layers = True
    config.batch_size = batch
    config.mesh.update(mesh)
    config.partitioning.pipeline_schedule = schedule
    config.partitioning.pipeline_microbatches = microbatches
    config.partitioning.pipeline_layers_per_stage = per_visit
    config_lib.validate(config)
    return config


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny widths and sizes")
    args = parser.parse_args(argv)
    if args.smoke:
        args.length, args.steps = 32, 1
    print(f"gpt2_tiny ({LAYERS} layers, d_model {32 if args.smoke else 128}), {args.batch} rows x {args.length} "
          f"tokens, {jax.device_count()} fake CPU devices\n")
    print("| mesh | bubble | compile s | step s | step vs data 8 | first loss "
          "| temp MiB / device |")
    print("|---|---|---|---|---|---|---|")
    base = None
    for name, mesh, schedule, microbatches, per_visit in ROWS:
        if args.smoke and name not in SMOKE_ROWS:
            continue
        config = config_for(mesh, schedule, microbatches, per_visit, args.length, args.batch,
                            args.smoke)
        stages = mesh.get("stage", 1)
        settings = pipeline_parallel.PipelineSettings(schedule, microbatches, per_visit)
        bubble = pipeline_parallel.bubble_fraction(stages, settings.num_microbatches(stages),
                                          settings.repeats(LAYERS, stages))
        row = measure(config, args.steps)
        base = base or row["step_s"]
        print(f"| {name} | {100 * bubble:.0f}% | {row['compile_s']:.1f} | {row['step_s']:.3f} | "
              f"{row['step_s'] / base:.2f}x | {row['loss']:.6f} | {row['temp_mib']:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
