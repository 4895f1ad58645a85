"""Cloud TPU VMs through queued resources: create, setup, run, status, logs, stop, delete.

On a TPU VM, JAX finds its peers itself (the trainer calls
``jax.distributed.initialize()`` with no arguments), and a multislice queued resource
(``--node_count`` > 1) sets the Megascale variables that join the slices over DCN, so
every worker runs the very same command.

Steps whose failure must name a worker (setup, the pre-run check, status) run one ssh
per worker (``--worker=I``), side by side; starting and stopping the run address every
worker at once (``--worker=all``; ``--node=all`` for multislice), as Cloud TPU's guides do.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
import sys
import time

from launch import accelerators, gitinfo, remote, training
from launch.commands import Command, LaunchFailed, Runner, command, report_failures
from t5x_like.errors import UserError

MEANINGS = {
    "CREATING": "request received",
    "ACCEPTED": "queued, waiting for capacity",
    "WAITING_FOR_RESOURCES": "queued, waiting for capacity",
    "PROVISIONING": "capacity found; the TPU VMs are being created",
    "ACTIVE": "the TPU VMs are up",
    "FAILED": "could not be provisioned",
    "SUSPENDING": "preempted or being deleted: its TPU VMs are going away",
    "SUSPENDED": "preempted (or deleted): its TPU VMs are gone",
    "DELETING": "being deleted",
}
GONE = ("SUSPENDING", "SUSPENDED", "DELETING")
CHECK_TIMEOUT_S = 180  # a worker that has not answered a one-line check by then is lost


@dataclasses.dataclass(frozen=True)
class Slices:
    """A queued resource and the TPU slices (nodes) it holds."""
    name: str
    zone: str
    project: str | None
    node_count: int
    slice_type: accelerators.SliceType | None

    @property
    def multislice(self) -> bool:
        return self.node_count > 1

    def nodes(self) -> list[str]:
        # Cloud TPU names multislice nodes PREFIX-0, PREFIX-1, ...; the prefix is our name.
        return [f"{self.name}-{i}" for i in range(self.node_count)] if self.multislice \
            else [self.name]

    def where(self) -> list[str]:
        return [*([f"--project={self.project}"] if self.project else []), f"--zone={self.zone}"]

    def hosts(self) -> int:
        return self.node_count * self.require_type().hosts

    def require_type(self) -> accelerators.SliceType:
        if self.slice_type is None:
            raise UserError("This step addresses every worker, so it needs the slice's type: "
                            "pass --accelerator_type (the one given to create, e.g. "
                            "--accelerator_type=v5litepod-16).")
        return self.slice_type

    def worker_label(self, node_index: int, worker: int) -> str:
        return f"slice {node_index} worker {worker}" if self.multislice else f"worker {worker}"

    def launcher_command(self, step: str) -> str:
        """This launcher's own command line for ``step``, for the hints in messages."""
        argv = ["python", "-m", "launch", "tpu", step, f"--name={self.name}", *self.where()]
        if self.node_count > 1:
            argv.append(f"--node_count={self.node_count}")
        if self.slice_type and step in ("setup", "run", "status"):
            argv.append(f"--accelerator_type={self.slice_type.name}")
        return shlex.join(argv)


# --- gcloud commands -------------------------------------------------------------------

def create_command(s: Slices, runtime_version: str, capacity: str | None) -> Command:
    placement = [f"--node-count={s.node_count}", f"--node-prefix={s.name}"] if s.multislice \
        else [f"--node-id={s.name}"]
    return command("gcloud", "compute", "tpus", "queued-resources", "create", s.name, *placement,
                   *s.where(), f"--accelerator-type={s.require_type().name}",
                   f"--runtime-version={runtime_version}",
                   *([f"--{capacity}"] if capacity else []))


def describe_command(s: Slices) -> Command:
    return command("gcloud", "compute", "tpus", "queued-resources", "describe", s.name,
                   *s.where(), "--format=json")


def delete_command(s: Slices) -> Command:
    # --force deletes the TPU VMs with the request.
    return command("gcloud", "compute", "tpus", "queued-resources", "delete", s.name,
                   *s.where(), "--force")


