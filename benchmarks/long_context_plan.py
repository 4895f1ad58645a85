"""Long sequences on TPU topologies, planned ahead of time: per-device memory and the
roofline step time with the plain attention path against the fused or chunked one.

    python benchmarks/long_context_plan.py                  # both tables
    python benchmarks/long_context_plan.py --only=decoder   # decoder_modern_1b at 8k/32k
    python benchmarks/long_context_plan.py --only=longformer
    python benchmarks/long_context_plan.py --remat_rows     # only the rows with remat="full"
    python benchmarks/long_context_plan.py --smoke          # tiny: a check that it runs

Each row compiles the real train step with ``t5x_like.plan`` (libtpu's compiler via
``jax.experimental.topologies``; no TPU needed, ``pip install -c constraints.txt -e ".[tpu]"``).
decoder_modern_1b runs in bfloat16 with parameters and optimizer state sharded over
every chip (fsdp), one sequence per chip; ``flash`` is the Pallas splash kernel.
Longformer base (window 512, CLS global) runs one sequence per chip on v5e:4x4;
``chunked`` computes the window in blocks. Temporaries over the chip's HBM are what
the compiler reported when it refused the program.

``--smoke``: the decoder table's flash row (the splash kernel) with a 1-layer, 32-wide
model of the same config, 256 tokens, on 4 chips (v5p:2x2x1), a check that the script
runs; the Longformer table's chunked row (v5e:2x2) is built and its config checked
(``config_lib.validate``), not compiled: libtpu's compile of even a tiny model takes
20-30 s on 2 busy cores, and the plain ``xla`` rows compile the attention every other plan
compiles. ``--remat_rows`` keeps the rows with remat, one per path.
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


def decoder_rows(smoke: bool = False):
    topologies, lengths = (((("v5p:2x2x1", 4),), (256,)) if smoke else
                           ((("v5p:2x2x1", 4), ("v5e:4x4", 16)), (8192, 32768)))
    for topology, chips in topologies:
        for length in lengths:
            for impl, remat in (("xla", None), ("flash", None), ("flash", "full")):
                if remat and length < lengths[-1]:
                    continue
                overrides = [f"task_feature_lengths.targets={length}",
                             f"model.positions.max_length={length}", f"batch_size={chips}",
                             "mesh.data=1", "mesh.fsdp=-1", "model.numerics.dtype=bfloat16",
                             f"model.attention.impl={impl}"]
                yield "configs/decoder_modern_1b.py", topology, length, impl, remat, overrides


def longformer_rows(smoke: bool = False):
    topology, batch, lengths = ("v5e:2x2", 4, (256,)) if smoke else ("v5e:4x4", 16,
                                                                      (4096, 8192, 16384))
    for length in lengths:
        for impl, remat in (("xla", None), ("chunked", None), ("chunked", "full")):
            overrides = [f"task_feature_lengths.inputs={length}",
                         f"model.positions.max_length={length + 2}", f"batch_size={batch}",
                         "model.numerics.dtype=bfloat16", "model.numerics.scan_layers=True",
                         f"model.attention.impl={impl}"]
            yield "configs/longformer_base.py", topology, length, impl, remat, overrides


def row_config(config_path: str, overrides: list[str], remat, smoke: bool = False):
    """A row's config (``smoke``: its tiny model), checked."""
    config = config_lib.load_config_file(str(ROOT / config_path))
    if smoke:
        import _smoke
        _smoke.tiny_model(config.model)
    config_lib.apply_overrides(config, overrides + ([f"model.numerics.remat_policy={remat}"]
                                                    if remat else []))
    config_lib.validate(config)
    return config


def run(rows, smoke: bool = False) -> list[dict]:
    results = []
    for config_path, topology, length, impl, remat, overrides in rows:
        config = row_config(config_path, overrides, remat, smoke)
        report = aot_planner.plan(config, topology)
        memory = report["memory_per_device"]
        roofline = report.get("roofline") or {}
        results.append({
            "config": pathlib.Path(config_path).stem, "topology": topology, "length": length,
            "attention": impl, "remat": remat or config.model.numerics.remat_policy,
            "temporaries_gib": memory["temporaries"] / GiB,
            "total_gib": memory["total"] / GiB, "hbm_gib": (report["hbm_per_device"] or 0) / GiB,
            "fits": report["fits"], "step_s": roofline.get("step_s"),
            "bound": roofline.get("bound"), "mfu": roofline.get("mfu")})
        print(_row(results[-1]), flush=True)
    return results


HEADER = ("| config | topology | tokens | attention | remat | temporaries GiB | total GiB / HBM | fits "
          "| roofline step s | bound | MFU at best |\n|---|---|---|---|---|---|---|---|---|---|---|")


def _row(r: dict) -> str:
    step = "—" if r["step_s"] is None else f"{r['step_s']:.3f}"
    mfu = "—" if r["mfu"] is None else f"{r['mfu']:.1%}"
    return (f"| {r['config']} | {r['topology']} | {r['length']:,} | {r['attention']} | {r['remat']} "
            f"| {r['temporaries_gib']:.2f} | {r['total_gib']:.2f} / {r['hbm_gib']:.0f} "
            f"| {'yes' if r['fits'] else 'no'} | {step} | {r['bound'] or '—'} | {mfu} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("decoder", "longformer"))
    parser.add_argument("--remat_rows", action="store_true",
                        help="only the rows that add remat to the fused/chunked path")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny models on 4 chips: a check that the script runs")
    args = parser.parse_args(argv)
    aot_planner.prepare_compiler_environment()  # this machine is no TPU VM
    print(HEADER)
    keep = (lambda row: row[4] is not None) if args.remat_rows else (lambda row: True)
    if args.smoke and not args.remat_rows:  # each table's fused or chunked row
        keep = lambda row: row[4] is None and row[3] != "xla"  # noqa: E731
    if args.only in (None, "decoder"):
        run(filter(keep, decoder_rows(args.smoke)), args.smoke)
    if args.only in (None, "longformer"):
        longformer = filter(keep, longformer_rows(args.smoke))
        if args.smoke and args.only is None:  # built and checked, not compiled (docstring)
            for config_path, _, _, _, remat, overrides in longformer:
                row_config(config_path, overrides, remat, smoke=True)
            print("longformer_base: the chunked row's config checked, not planned (--smoke)")
        else:
            run(longformer, args.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
