"""SLURM GPU clusters: a batch script with one training process per GPU, submitted with
sbatch.

The processes join through JAX's SLURM detection: with no coordinator flags and no
``T5X_LIKE_*`` variables, ``t5x_like.train`` calls ``jax.distributed.initialize()``
without arguments, and JAX reads ``SLURM_NTASKS``, ``SLURM_PROCID``, ``SLURM_LOCALID``
and the first host of ``SLURM_STEP_NODELIST`` (the coordinator). Those exist only
inside an ``srun`` step, hence srun in the script, and JAX gives each process the GPU
numbered ``SLURM_LOCALID``, hence one task per GPU and no GPU binding.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shlex
import string

from launch import training
from launch.commands import LaunchFailed, Runner, command
from t5x_like.errors import UserError

TEMPLATE = string.Template("""\
#!/bin/bash
#SBATCH --job-name=$job_name
#SBATCH --nodes=$nodes
#SBATCH --ntasks-per-node=$gpus_per_node
#SBATCH --gpus-per-node=$gpus_per_node
#SBATCH --output=$job_name-%j.out
$optional_directives\
# One process per GPU; JAX's SLURM detection joins them (see launch/slurm.py).
# Submitted from the repository root, whose .venv has the project and the gpu extra.
set -euo pipefail
cd "$$SLURM_SUBMIT_DIR"
srun --kill-on-bad-exit=1 $train_command
""")

HEREDOC_END = "T5X_LIKE_SBATCH"


def batch_script(args, train_args: list[str]) -> str:
    if args.nodes < 1 or args.gpus_per_node < 1:
        raise UserError(f"--nodes={args.nodes} and --gpus_per_node={args.gpus_per_node} must "
                        "be at least 1.")
    run = training.train_run(args.config, args.workdir, train_args, args.env, multislice=False)
    optional = "".join(f"#SBATCH --{flag}={value}\n" for flag, value in (
        ("partition", args.partition), ("account", args.account), ("time", args.time)) if value)
    return TEMPLATE.substitute(
        job_name=args.job_name, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
        optional_directives=optional,
        train_command=shlex.join(["env", *run.env_assignments(), *run.argv(args.python)]))


def main(args, train_args: list[str], out=None) -> int:
    runner = Runner(args.dry_run, out=out)
    script = batch_script(args, train_args)
    path = args.script or f"{args.job_name}.sbatch"
    submit = command("sbatch", path)
    note = training.shared_workdir_note(args.workdir, args.nodes)
    if runner.dry_run:
        if note:
            runner.say(note)
        runner.say("from the repository root: write the batch script, then submit it")
        print(f"cat > {shlex.quote(path)} <<'{HEREDOC_END}'\n{script}{HEREDOC_END}", file=runner.out)
        runner.show([submit])
        return 0
    if note:
        runner.say(note)
    if pathlib.Path.cwd().resolve() != training.REPO_ROOT:
        raise UserError(f"Run this from the repository root ({training.REPO_ROOT.name}/): the "
                        "job starts where it is submitted, and needs .venv and configs/ there.")
    pathlib.Path(path).write_text(script)
    runner.say(f"wrote {path}")
    if runner.run_attached(submit):
        raise LaunchFailed(f"sbatch did not accept {path}; its message is above.")
    runner.say(f"output: {args.job_name}-JOBID.out (squeue --me shows the job)")
    return 0


def _job_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][-A-Za-z0-9_.]*", value):
        raise argparse.ArgumentTypeError(f"{value!r}: use letters, digits, '-', '_' and '.'")
    return value


def register(subparsers) -> None:
    slurm = subparsers.add_parser(
        "slurm", help="SLURM GPU clusters: write a batch script and sbatch it",
        description="Write a SLURM batch script (one t5x_like.train per GPU, joined by JAX's "
                    "SLURM detection) and submit it with sbatch.", fromfile_prefix_chars="@",
        epilog="Flags after `--` go to t5x_like.train, e.g. -- --config.batch_size=256")
    slurm.add_argument("--nodes", type=int, required=True)
    slurm.add_argument("--gpus_per_node", type=int, default=8)
    slurm.add_argument("--config", required=True, help="Config path in the repository.")
    slurm.add_argument("--workdir", required=True, help="Run folder every node can reach.")
    slurm.add_argument("--job_name", type=_job_name, default="t5x_like")
    slurm.add_argument("--partition")
    slurm.add_argument("--account")
    slurm.add_argument("--time", help="Time limit, e.g. 24:00:00.")
    slurm.add_argument("--python", default=".venv/bin/python",
                       help="Interpreter with the project and the gpu extra (%(default)s).")
    slurm.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                       help="Environment variable for the training processes (repeatable).")
    slurm.add_argument("--script", help="Where to write the batch script (JOB_NAME.sbatch).")
    slurm.add_argument("--dry_run", action="store_true",
                       help="Print the script and the sbatch command; write and run nothing.")
    slurm.set_defaults(func=main)