def ssh_each_worker(s: Slices, script: str) -> list[Command]:
    return [command("gcloud", "compute", "tpus", "tpu-vm", "ssh", node, *s.where(),
                    f"--worker={worker}", "--quiet", f"--command={script}",
                    label=s.worker_label(i, worker))
            for i, node in enumerate(s.nodes()) for worker in range(s.require_type().hosts)]


def ssh_one_worker(s: Slices, node_index: int, worker: int, script: str) -> Command:
    return command("gcloud", "compute", "tpus", "tpu-vm", "ssh", s.nodes()[node_index],
                   *s.where(), f"--worker={worker}", "--quiet", f"--command={script}",
                   label=s.worker_label(node_index, worker))


def ssh_all_workers(s: Slices, script: str) -> Command:
    if s.multislice:
        return command("gcloud", "compute", "tpus", "queued-resources", "ssh", s.name,
                       *s.where(), "--node=all", "--worker=all", "--quiet",
                       f"--command={script}", label="every worker of every slice")
    return command("gcloud", "compute", "tpus", "tpu-vm", "ssh", s.name, *s.where(),
                   "--worker=all", "--quiet", f"--command={script}", label="every worker")


# --- queued-resource state ---------------------------------------------------------------

def _first_message(value) -> str:
    if isinstance(value, dict):
        if isinstance(value.get("message"), str):
            return value["message"]
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            found = _first_message(item)
            if found:
                return found
    return ""


def read_state(runner: Runner, s: Slices) -> tuple[str, str]:
    """(state, the cloud's message about it if any)."""
    result = runner.capture(describe_command(s))
    if not result.ok:
        tail = " ".join(result.output_tail(5))
        raise LaunchFailed(f"Cannot describe queued resource {s.name} in {s.zone}: {tail}")
    try:
        state = json.loads(result.stdout).get("state") or {}
    except json.JSONDecodeError:
        raise LaunchFailed(f"gcloud's description of {s.name} is not JSON: "
                           f"{result.stdout[:200]!r}") from None
    return state.get("state", "UNKNOWN"), _first_message(state)


def _not_usable(s: Slices, state: str, detail: str) -> LaunchFailed:
    why = f" ({detail})" if detail else ""
    if state == "FAILED":
        return LaunchFailed(
            f"Queued resource {s.name} FAILED: {MEANINGS['FAILED']}{why}. It stays in the queue "
            f"until deleted: {s.launcher_command('delete')}; then create it again (another "
            "zone, --reserved, or a smaller --accelerator_type).")
    return LaunchFailed(
        f"Queued resource {s.name} is {state}: {MEANINGS.get(state, 'not usable')}{why}. The "
        "checkpoints in the workdir survive: delete it, then create, setup and run again with "
        f"the same --workdir to resume. Delete: {s.launcher_command('delete')}")


def require_active(runner: Runner, s: Slices) -> None:
    state, detail = read_state(runner, s)
    if state == "ACTIVE":
        return
    if state == "FAILED" or state in GONE:
        raise _not_usable(s, state, detail)
    raise LaunchFailed(f"Queued resource {s.name} is {state} ({MEANINGS.get(state, '?')}), not "
                       f"ACTIVE yet; wait for it: {s.launcher_command('status')}")


def wait_until_active(runner: Runner, s: Slices, poll_s: float, timeout_s: float | None) -> None:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last = None
    while True:
        state, detail = read_state(runner, s)
        if state != last:
            runner.say(f"{s.name}: {state} ({MEANINGS.get(state, '?')})")
            last = state
        if state == "ACTIVE":
            return
        if state == "FAILED" or state in GONE:
            raise _not_usable(s, state, detail)
        if deadline is not None and time.monotonic() >= deadline:
            raise LaunchFailed(f"Queued resource {s.name} is still {state} after {timeout_s:g} s. "
                               f"The request stays queued: check it with "
                               f"{s.launcher_command('status')}, or delete it.")
        time.sleep(poll_s)


# --- steps -------------------------------------------------------------------------------

