"""A Llama-3.1-8B-shaped decoder at 128k tokens a row on v5p-64 (2x4x4, 32 chips),
planned ahead of time with and without context parallelism.

    python benchmarks/context_parallel_plan.py [--length 131072] [--rows all]
    python benchmarks/context_parallel_plan.py --rows "fsdp 2 x context 16, all-gather"
    python benchmarks/context_parallel_plan.py --smoke   # tiny: a check that it runs

Each row compiles the real train step with ``t5x_like.plan`` (libtpu's compiler; no TPU
needed) in bfloat16, scanned layers, full rematerialisation. Without a context axis the
smallest batch is one row a chip (32 rows: the batch must divide over the 32 data-
parallel chips), and each chip holds a whole row's activations; with ``mesh.context=C``
a row's positions split over C chips, so 32 / C rows make a step. Printed: memory per
chip, whether it fits, the roofline step (compute, HBM, collectives), and the
collectives' bytes per chip and step by the mesh axes they cross.

``--smoke``: the ring row (fsdp 2 x context 2) with a 1-layer, 32-wide model of the same
config at 256 tokens a row on v5p:2x2x1 (4 chips), a check that the script runs. One row:
libtpu's compile of even a tiny model takes 20-30 s on 2 busy cores, the all-gather row
differs only in ``partitioning.context_attention`` (whose two strategies the context-
parallel tests compare), and the row without a context axis plans as every other planner
does.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from t5x_like import config_lib  # noqa: E402
from t5x_like.planner import aot_planner  # noqa: E402

GiB = 1024**3
TOPOLOGY = "v5p:2x4x4"
CHIPS = 32

ROWS = {
    # name: mesh, context attention
    "fsdp 32 (no context)": ({"data": 1, "fsdp": 32, "context": 1}, "all_gather"),
    "fsdp 2 x context 16, ring": ({"data": 1, "fsdp": 2, "context": 16}, "ring"),
    "fsdp 2 x context 16, all-gather": ({"data": 1, "fsdp": 2, "context": 16}, "all_gather"),
}
# --smoke: a context axis on 4 chips (one compile: see the docstring).
SMOKE_TOPOLOGY, SMOKE_CHIPS, SMOKE_LENGTH = "v5p:2x2x1", 4, 256
SMOKE_ROWS = {
    "fsdp 2 x context 2, ring": ({"data": 1, "fsdp": 2, "context": 2}, "ring"),
}


def plan_row(mesh: dict, strategy: str, length: int, smoke: bool = False) -> dict:
    config = config_lib.load_config_file(str(ROOT / "configs/open_decoders.py:llama-3.1-8b"))
    if smoke:
        import _smoke
        _smoke.tiny_model(config.model)
    chips, topology = (SMOKE_CHIPS, SMOKE_TOPOLOGY) if smoke else (CHIPS, TOPOLOGY)
    batch = chips // mesh["context"]
    config_lib.apply_overrides(config, [
        f"task_feature_lengths.targets={length}", f"model.positions.max_length={length}",
        f"batch_size={batch}", "model.numerics.dtype=bfloat16",
        "model.numerics.scan_layers=True", "model.numerics.remat_policy=full",
        f"partitioning.context_attention={strategy}",
        *(f"mesh.{axis}={size}" for axis, size in mesh.items())])
    return aot_planner.plan(config, topology)


def plan_cells(report: dict) -> tuple[float, str, str, str]:
    """A plan's table cells: memory per chip (GiB), the roofline step and its bound, the
    compute / HBM / collectives times, and the collectives' GB per chip by axes (also
    ``pipeline_plan.py``'s)."""
    memory = report["memory_per_device"]["total"] / GiB
    roof = report.get("roofline") or {}
    step = (f"{roof['step_s']:.2f} ({roof['bound']})" if roof.get("step_s") is not None
            else "—")
    parts = (" / ".join("—" if roof.get(k) is None else f"{roof[k]:.2f}"
                        for k in ("compute_s", "memory_s", "communication_s"))
             if roof else "—")
    moved = ", ".join(f"{row['axes']} {row['bytes'] / 1e9:.1f}"
                      for row in report.get("collectives_per_device") or []) or "—"
    return memory, step, parts, moved


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=131_072)
    parser.add_argument("--rows", default="all", help="row names separated by ';', or all")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny model on 4 chips: a check that the script runs")
    args = parser.parse_args(argv)
    rows = SMOKE_ROWS if args.smoke else ROWS
    if args.smoke:
        args.length = SMOKE_LENGTH
    aot_planner.prepare_compiler_environment()  # this machine is no TPU VM
    names = list(rows) if args.rows == "all" else [n.strip() for n in args.rows.split(";")]
    print("| mesh | rows x tokens | memory / chip (GiB) | fits | roofline step s (bound) "
          "| compute / HBM / collectives s | collectives GB / chip by axes |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        mesh, strategy = rows[name]
        report = plan_row(mesh, strategy, args.length, args.smoke)
        memory, step, parts, moved = plan_cells(report)
        print(f"| {name} | {report['batch_size']} x {args.length:,} | {memory:.1f} "
              f"| {'yes' if report['fits'] else 'no'} | {step} | {parts} | {moved} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
