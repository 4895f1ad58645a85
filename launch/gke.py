"""GKE through xpk: one ``xpk workload create`` per run, single slice or multislice.

xpk turns the workload into a JobSet with one pod per TPU VM and, for ``--num-slices``
> 1, sets the Megascale variables that join the slices; JAX finds its peers from the
pod's TPU environment, so the command is the same ``t5x_like.train`` as on TPU VMs.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shlex

from launch import accelerators, training
from launch.commands import Command, LaunchFailed, Runner, command
from t5x_like.errors import UserError

DEFAULT_BASE_IMAGE = "python:3.11"   # the project needs Python 3.11+; xpk's default is older
PRIORITIES = ["very-low", "low", "medium", "high", "very-high"]


def _where(args) -> list[str]:
    return [f"--cluster={args.cluster}",
            *([f"--project={args.project}"] if args.project else []),
            *([f"--zone={args.zone}"] if args.zone else [])]


def _slice_type(tpu_type: str) -> accelerators.SliceType:
    """Checks the spelling; generations this launcher does not know pass through to xpk."""
    known = tpu_type.split("-")[0] in accelerators.GENERATIONS
    return accelerators.parse(tpu_type, hosts_override=None if known else 1)


def workload_command(args, train_args: list[str]) -> Command:
    slice_type = _slice_type(args.tpu_type)
    if args.num_slices < 1:
        raise UserError(f"--num_slices={args.num_slices} must be at least 1.")
    run = training.train_run(args.config, args.workdir, train_args, args.env,
                             multislice=args.num_slices > 1)
    train = shlex.join(run.argv("python3"))
    if args.docker_image:
        image = [f"--docker-image={args.docker_image}"]
        in_container = train
    else:
        # xpk copies the current folder (the repository) into the base image; install
        # it there with the same pins as everywhere else, then train.
        image = [f"--base-docker-image={args.base_docker_image}"]
        in_container = ('python3 -m pip install --quiet -c constraints.txt -e ".[tpu]" && '
                        + train)
    return command(
        "xpk", "workload", "create", f"--workload={args.workload}", *_where(args),
        f"--tpu-type={slice_type.name}", f"--num-slices={args.num_slices}", *image,
        *[f"--env={assignment}" for assignment in run.env_assignments()],
        f"--max-restarts={args.max_restarts}", f"--priority={args.priority}",
        f"--command={in_container}")


def do_run(args, runner: Runner, train_args: list[str]) -> int:
    create = workload_command(args, train_args)
    hosts = _slice_type(args.tpu_type).hosts * args.num_slices
    note = training.shared_workdir_note(args.workdir, hosts)
    if runner.dry_run:
        if note:
            runner.say(note)
        runner.say(f"the image {args.docker_image} must hold this project installed with the "
                   "tpu extra, in its working directory" if args.docker_image else
                   "run from the repository root: xpk builds the image from the current folder")
        runner.show([create])
        return 0
    if note:
        runner.say(note)
    if not args.docker_image and pathlib.Path.cwd().resolve() != training.REPO_ROOT:
        raise UserError("Run this from the repository root: xpk copies the current folder into "
                        "the image (or pass --docker_image with the project installed).")
    if runner.run_attached(create):
        raise LaunchFailed(f"xpk did not create workload {args.workload}; its message is above.")
    return 0


def do_status(args, runner: Runner, train_args) -> int:
    listing = command("xpk", "workload", "list", *_where(args), f"--filter-by-job={args.workload}")
    if runner.dry_run:
        runner.show([listing])
        return 0
    return runner.run_attached(listing)


def do_delete(args, runner: Runner, train_args) -> int:
    delete = command("xpk", "workload", "delete", f"--workload={args.workload}", *_where(args))
    if runner.dry_run:
        runner.show([delete])
        return 0
    if runner.run_attached(delete):
        raise LaunchFailed(f"xpk did not delete workload {args.workload}; its message is above.")
    return 0


STEPS = {
    "run": (do_run, "xpk workload create: t5x_like.train on every TPU VM of the slice(s)"),
    "status": (do_status, "xpk workload list for this workload"),
    "delete": (do_delete, "xpk workload delete"),
}


def _workload_name(value: str) -> str:
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", value):
        raise argparse.ArgumentTypeError(
            f"{value!r}: up to 40 lowercase letters, digits and '-', starting with a letter "
            "(xpk's rule)")
    return value


def register(subparsers) -> None:
    gke = subparsers.add_parser("gke", help="GKE TPU clusters through xpk",
                                description="GKE TPU clusters through xpk (the cluster exists: "
                                "xpk cluster create).", fromfile_prefix_chars="@")
    steps = gke.add_subparsers(dest="step", required=True, metavar="STEP")
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--cluster", required=True, help="GKE cluster (made by xpk cluster create).")
    shared.add_argument("--workload", required=True, type=_workload_name, help="Workload name.")
    shared.add_argument("--project", help="Google Cloud project (default: gcloud's).")
    shared.add_argument("--zone", help="The cluster's zone (default: gcloud's).")
    shared.add_argument("--dry_run", action="store_true",
                        help="Print the exact command (shell-quoted) and run nothing.")
    parsers = {name: steps.add_parser(name, parents=[shared], help=help_text,
                                      description=help_text, fromfile_prefix_chars="@")
               for name, (_, help_text) in STEPS.items()}
    run = parsers["run"]
    run.add_argument("--tpu_type", required=True, help="e.g. v5litepod-16, v5p-64")
    run.add_argument("--num_slices", type=int, default=1, help="Slices (>1: multislice).")
    run.add_argument("--config", required=True, help="Config path in the repository.")
    run.add_argument("--workdir", required=True, help="Run folder, e.g. gs://BUCKET/runs/NAME.")
    run.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                     help="Environment variable for the training processes (repeatable).")
    image = run.add_mutually_exclusive_group()
    image.add_argument("--docker_image",
                       help="Image with the project installed; used as is (no build).")
    image.add_argument("--base_docker_image", default=DEFAULT_BASE_IMAGE,
                       help="Image xpk layers the repository onto (default %(default)s).")
    run.add_argument("--max_restarts", type=int, default=0,
                     help="JobSet restarts after a failure or preemption; each resumes from "
                     "the newest checkpoint.")
    run.add_argument("--priority", choices=PRIORITIES, default="medium")
    run.epilog = "Flags after `--` go to t5x_like.train, e.g. -- --config.batch_size=256"
    gke.set_defaults(func=main)


def main(args, train_args: list[str], out=None) -> int:
    if train_args and args.step != "run":
        raise UserError(f"`--` and what follows are for `run` only, not `{args.step}`.")
    step, _ = STEPS[args.step]
    return step(args, Runner(args.dry_run, out=out), train_args)