def do_create(args, runner: Runner, s: Slices) -> int:
    slice_type = s.require_type()
    runtime_version = args.runtime_version or slice_type.default_runtime_version
    if not runtime_version:
        raise UserError(f"No default TPU VM image for {slice_type.name}; pass --runtime_version.")
    capacity = "spot" if args.spot else "reserved" if args.reserved else None
    create = create_command(s, runtime_version, capacity)
    if runner.dry_run:
        runner.say(f"request {s.node_count} x {slice_type.name} ({s.hosts()} TPU VMs)"
                   + ("" if args.no_wait else ", then poll until ACTIVE (FAILED or SUSPENDED "
                      "exits 1)"))
        runner.show([create] + ([] if args.no_wait else [describe_command(s)]))
        return 0
    if runner.run_attached(create):
        raise LaunchFailed(f"gcloud did not create queued resource {s.name}; its message is above.")
    if args.no_wait:
        runner.say(f"requested; follow it with {s.launcher_command('status')}")
        return 0
    try:
        wait_until_active(runner, s, args.poll_s, args.timeout_s)
    except KeyboardInterrupt:
        runner.say(f"stopped waiting; the request stays queued ({s.launcher_command('status')})")
        return 130
    runner.say(f"ready. Next: {s.launcher_command('setup')}")
    return 0


def do_setup(args, runner: Runner, s: Slices) -> int:
    commit = gitinfo.launched_commit(args.commit)
    repo = gitinfo.launched_repo(args.repo)
    if not re.fullmatch(r"[0-9a-fA-F]{7,40}", commit):
        raise UserError(f"--commit={commit}: pass a commit hash (git rev-parse HEAD), so every "
                        "worker installs exactly the same code.")
    installs = ssh_each_worker(s, remote.setup(repo, commit, args.python))
    if runner.dry_run:
        runner.say("the queued resource must be ACTIVE")
        runner.show([describe_command(s)])
        runner.say(f"on each of the {len(installs)} workers, side by side: check out {commit} of "
                   f"{repo} and install it with constraints.txt and the tpu extra")
        runner.show(installs)
        return 0
    require_active(runner, s)
    runner.say(f"installing {commit[:12]} on {len(installs)} workers")
    report_failures(runner.capture_all(installs), "setup",
                    advice="Setup is idempotent: fix the cause and run setup again.")
    runner.say(f"ready on all {len(installs)} workers. Next: {s.launcher_command('run')} "
               "--config=configs/NAME.py --workdir=gs://BUCKET/PATH")
    return 0


def do_run(args, runner: Runner, s: Slices, train_args: list[str]) -> int:
    run = training.train_run(args.config, args.workdir, train_args, args.env, s.multislice)
    note = training.shared_workdir_note(run.workdir, s.hosts())
    checks = ssh_each_worker(s, remote.check())
    start = ssh_all_workers(s, remote.start(run.env_assignments(),
                                            run.argv(".venv/bin/python")))
    if runner.dry_run:
        if note:
            runner.say(note)
        runner.say("the queued resource must be ACTIVE")
        runner.show([describe_command(s)])
        runner.say("every worker must answer, be set up, and have no live run")
        runner.show(checks)
        runner.say(f"start the same command on all {len(checks)} workers, detached; each logs to "
                   f"~/{remote.LOG_DIR}/train.log")
        runner.show([start])
        return 0
    if note:
        runner.say(note)
    require_active(runner, s)
    results = runner.capture_all(checks, CHECK_TIMEOUT_S)
    report_failures(results, "checking the workers", show_ok=False,
                    advice="Nothing was started: every worker must be reachable, since the "
                    "others would wait for a missing one forever.")
    states = [(r.command.label, remote.parse_check(r.stdout)) for r in results]
    live = [f"{label} (pid {state.live_pid})" for label, state in states if state.live_pid]
    if live:
        raise UserError(f"Refused: a run is already live on {', '.join(live)}. Stop it first "
                        f"({s.launcher_command('stop')}) or let it finish "
                        f"({s.launcher_command('status')}).")
    not_ready = [label for label, state in states if not state.ready]
    if not_ready:
        raise UserError(f"Refused: t5x_like is not installed on {', '.join(not_ready)}; run "
                        f"setup first: {s.launcher_command('setup')}")
    started = runner.capture(start)
    sys.stderr.write(started.stdout + started.stderr)
    if not started.ok:
        raise LaunchFailed(f"Starting the run failed (gcloud exit {started.returncode}); some "
                           f"workers may have started. See {s.launcher_command('status')}, and "
                           f"{s.launcher_command('stop')} before running again.")
    runner.say(f"started on {len(checks)} workers. Follow worker 0: "
               f"{s.launcher_command('logs')} --follow")
    return 0


