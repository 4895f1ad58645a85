"""A Llama-3.1-405B-shaped decoder on two v5p-256 slices (2 x 4x4x8, 256 chips) joined
by the data-center network, planned ahead of time with and without pipeline stages.

    python benchmarks/pipeline_plan.py [--rows all] [--length 4096] [--batch 256]
    python benchmarks/pipeline_plan.py --smoke   # tiny: a check that it runs

Each row compiles the real train step with ``t5x_like.plan`` (libtpu's compiler; no TPU
needed) in bfloat16, scanned layers, full rematerialisation, the same global batch.
Without stages the slices are data parallel (hybrid FSDP: each slice holds a whole
copy of the parameters and optimizer state, sharded over its 128 chips); with
``partitioning.pipeline_over_dcn`` the slices hold the two halves of the 126 layers,
so a chip holds half as much, and only activations cross the slow network. Printed:
memory per chip, whether it fits, the bubble, the roofline step (compute with the
bubble, HBM, collectives), and the collectives' bytes per chip and step by the mesh
axes they cross.

``--smoke``: the circular row (``SMOKE_ROWS``) with a 4-layer, 32-wide model of the same
config (1 layer a visit: 2 laps of the 2 stages) at 8 rows of 256 tokens on 2 x
v5p:2x2x1 (fsdp 4 a slice), a check that the script runs. One row: libtpu's compile of
even a tiny model takes 20-30 s on 2 busy cores; the circular row stages over DCN as the
GPipe row does and adds the schedule and the layers a visit, and the row without stages
plans as every other planner does.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "benchmarks"))

from context_parallel_plan import plan_cells  # noqa: E402

from t5x_like import config_lib  # noqa: E402
from t5x_like.planner import aot_planner  # noqa: E402

TOPOLOGY, SLICES = "v5p:4x4x8", 2

ROWS = {
    # name: overrides
    "data over slices (hybrid FSDP)": {"mesh.dcn": 2, "mesh.fsdp": 128},
    "gpipe: a stage a slice": {"mesh.dcn": 2, "mesh.fsdp": 128,
                               "partitioning.pipeline_over_dcn": True},
    "circular: 7 layers a visit": {"mesh.dcn": 2, "mesh.fsdp": 128,
                                   "partitioning.pipeline_over_dcn": True,
                                   "partitioning.pipeline_schedule": "circular",
                                   "partitioning.pipeline_layers_per_stage": 7},
}


SMOKE_TOPOLOGY, SMOKE_LAYERS = "v5p:2x2x1", 4
SMOKE_ROWS = ("circular: 7 layers a visit",)


def plan_row(overrides: dict, length: int, batch: int, smoke: bool = False) -> dict:
    config = config_lib.load_config_file(str(ROOT / "configs/open_decoders.py:llama-3.1-405b"))
    if smoke:  # 4 layers: 2 a stage, 1 a circular visit; fsdp over a slice's 4 chips
        import _smoke
        _smoke.tiny_model(config.model, layers=SMOKE_LAYERS)
        overrides = dict(overrides, **{"mesh.fsdp": 4})
        if "partitioning.pipeline_layers_per_stage" in overrides:
            overrides["partitioning.pipeline_layers_per_stage"] = 1
    config_lib.apply_overrides(config, [
        f"task_feature_lengths.targets={length}", f"batch_size={batch}",
        "model.numerics.dtype=bfloat16", "model.numerics.scan_layers=True",
        "model.numerics.remat_policy=full", "mesh.data=1", "mesh.stage=1",
        *(f"{key}={value}" for key, value in overrides.items())])
    return aot_planner.plan(config, SMOKE_TOPOLOGY if smoke else TOPOLOGY, SLICES)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rows", default="all", help="comma-separated row names, or all")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny model on 2 x 4 chips: a check that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.length, args.batch = 256, 8
    aot_planner.prepare_compiler_environment()  # this machine is no TPU VM
    names = (list(SMOKE_ROWS if args.smoke else ROWS) if args.rows == "all"
             else args.rows.split(","))
    print("| mesh | memory / chip (GiB) | fits | bubble | roofline step s (bound) "
          "| compute / HBM / collectives s | MFU | collectives GB / chip by axes |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        report = plan_row(ROWS[name], args.length, args.batch, args.smoke)
        memory, step, parts, moved = plan_cells(report)
        roof = report.get("roofline") or {}
        mfu = f"{100 * roof['mfu']:.0f}%" if roof.get("mfu") else "—"
        bubble = report.get("pipeline", {}).get("bubble")
        bubble = "—" if bubble is None else f"{100 * bubble:.1f}%"
        print(f"| {name} | {memory:.1f} | {'yes' if report['fits'] else 'no'} | {bubble} "
              f"| {step} | {parts} | {mfu} | {moved} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
