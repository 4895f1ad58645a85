"""``python -m launch TARGET ...`` (also ``t5xl launch``): start t5x_like.train on a cluster.

    python -m launch tpu create --name=t5 --zone=us-west4-a --accelerator_type=v5litepod-16 --spot
    python -m launch tpu setup  --name=t5 --zone=us-west4-a --accelerator_type=v5litepod-16
    python -m launch tpu run    --name=t5 --zone=us-west4-a --accelerator_type=v5litepod-16 \\
        --config=configs/t5_1_1_base.py --workdir=gs://BUCKET/runs/t5 -- --config.batch_size=256
    python -m launch tpu status|logs|stop|delete --name=t5 --zone=us-west4-a ...
    python -m launch gke run --cluster=C --workload=t5 --tpu_type=v5p-64 --num_slices=2 ...
    python -m launch slurm --nodes=2 --gpus_per_node=8 --config=... --workdir=...

Every step takes --dry_run: print the exact commands, shell-quoted, and run nothing.
Exit status: 0 done; 1 the cloud or a worker failed (the message names which); 2 a
flag is wrong or the step was refused (e.g. a run is already live).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from launch import gke, slurm, tpu_vm, training
from launch.commands import LaunchFailed
from t5x_like import errors


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m launch", description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog="Details: docs/launching.md. Each target has --help, e.g. "
               "python -m launch tpu run --help.")
    targets = parser.add_subparsers(dest="target", required=True, metavar="TARGET")
    tpu_vm.register(targets)
    gke.register(targets)
    slurm.register(targets)
    return parser


@errors.command_line("launch")
def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    launcher_args, train_args = training.split_train_args(argv)
    args = build_parser().parse_args(launcher_args)
    try:
        return args.func(args, train_args)
    except LaunchFailed as e:
        print(f"launch: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
