"""Loss and accuracy curves of a run, as a PNG, from its ``metrics.jsonl``.

    python -m t5x_like.plot --workdir=/tmp/t5x_like_quickstart [--out=curves.png]

Needs matplotlib (``pip install -c constraints.txt -e ".[plot]"``); TensorBoard reads the same
run interactively (``tensorboard --logdir WORKDIR/tensorboard``).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

from t5x_like import errors
from t5x_like.errors import UserError

# Imports inside functions: matplotlib (the `plots` extra) loads only when a figure is drawn.

PANELS = (("loss", ("loss", "eval_loss"), "nats per target token"),
          ("accuracy", ("accuracy", "eval_accuracy"), "target-token accuracy"))


class PlotError(UserError):
    """A missing input or dependency, with the fix in the message."""


def read_metrics(workdir: str | pathlib.Path) -> list[dict]:
    path = pathlib.Path(workdir) / "metrics.jsonl"
    if not path.is_file():
        raise PlotError(f"{path} does not exist; pass the --workdir of a training run "
                        "(python -m t5x_like.train --workdir=...).")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not records:
        raise PlotError(f"{path} is empty; train for at least log_every_steps steps first.")
    return records


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``key``, last record per step wins (a resumed run rewrites steps)."""
    by_step = {r["step"]: r[key] for r in records
               if key in r and isinstance(r[key], (int, float)) and math.isfinite(r[key])}
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def render(records: list[dict], out: str | pathlib.Path, title: str = "") -> pathlib.Path:
    try:
        import matplotlib
    except ImportError:
        raise PlotError("python -m t5x_like.plot needs matplotlib: "
                        f"{errors.install_hint('plot')}") from None
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(PANELS), figsize=(11, 4))
    for axis, (name, keys, ylabel) in zip(axes, PANELS, strict=False):
        for key in keys:
            steps, values = series(records, key)
            if steps:
                axis.plot(steps, values, marker="o" if key.startswith("eval") else None,
                          markersize=3, label="held-out" if key.startswith("eval") else "train")
        axis.set_title(name)
        axis.set_xlabel("step")
        axis.set_ylabel(ylabel)
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend()
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    out = pathlib.Path(out)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out


@errors.command_line("plot")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m t5x_like.plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="A training run's --workdir.")
    parser.add_argument("--out", help="PNG path (default: WORKDIR/curves.png).")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    out = args.out or str(pathlib.Path(args.workdir) / "curves.png")
    path = render(read_metrics(args.workdir), out, title=str(args.workdir))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