def do_status(args, runner: Runner, s: Slices) -> int:
    checks = ssh_each_worker(s, remote.check()) if s.slice_type else []
    if runner.dry_run:
        runner.show([describe_command(s)])
        if checks:
            runner.say("if ACTIVE: is the run live on each worker")
            runner.show(checks)
        return 0
    state, detail = read_state(runner, s)
    print(f"queued resource {s.name}: {state} ({MEANINGS.get(state, '?')})")
    if detail:
        print(f"  {detail}")
    if state == "FAILED" or state in GONE:
        raise _not_usable(s, state, detail)
    if state != "ACTIVE" or not checks:
        return 0
    results = runner.capture_all(checks, CHECK_TIMEOUT_S)
    live, idle, unreachable = [], [], []
    for r in results:
        state = remote.parse_check(r.stdout)
        last = f" | {state.last_log_line}" if state.last_log_line else ""
        if not r.ok:
            unreachable.append(r.command.label)
            print(f"{r.command.label}: unreachable ({' '.join(r.output_tail(2))})")
        elif state.live_pid:
            live.append(r.command.label)
            print(f"{r.command.label}: training (pid {state.live_pid}){last}")
        else:
            idle.append(r.command.label)
            print(f"{r.command.label}: no live run"
                  + ("" if state.ready else " (not set up)") + last)
    if unreachable:
        raise LaunchFailed(f"Cannot reach {', '.join(unreachable)}.")
    if live and idle:
        raise LaunchFailed(
            f"The run is incomplete: no live process on {', '.join(idle)} while "
            f"{len(live)} workers still train (they will wait for the missing ones). Read the "
            f"log ({s.launcher_command('logs')} --worker=N), stop the run, and run again: it "
            "resumes from the newest checkpoint.")
    return 0


def do_logs(args, runner: Runner, s: Slices) -> int:
    if not 0 <= args.slice < s.node_count:
        raise UserError(f"--slice={args.slice}: this queued resource has slices 0.."
                        f"{s.node_count - 1} (--node_count={s.node_count}).")
    hosts = s.slice_type.hosts if s.slice_type else None
    if args.worker < 0 or (hosts is not None and args.worker >= hosts):
        where = f"0..{hosts - 1} on {s.slice_type.name}" if hosts else "from 0"
        raise UserError(f"--worker={args.worker}: workers are numbered {where}.")
    tail = ssh_one_worker(s, args.slice, args.worker, remote.tail(args.lines, args.follow))
    if runner.dry_run:
        runner.show([tail])
        return 0
    return runner.run_attached(tail)


def do_stop(args, runner: Runner, s: Slices) -> int:
    stop = ssh_all_workers(s, remote.stop())
    if runner.dry_run:
        runner.say("SIGTERM to the run on every worker: it saves a checkpoint and exits")
        runner.show([stop])
        return 0
    if runner.run_attached(stop):
        raise LaunchFailed(f"Stopping failed on some worker (its message is above); see "
                           f"{s.launcher_command('status')}.")
    return 0


def do_delete(args, runner: Runner, s: Slices) -> int:
    delete = delete_command(s)
    if runner.dry_run:
        runner.say("delete the request and its TPU VMs (the workdir's checkpoints stay)")
        runner.show([delete])
        return 0
    if runner.run_attached(delete):
        raise LaunchFailed(f"gcloud did not delete {s.name}; its message is above.")
    return 0


STEPS = {
    "create": (do_create, "request the TPU slice(s) as a queued resource and wait until ACTIVE"),
    "setup": (do_setup, "install this project at the launched commit on every worker"),
    "run": (do_run, "start t5x_like.train on every worker, detached"),
    "status": (do_status, "the queued resource's state and the run on each worker"),
    "logs": (do_logs, "print (or --follow) one worker's training log"),
    "stop": (do_stop, "SIGTERM the run on every worker (it checkpoints first)"),
    "delete": (do_delete, "delete the queued resource and its TPU VMs"),
}


# --- command line ------------------------------------------------------------------------

def _name(value: str) -> str:
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,50}[a-z0-9])?", value):
        raise argparse.ArgumentTypeError(
            f"{value!r}: use lowercase letters, digits and '-', starting with a letter "
            "(Cloud TPU's naming rule)")
    return value


