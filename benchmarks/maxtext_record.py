"""MaxText's published training record, planned here: each row's model, chips, batch,
sequence, mesh and remat compiled through libtpu (``python -m t5x_like.plan``), our
predicted MFU (``planner/step_time.py``) beside the MFU MaxText measured.

    .venv/bin/python benchmarks/maxtext_record.py [--rows 1,3,5] [--out DIR] [--smoke]

The rows are MaxText's ``docs/reference/models/tiering.md``; each row's run settings are
those of the recipe it links (AI-Hypercomputer/maxtext ``benchmarks/
maxtext_*_model_configs.py`` and ``src/maxtext/configs/tpu/``, AI-Hypercomputer/
tpu-recipes; read for this table, commits in docs/planning.md). Where a setting has no
counterpart here it is named in the row's ``ours`` column:

- MaxText's custom remat policies offload the layer's input and some projections to host
  memory; ours offload the layer's input (``offload``) or save nothing (``full``);
- splash attention's block sizes, libtpu's VMEM limit and SparseCore offload flags are
  MaxText's per-row tuning; ours are the defaults (with its collective flags,
  ``system/platforms.TPU_COMPILER_FLAGS``);
- MFU counts attention as MaxText's published logs did (before its July 2025 change):
  every position pair, causal or not (``engine/flops.py`` counts the same way).

Each plan runs in its own process (libtpu reads its environment when it loads) and its
JSON report is kept in ``--out``, so a row is compiled once; a row whose JSON is there
is read again. ``--smoke``: one tiny decoder on v6e:2x2, the same path.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
OPEN = "configs/open_decoders.py"


@dataclasses.dataclass(frozen=True)
class Row:
    chip: str
    chips: int
    model: str
    seq: int
    mfu: float           # MaxText's, measured
    tokens_per_chip: int  # MaxText's, measured
    topology: str
    config: str
    overrides: tuple[str, ...]
    ours: str            # how our run differs from MaxText's, in a few words
    num_slices: int = 1


def _llama2_70b() -> tuple[str, ...]:
    """Llama 2 70B from the Llama 3.1 70B preset: its 32,000-token vocabulary and plain
    RoPE (base 10,000)."""
    return ("--config.model.vocab_size=32000", "--config.model.bos_id=1",
            "--config.model.positions.rope.max_wavelength=10000.0",
            "--config.model.positions.rope.scaling=default",
            "--config.model.positions.max_length=4096")


def _chunked(chunks: int = 16) -> tuple[str, ...]:
    """The output layer and loss over ``chunks`` slices of the positions (``loss.logit_chunks``):
    what keeps a 128k vocabulary's float32 logits from filling the chip."""
    return (f"--config.loss.logit_chunks={chunks}",)


def _run(batch: int, seq: int, remat: str, **mesh: int) -> tuple[str, ...]:
    axes = dict(data=1, fsdp=-1, **mesh)
    return (f"--config.batch_size={batch}", f"--config.task_feature_lengths.targets={seq}",
            f"--config.model.numerics.remat_policy={remat}",
            *(f"--config.mesh.{axis}={size}" for axis, size in axes.items()))


