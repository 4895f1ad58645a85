"""Rehearse a multi-host run on one machine: N processes over loopback, each with
its own fake CPU devices, joined by ``jax.distributed`` exactly as pod hosts are.

    python -m t5x_like.launch_local --num_processes=2 --devices_per_process=4 -- \\
        --config=configs/quickstart.py --workdir=/tmp/run2x4

Everything after ``--`` goes to ``python -m t5x_like.train`` (or ``--module``).
Process 0's output passes through; the others' lines are prefixed ``[pI]``.
SIGTERM is forwarded to every process (a preemption rehearsal); the exit code is
the first non-zero one among the processes. On Linux the processes die with the
launcher however it ends (``kill -9`` included): a rehearsal killed from outside, as a
test's timeout kills it, must not leave trainers running on the machine.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from t5x_like import errors
from t5x_like.engine import partitioning


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def process_env(base: dict, index: int, num_processes: int, devices: int, port: int) -> dict:
    env = dict(base)
    env.update({
        partitioning.ENV_COORDINATOR: f"127.0.0.1:{port}",
        partitioning.ENV_NUM_PROCESSES: str(num_processes),
        partitioning.ENV_PROCESS_ID: str(index),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": _with_device_count(base.get("XLA_FLAGS", ""), devices),
    })
    return env


def _with_device_count(flags: str, devices: int) -> str:
    """The caller's XLA flags (an optimisation level, a dump folder) with this launch's
    device count in place of any it had."""
    kept = [f for f in flags.split() if not f.startswith("--xla_force_host_platform_device_count")]
    return " ".join([*kept, f"--xla_force_host_platform_device_count={devices}"])


# prctl(PR_SET_PDEATHSIG): the kernel sends the child a signal when its parent dies.
_PR_SET_PDEATHSIG = 1
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def _dies_with(parent_pid: int):
    """A ``preexec_fn`` (None off Linux) that has the kernel SIGKILL the child when this
    launcher dies. Resolved before the fork, so the child only makes the call; a launcher
    gone before the call leaves the child no parent to wait for, so it exits at once."""
    if _PRCTL is None:
        return None

    def set_parent_death_signal() -> None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:
            os._exit(1)
    return set_parent_death_signal


def _relay(stream, prefix: str, out) -> None:
    for line in stream:
        out.write(prefix + line)
        out.flush()


def launch(num_processes: int, devices_per_process: int, args: list[str],
           module: str = "t5x_like.train", timeout_s: float | None = None) -> int:
    port = free_port()
    processes = []
    threads = []
    for index in range(num_processes):
        env = process_env(os.environ, index, num_processes, devices_per_process, port)
        process = subprocess.Popen([sys.executable, "-m", module, *args], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   preexec_fn=_dies_with(os.getpid()))
        processes.append(process)
        prefix = "" if index == 0 else f"[p{index}] "
        for stream, out in ((process.stdout, sys.stdout), (process.stderr, sys.stderr)):
            thread = threading.Thread(target=_relay, args=(stream, prefix, out), daemon=True)
            thread.start()
            threads.append(thread)

    def forward(signum, frame):
        for process in processes:
            if process.poll() is None:
                process.send_signal(signum)
    previous = signal.signal(signal.SIGTERM, forward)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in processes):
            failed = [p.returncode for p in processes if p.returncode not in (None, 0)]
            if failed or (deadline is not None and time.monotonic() > deadline):
                # One process failing leaves the others waiting on collectives forever.
                for process in processes:
                    if process.poll() is None:
                        process.kill()
                if not failed:
                    print(f"launch_local: timed out after {timeout_s} s; killed all processes.",
                          file=sys.stderr)
                    return 124
            time.sleep(0.1)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for thread in threads:
            thread.join(timeout=5)
    codes = [p.returncode for p in processes]
    return next((code for code in codes if code != 0), 0)


@errors.command_line("launch_local")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" in argv:
        split = argv.index("--")
        own, passed = argv[:split], argv[split + 1:]
    else:
        own, passed = argv, []
    parser = argparse.ArgumentParser(prog="python -m t5x_like.launch_local", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--devices_per_process", type=int, default=4)
    parser.add_argument("--module", default="t5x_like.train",
                        help="Python module each process runs (default: the trainer).")
    parser.add_argument("--timeout_s", type=float, default=None,
                        help="Kill every process after this many seconds (exit 124).")
    args = parser.parse_args(own)
    if args.num_processes < 1 or args.devices_per_process < 1:
        parser.error(f"--num_processes={args.num_processes} and --devices_per_process="
                     f"{args.devices_per_process} must both be at least 1.")
    if not passed:
        parser.error("give the trainer's arguments after --, e.g. -- "
                     "--config=quickstart --workdir=/tmp/run2x4")
    return launch(args.num_processes, args.devices_per_process, passed, args.module,
                  args.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
