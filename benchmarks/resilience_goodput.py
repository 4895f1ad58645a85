"""Goodput of a 200-step CPU run of the tiny quickstart model with a preemption at step
120 and a hang at about step 150 (issue 35's measurement), through the real commands:

1. ``train`` to 200 steps gets SIGTERM once it logged step 120: it saves and exits 0;
2. ``train`` again resumes there; its data source blocks forever after a number of
   records (about 30 steps later): the watchdog (``hang_timeout_s``) exits 75;
3. ``train`` again resumes from the last checkpoint (every 20 steps) to step 200;

then ``python -m t5x_like.goodput WORKDIR`` prints productive time over wall time and
the badput by cause. ``python benchmarks/resilience_goodput.py [--workdir=/tmp/...]``

``--smoke``: the same three runs and report over 20 steps (SIGTERM after step 8, the
source blocking 5 steps into the second run, checkpoints every 4 steps, one evaluation at
the end), a check that the script runs. The runs stay separate processes: signals, exits
and restarts are what is measured; the report, which only reads the workdir, is
``t5x_like.goodput``'s ``main`` in this process (as the other smoke runs run commands).
The second run's watchdog waits ``SMOKE_HANG_TIMEOUT_S`` (its first step, which loads the
first run's compiled step from JAX's cache, three times that): the full 10 s is idle time,
and the other two runs keep it, as their first steps compile.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = ["--config=configs/quickstart.py", "--config.model.num_encoder_layers=1",
        "--config.model.num_decoder_layers=1", "--config.model.d_model=32",
        "--config.model.num_heads=2", "--config.model.head_dim=16", "--config.model.d_ff=64",
        "--config.batch_size=8", "--config.task_feature_lengths.inputs=32",
        "--config.task_feature_lengths.targets=8", "--config.eval_every_steps=50",
        "--config.eval_batches=2", "--config.log_every_steps=1",
        "--config.checkpoint_every_steps=20", "--config.num_train_steps=200",
        "--module=blocking_tasks", "--config.task=blocking_task"]
# --smoke: steps, checkpoints and evaluations, when SIGTERM comes and the source blocks.
SMOKE_SCHEDULE = ["--config.num_train_steps=20", "--config.checkpoint_every_steps=4",
                  "--config.eval_every_steps=20"]
SMOKE_SIGTERM_AFTER, SMOKE_BLOCK_AFTER, SMOKE_HANG_TIMEOUT_S = 8, 40, 4.0

# The task module the hang comes from, shared with tests/test_watchdog.py: the train split
# blocks forever after BLOCK_AFTER records (unset: never).
BLOCKING_TASKS_DIR = REPO / "tests" / "fixtures"


def last_step(workdir: pathlib.Path) -> int:
    lines = (workdir / "metrics.jsonl").read_text().splitlines() if (
        workdir / "metrics.jsonl").exists() else []
    return json.loads(lines[-1])["step"] if lines else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="")
    parser.add_argument("--hang_timeout_s", type=float, default=10.0)
    parser.add_argument("--block_after", type=int, default=240,
                        help="Records the second run reads before its data source blocks.")
    parser.add_argument("--run_timeout_s", type=float, default=1800.0,
                        help="Longest any one of the three runs may take: a run that hangs "
                             "past its watchdog fails the benchmark instead of holding it.")
    parser.add_argument("--smoke", action="store_true",
                        help="20 steps, a shorter hang: a check that the script runs")
    args = parser.parse_args(argv)
    sigterm_after, schedule = 120, []
    if args.smoke:
        sigterm_after, schedule = SMOKE_SIGTERM_AFTER, SMOKE_SCHEDULE
        args.block_after = SMOKE_BLOCK_AFTER
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="resilience_goodput_"))
    workdir = pathlib.Path(args.workdir) if args.workdir else scratch / "run"
    shutil.rmtree(workdir, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{BLOCKING_TASKS_DIR}",
               JAX_PLATFORMS="cpu")
    env.pop("BLOCK_AFTER", None)
    env.pop("BLOCK_PROCESS", None)
    env.pop("XLA_FLAGS", None)
    command = [sys.executable, "-m", "t5x_like.train", f"--workdir={workdir}", *TINY, *schedule,
               f"--config.hang_timeout_s={args.hang_timeout_s}", "--quiet"]

    first = subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    while first.poll() is None and last_step(workdir) < sigterm_after:
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)
    try:
        _, err = first.communicate(timeout=args.run_timeout_s)
    except subprocess.TimeoutExpired:
        first.kill()
        raise
    print(f"run 1: exit {first.returncode}, stopped at step {last_step(workdir)} "
          f"(SIGTERM after step {sigterm_after})")

    watch = [f"--config.hang_timeout_s={SMOKE_HANG_TIMEOUT_S}"] if args.smoke else []
    second = subprocess.run(command + watch, cwd=REPO,
                            env=dict(env, BLOCK_AFTER=str(args.block_after)),
                            stderr=subprocess.PIPE, text=True, timeout=args.run_timeout_s)
    hang = [line for line in second.stderr.splitlines() if "furthest behind" in line]
    print(f"run 2: exit {second.returncode}, {hang[0].strip() if hang else second.stderr[-800:]}")

    third = subprocess.run(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True,
                           timeout=args.run_timeout_s)
    print(f"run 3: exit {third.returncode}, ended at step {last_step(workdir)}"
          + ("" if third.returncode == 0 else f": {third.stderr[-800:]}"))
    print()
    if args.smoke:
        import _smoke
        _smoke.IN_PROCESS = True
        print(_smoke.cli("t5x_like.goodput", [str(workdir)], cwd=REPO, capture=True))
    else:
        report = subprocess.run([sys.executable, "-m", "t5x_like.goodput", str(workdir)],
                                cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=args.run_timeout_s)
        print(report.stdout or report.stderr)
    shutil.rmtree(scratch, ignore_errors=True)  # the run lives on only under --workdir
    return 0


if __name__ == "__main__":
    sys.exit(main())
