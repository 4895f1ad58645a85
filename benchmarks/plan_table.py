"""The "Plan before launch" table of docs/training_engine.md, regenerated: each row
compiles a config's real train step for a TPU topology with ``t5x_like.plan`` (libtpu's
compiler, no TPU needed: ``pip install -c constraints.txt -e ".[tpu]"``) and prints
memory per chip, the verdict and how long the compile took on this machine.

    python benchmarks/plan_table.py              # every row (about 4 minutes on 2 cores)
    python benchmarks/plan_table.py --skip_xxl   # the rows that compile in a minute or two
    python benchmarks/plan_table.py --only=t5_1_1_xxl
    python benchmarks/plan_table.py --smoke      # tiny: a check that it runs

Paste the table into the page with the commit it ran on (``git rev-parse --short HEAD``).

``--smoke``: the row of ``SMOKE_ROWS`` (two slices: the other rows differ only in their
config, overrides and slice count, and the other planners' smoke runs plan single slices)
with a 1-layer, 32-wide model of the same config, short rows and a small batch on 2 x
v5e:2x2, a check that the script runs.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GiB = 1024**3

# (config, topology, num_slices, overrides, what the row is)
ROWS = (
    ("t5_1_1_xl", "v5p:4x4x4", 1, [], "scanned layers"),
    ("gpt2_xl", "v5e:4x4", 1, [], "bf16, scanned, 8 microbatches"),
    ("gpt2_xl", "v5e:4x4", 2, [], "mesh dcn 2 x fsdp 16"),
    ("t5_1_1_xxl", "v5e:2x2", 1, ["model.numerics.scan_layers=False"], "unrolled"),
)
SMOKE_ROWS = {  # row (config, slices) -> its smoke topology and sizes
    ("gpt2_xl", 2): ("v5e:2x2", ["batch_size=64", "task_feature_lengths.targets=64"]),
}


def plan_row(config_name: str, topology: str, num_slices: int, overrides: list[str],
             smoke: bool = False) -> dict:
    from t5x_like import config_lib
    from t5x_like.planner import aot_planner
    config = config_lib.load_config_file(str(ROOT / "configs" / f"{config_name}.py"))
    if smoke:
        import _smoke
        _smoke.tiny_model(config.model)
    config_lib.apply_overrides(config, overrides)
    config_lib.validate(config)
    start = time.monotonic()
    report = aot_planner.plan(config, topology, num_slices)
    return {"report": report, "seconds": time.monotonic() - start}


def format_row(config_name, topology, num_slices, what, result) -> str:
    report = result["report"]
    memory = report["memory_per_device"]
    hbm = report["hbm_per_device"] / GiB
    per_chip = f"{memory['total'] / GiB:.2f} GiB of {hbm:.0f}"
    if not report["fits"]:
        per_chip += f" (temporaries {memory['temporaries'] / GiB:.0f} GiB)"
    where = topology if num_slices == 1 else f"{num_slices} x {topology}"
    name = f"`{config_name}`" + (f", `--num_slices={num_slices}`" if num_slices > 1 else "")
    return (f"| {name} ({what}) | {where} | {per_chip} | "
            f"{'fits' if report['fits'] else 'does not fit'} | "
            f"{result['seconds'] / 60:.1f} min |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip_xxl", action="store_true",
                        help="leave out t5_1_1_xxl unrolled (the longest compile)")
    parser.add_argument("--only", help="only the rows of this config")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny models on 4-chip slices: a check that the script runs")
    args = parser.parse_args(argv)
    from t5x_like.planner import aot_planner
    aot_planner.prepare_compiler_environment()  # this machine is no TPU VM
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    print(f"measured at commit {commit or 'unknown'}\n")
    print("| config | topology | per chip | verdict | compile |\n| --- | --- | --- | --- | --- |")
    for config_name, topology, num_slices, overrides, what in ROWS:
        if (args.skip_xxl and config_name == "t5_1_1_xxl") or args.only not in (None,
                                                                                config_name):
            continue
        if args.smoke:
            if (config_name, num_slices) not in SMOKE_ROWS:
                continue
            topology, sizes = SMOKE_ROWS[(config_name, num_slices)]
            overrides = overrides + sizes
        result = plan_row(config_name, topology, num_slices, overrides, args.smoke)
        print(format_row(config_name, topology, num_slices, what, result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