def _shared_flags() -> argparse.ArgumentParser:
    shared = argparse.ArgumentParser(add_help=False)
    where = shared.add_argument_group("the queued resource (the same on every step)")
    where.add_argument("--name", required=True, type=_name,
                       help="Queued resource name; also the node id (single slice) or node "
                       "prefix (multislice: NAME-0, NAME-1, ...).")
    where.add_argument("--zone", required=True, help="e.g. us-west4-a")
    where.add_argument("--project", help="Google Cloud project (default: gcloud's).")
    where.add_argument("--accelerator_type",
                       help="Slice type as gcloud spells it: v5litepod-16, v5p-64, v4-32, v6e-16.")
    where.add_argument("--node_count", type=int, default=1,
                       help="Slices (>1: multislice over DCN).")
    where.add_argument("--hosts_per_slice", type=int,
                       help="TPU VMs per slice, for types this launcher does not know.")
    shared.add_argument("--dry_run", action="store_true",
                        help="Print the exact commands (shell-quoted) and run nothing.")
    shared.add_argument("--parallel", type=int, default=16,
                        help="ssh sessions at once for per-worker steps.")
    return shared


def register(subparsers) -> None:
    tpu = subparsers.add_parser(
        "tpu", help="Cloud TPU VMs through gcloud queued resources",
        description="Cloud TPU VMs: create -> setup -> run -> status/logs -> stop -> delete. "
                    "Put the shared flags in a file and pass @FILE to every step.",
        fromfile_prefix_chars="@")
    steps = tpu.add_subparsers(dest="step", required=True, metavar="STEP")
    shared = _shared_flags()
    parsers = {name: steps.add_parser(name, parents=[shared], help=help_text,
                                      description=help_text, fromfile_prefix_chars="@")
               for name, (_, help_text) in STEPS.items()}
    create = parsers["create"]
    create.add_argument("--runtime_version",
                        help="TPU VM image (default: Cloud TPU's base image for the type, e.g. "
                        "v2-alpha-tpuv5-lite for v5litepod).")
    capacity = create.add_mutually_exclusive_group()
    capacity.add_argument("--spot", action="store_true", help="Spot capacity (preemptible).")
    capacity.add_argument("--reserved", action="store_true", help="Your reservation's capacity.")
    create.add_argument("--no_wait", action="store_true", help="Return once requested.")
    create.add_argument("--poll_s", type=float, default=30.0, help="Seconds between state checks.")
    create.add_argument("--timeout_s", type=float, help="Give up waiting after this long.")
    setup = parsers["setup"]
    setup.add_argument("--commit", help="Commit to install (default: this checkout's HEAD).")
    setup.add_argument("--repo", help="Repository URL the workers clone (default: origin).")
    setup.add_argument("--python", default="3.11", help="Python version of the workers' venv.")
    run = parsers["run"]
    run.add_argument("--config", required=True, help="Config path in the repository.")
    run.add_argument("--workdir", required=True, help="Run folder, e.g. gs://BUCKET/runs/NAME.")
    run.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                     help="Environment variable for the training processes (repeatable).")
    run.epilog = "Flags after `--` go to t5x_like.train, e.g. -- --config.batch_size=256"
    logs = parsers["logs"]
    logs.add_argument("--worker", type=int, default=0, help="Worker number within the slice.")
    logs.add_argument("--slice", type=int, default=0, help="Slice number (multislice).")
    logs.add_argument("--lines", type=int, default=100)
    logs.add_argument("--follow", action="store_true", help="Keep printing (tail -F).")
    tpu.set_defaults(func=main)


def main(args, train_args: list[str], out=None) -> int:
    if args.node_count < 1:
        raise UserError(f"--node_count={args.node_count} must be at least 1.")
    if train_args and args.step != "run":
        raise UserError(f"`--` and what follows are for `run` only, not `{args.step}`.")
    slice_type = (accelerators.parse(args.accelerator_type, args.hosts_per_slice)
                  if args.accelerator_type else None)
    s = Slices(args.name, args.zone, args.project, args.node_count, slice_type)
    runner = Runner(args.dry_run, out=out, parallel=args.parallel)
    step, _ = STEPS[args.step]
    return step(args, runner, s, train_args) if args.step == "run" else step(args, runner, s)