ROWS = {
    1: Row("v5p", 256, "Llama 2 70B", 4096, 65.4, 692, "v5p:8x8x4",
           f"{OPEN}:llama-3.1-70b", _llama2_70b() + _run(1024, 4096, "full"),
           "remat full (MaxText: every matmul output saved but the MLP's input projection; "
           "our dots, saving all, needs 219 GiB a chip)"),
    2: Row("v5p", 128, "Mixtral 8x7B", 4096, 52.56, 2909, "v5p:4x4x8",
           "configs/mixtral_8x7b.py",
           _run(4608, 4096, "offload") + _chunked(),
           "capacity 1.25 dispatch (MaxText: dropless megablox; our dropless dispatch "
           "needs 4,110 GiB a chip at 147k tokens a chip); remat offload: layer input to "
           "host and float32 params (MaxText: remat full, bfloat16 params); logits in 16 "
           "slices"),
    3: Row("v6e", 256, "Llama 3.1 8B", 8192, 45.46, 7207, "v6e:16x16",
           f"{OPEN}:llama-3.1-8b", _run(1024, 8192, "offload"),
           "remat offload: layer input to host (MaxText: q/k/v/out projections too)"),
    4: Row("v6e", 256, "Llama 3.1 70B", 8192, 50.33, 960, "v6e:16x16",
           f"{OPEN}:llama-3.1-70b", _run(1280, 8192, "offload") + _chunked(),
           "remat offload: layer input to host (MaxText: q/k/v projections too); logits in 16 "
           "slices"),
    5: Row("v6e", 256, "Llama 2 70B", 4096, 43.8, 900, "v6e:16x16",
           f"{OPEN}:llama-3.1-70b", _llama2_70b() + _run(512, 4096, "full"),
           "remat full (MaxText: q/k/v projections to host)"),
    6: Row("v6e", 512, "Llama 3.1 405B", 8192, 38.55, 123, "v6e:16x16",
           f"{OPEN}:llama-3.1-405b",
           _run(512, 8192, "offload") + ("--config.mesh.dcn=2",
                                          "--config.partitioning.fsdp_over_dcn=true") + _chunked(),
           "FSDP over all 512, as MaxText's current recipe; remat offload: layer input to "
           "host, as MaxText's; logits in 16 slices",
           num_slices=2),
    7: Row("v6e", 256, "Mixtral 8x7B", 4096, 35.23, 3899, "v6e:16x16",
           "configs/mixtral_8x7b.py", _run(2048, 4096, "offload") + _chunked(),
           "capacity 1.25 as MaxText's dropping run; remat offload: layer input to host "
           "(MaxText: remat full); logits in 16 slices"),
    8: Row("v6e", 256, "Mixtral 8x22B", 4096, 36.2, 1326, "v6e:16x16",
           "configs/mixtral_8x7b.py",
           ("--config.model.d_model=6144", "--config.model.num_heads=48",
            "--config.model.d_ff=16384", "--config.model.num_layers=56",
            "--config.model.vocab_size=32768")
           + _run(2048, 4096, "offload", expert=4) + _chunked()
           + ("--config.partitioning.split_physical_axes=true",
              "--config.optimizer.microbatches=2"),
           "fsdp 64 x expert 4 on a split torus, as MaxText's; 2 microbatches and float32 "
           "params (MaxText: 1, bfloat16 params); remat offload: layer input to host "
           "(MaxText: projections too); logits in 16 slices"),
}
SMOKE = Row("v6e", 4, "tiny decoder", 256, float("nan"), 0, "v6e:2x2", f"{OPEN}:qwen3-0.6b",
            ("--config.model.num_layers=2", "--config.model.d_model=256",
             "--config.model.num_heads=2", "--config.model.head_dim=128",
             "--config.model.attention.num_kv_heads=1", "--config.model.d_ff=512",
             "--config.model.vocab_size=1024") + _run(8, 256, "full"), "tiny")


def planned(key: str, row: Row, out: pathlib.Path) -> dict:
    """The row's plan report (``plan --json``), compiled unless ``out`` holds it."""
    path = out / f"{key}.json"
    if not path.is_file():
        done = subprocess.run(
            [sys.executable, "-m", "t5x_like.plan", f"--config={row.config}",
             f"--topology={row.topology}", f"--num_slices={row.num_slices}", "--json",
             *row.overrides], cwd=REPO, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"row {key}: plan failed:\n{done.stderr[-2000:]}")
        path.write_text(done.stdout)
    return json.loads(path.read_text())


def line(key: str, row: Row, report: dict) -> str:
    predicted = report.get("predicted")
    tokens = row.seq * report["batch_size"]
    if predicted and report.get("fits", True):
        ours = f"{100 * predicted['mfu']:.1f}%"
        per_chip = f"{tokens / predicted['step_s'] / report['num_devices']:,.0f}"
        gap = f"{100 * (predicted['mfu'] * 100 / row.mfu - 1):+.0f}%" if row.mfu == row.mfu else "-"
        where = (f"matmul {predicted['compute_s']:.2f} s at {100 * predicted['fill']:.0f}% fill, "
                 f"HBM {predicted['memory_s']:.2f} s, collectives waited "
                 f"{predicted['exposed_collective_s']:.2f} s")
    else:
        memory = report["memory_per_device"]["total"] / 2**30
        ours, per_chip, gap = "does not fit", "-", "-"
        where = f"{memory:.1f} GiB of {report['hbm_per_device'] / 2**30:.0f} per chip" + (
            f" (compiled all the same: {100 * predicted['mfu']:.1f}% predicted)" if predicted
            else "")
    bound = report.get("roofline", {}).get("mfu")
    bound = f"{100 * bound:.1f}%" if bound else "-"
    measured = f"{row.mfu:.2f}%" if row.mfu == row.mfu else "-"
    return (f"| {key} | {row.chip} x {row.chips} | {row.model} | {row.seq} | "
            f"{report['batch_size']} | {measured} | {row.tokens_per_chip:,} | {ours} | "
            f"{per_chip} | {gap} | {bound} | {where} | {row.ours} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--out", default="runs/maxtext_record")
    parser.add_argument("--smoke", action="store_true", help="one tiny decoder on v6e:2x2")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = ({"smoke": SMOKE} if args.smoke
            else {str(k): ROWS[int(k)] for k in args.rows.split(",")})
    print("| row | chips | model | seq | batch | MaxText MFU | MaxText tokens/s/chip | "
          "our predicted MFU | predicted tokens/s/chip | ours vs MaxText | our roofline "
          "bound | where our step goes | how our run differs |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for key, row in rows.items():
        print(line(key, row, planned(key, row, out)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
