"""Hang detection: a data source that blocks forever trips the watchdog within its timeout
plus a bound, with every thread's stack written (naming the blocking frame), the process
furthest behind named, and exit status 75; for 1 and 2 processes. A multi-process start-up
that never completes names the processes that never arrived."""

import inspect
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest
from storage_emulators import free_port

from t5x_like.engine import partitioning
from t5x_like.resilience import watchdog
from t5x_like.resilience.workdir_lock import LOCK_NAME
from t5x_like.telemetry import goodput_events

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = ["--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
        "--config.model.d_model=32", "--config.model.num_heads=2", "--config.model.head_dim=16",
        "--config.model.d_ff=64", "--config.batch_size=8",
        "--config.task_feature_lengths.inputs=32", "--config.task_feature_lengths.targets=8",
        "--config.eval_every_steps=0", "--config.log_every_steps=1000",
        "--config.checkpoint_every_steps=2"]

# tests/fixtures/blocking_tasks.py: a task whose training records stop coming after
# BLOCK_AFTER reads, on the process BLOCK_PROCESS only; the moment it starts blocking is
# written to BLOCK_MARK (benchmarks/resilience_goodput.py trains on it too).
FIXTURES = REPO / "tests" / "fixtures"


def test_watchdog_writes_every_threads_stack_and_exits_75(tmp_path):
    """In-process, with the exit captured: a stuck thread's frame is in the stacks file,
    the summary names where the process stood, the lock is released first."""
    stuck = threading.Event()

    def stuck_in_a_collective_for_the_test():
        stuck.wait()
    thread = threading.Thread(target=stuck_in_a_collective_for_the_test, daemon=True)
    thread.start()
    codes, lines, released = [], [], []
    dog = watchdog.HangWatchdog(0.5, tmp_path / "hangs" / "run", log=lines.append,
                                before_exit=lambda: released.append(True), exit=codes.append)
    dog.done("train step", 7)
    dog.doing("reading the batch of step", 8)
    started = time.monotonic()
    try:
        dog.start()
        assert dog.fired.wait(10)
        while not codes and time.monotonic() - started < 10:
            time.sleep(0.05)
    finally:
        # Released however this ends: the feature-removal suite runs this test with the
        # watchdog taken out, and a thread left stuck would be a second one here when the
        # test itself runs later in the same worker.
        stuck.set()
        thread.join(5)
    assert codes == [watchdog.HANG_EXIT_CODE] and released == [True]
    assert time.monotonic() - started < 0.5 + 3
    stacks = (tmp_path / "hangs" / "run" / "process_0.txt").read_text()
    # The stuck thread's innermost frame outside threading.py is the blocking call itself,
    # named by this file, its line and its function; the thread that wrote the stacks
    # ("Current thread") is the watchdog's own, not the stuck one.
    source, first = inspect.getsourcelines(stuck_in_a_collective_for_the_test)
    blocking_line = first + next(i for i, line in enumerate(source) if "stuck.wait()" in line)
    threads = _thread_stacks(stacks)
    [frames] = [f for _, f in threads if any("stuck_in_a_collective" in x for x in f)]
    innermost = next(frame for frame in frames if not frame.startswith(f'File "{threading.__file__}"'))
    assert innermost == (f'File "{__file__}", line {blocking_line} in '
                         "stuck_in_a_collective_for_the_test"), frames
    [(_, writer)] = [t for t in threads if t[0].startswith("Current thread")]
    assert writer[0].endswith("in all_stacks") and any(f.endswith("in _fire") for f in writer)
    assert not any("stuck_in_a_collective" in frame for frame in writer)
    report = json.loads((tmp_path / "hangs" / "run" / "process_0.json").read_text())
    assert (report["last_done"], report["last_done_step"]) == ("train step", 7)
    summary = "\n".join(lines)
    assert "furthest behind: process 0" in summary
    assert "last finished train step 7" in summary and "reading the batch of step 8" in summary
    assert "status 75" in summary
    assert (tmp_path / "hangs" / "run" / "summary.txt").read_text().strip() == summary


def _thread_stacks(text: str) -> list[tuple[str, list[str]]]:
    """faulthandler's dump as ``(header, frames most recent first)`` per thread."""
    threads = []
    for block in text.strip().split("\n\n"):
        header, *frames = [line.strip() for line in block.splitlines() if line.strip()]
        threads.append((header, frames))
    return threads


def test_timeout_defaults_off_on_cpu_and_generous_on_accelerators():
    assert watchdog.resolve_timeout(-1, "cpu") == 0
    assert watchdog.resolve_timeout(-1, "tpu") == watchdog.resolve_timeout(-1, "gpu") == 1800
    assert watchdog.resolve_timeout(5, "cpu") == 5 and watchdog.resolve_timeout(0, "tpu") == 0
    assert watchdog.resolve_first_step_timeout(-1, 1800) == 5400
    assert watchdog.resolve_first_step_timeout(600, 1800) == 600


def _wait_for_the_exit(dog, codes) -> None:
    """Until the fired watchdog has called its (captured) exit, or 10 s."""
    assert dog.fired.wait(10)
    deadline = time.monotonic() + 10
    while not codes and time.monotonic() < deadline:
        time.sleep(0.05)


def test_the_first_step_has_its_own_allowance_and_later_steps_the_hang_timeout(tmp_path):
    """A first step (it compiles) slower than hang_timeout_s is not a hang while it stays
    within first_step_timeout_s; the next step gets hang_timeout_s, and the summary names
    the allowance that ran out."""
    codes, lines = [], []
    dog = watchdog.HangWatchdog(0.3, tmp_path / "hangs" / "run", log=lines.append,
                                exit=codes.append, first_step_timeout_s=60)
    dog.doing("train step (compiling)", 1, first=True)
    dog.start()
    try:
        time.sleep(1.5)  # five hang timeouts into the compile
        assert not dog.fired.is_set()
        dog.done("train step", 1)
        dog.doing("train step", 2)
        _wait_for_the_exit(dog, codes)
    finally:
        dog.stop()
    assert codes == [watchdog.HANG_EXIT_CODE]
    assert "finished for 0.3 s (hang_timeout_s)" in lines[0]
    assert "then in train step 2" in lines[0]


def test_a_first_step_past_its_allowance_is_named_as_such(tmp_path):
    codes, lines = [], []
    dog = watchdog.HangWatchdog(30, tmp_path / "hangs" / "run", log=lines.append,
                                exit=codes.append, first_step_timeout_s=0.3)
    dog.doing("train step (compiling)", 1, first=True)
    dog.start()
    try:
        _wait_for_the_exit(dog, codes)
    finally:
        dog.stop()
    assert codes == [watchdog.HANG_EXIT_CODE]
    assert "finished for 0.3 s (first_step_timeout_s: a first step, evaluation or save compiles)" in lines[0]


@pytest.mark.slow
def test_a_run_gives_the_first_allowance_to_each_first_compile_only(tmp_path, monkeypatch):
    """The loop asks for ``first_step_timeout_s`` exactly where it compiles or builds
    programs: the first batch and step, each evaluator's first run, the first save."""
    from conftest import tiny_config

    from t5x_like import train
    asked = []
    monkeypatch.setattr(watchdog.HangWatchdog, "doing",
                        lambda self, phase, step=None, first=False: asked.append((phase, first)))
    train.run(tiny_config(num_train_steps=2, eval_every_steps=1, checkpoint_every_steps=1,
                          log_every_steps=1, eval_batches=1), str(tmp_path / "run"), quiet=True)
    firsts = [phase for phase, first in asked if first]
    assert firsts == ["reading the batch of step", "train step (compiling)",
                      "held-out evaluation at step", "checkpoint save at step"], asked
    assert ("held-out evaluation at step", False) in asked  # the second evaluation
    assert ("checkpoint save at step", False) in asked and ("train step", False) in asked


def _blocking_env(tmp_path, block_process: int, block_after: int) -> dict:
    return dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{FIXTURES}", JAX_PLATFORMS="cpu",
                BLOCK_PROCESS=str(block_process), BLOCK_AFTER=str(block_after),
                BLOCK_MARK=str(tmp_path / "blocked_at"))


HANG_TIMEOUT_S = 15
# The first step's compilation: 8 s alone, over 45 s for two processes while other tests
# run (18, 30 and 45 s allowances all tripped the watchdog before the block); the hang
# under test is after it, so the compile gets its own, generous allowance.
FIRST_STEP_TIMEOUT_S = 180
WATCHDOG_FLAGS = [f"--config.resilience.hang_timeout_s={HANG_TIMEOUT_S}",
                  f"--config.resilience.first_step_timeout_s={FIRST_STEP_TIMEOUT_S}"]
BOUND_S = 15        # the watchdog polls every second, then writes and waits for the others


def _check_hang(tmp_path, workdir, result, ended: float, process_count: int, slowest: int):
    assert result.returncode == watchdog.HANG_EXIT_CODE, result.stderr[-4000:]
    # The hang the test made, not an earlier one (a phase slower than hang_timeout_s).
    assert (tmp_path / "blocked_at").exists(), result.stderr[-4000:]
    blocked_at = float((tmp_path / "blocked_at").read_text())
    trip_s = ended - blocked_at
    print(f"watchdog tripped {trip_s:.1f} s after the data source blocked "
          f"(hang_timeout_s={HANG_TIMEOUT_S}, {process_count} process(es))")
    # One process: nothing finished for hang_timeout_s after its source blocked. Two: the
    # other process waits in the step's collective from when it got there, which on a
    # loaded machine can be seconds before the slow one's source blocks, so its watchdog
    # may trip sooner after the block (measured 1.4 s once in a full suite run).
    earliest = HANG_TIMEOUT_S if process_count == 1 else 0
    assert earliest <= trip_s < HANG_TIMEOUT_S + BOUND_S
    [folder] = (workdir / "hangs").iterdir()
    for i in range(process_count):
        stacks = folder / f"process_{i}.txt"
        assert stacks.exists() and "Thread" in stacks.read_text(), result.stderr[-4000:]
    assert "block_forever_in_the_data_source" in (folder / f"process_{slowest}.txt").read_text()
    summary = (folder / "summary.txt").read_text()
    assert f"furthest behind: process {slowest} " in summary
    assert "reading the batch of step" in summary.split("furthest behind")[1].splitlines()[0]
    assert f"({process_count} of {process_count} processes)" in summary
    assert "furthest behind" in result.stderr and "status 75" in result.stderr
    assert not (workdir / LOCK_NAME).exists()  # released before exiting
    assert (workdir / "checkpoints" / "2").is_dir()  # saved before the hang, kept
    accounted = goodput_events.account(goodput_events.read_events(workdir))
    assert accounted["runs"][-1]["ended"] == "hang" and accounted["causes"]["hang"] > 0


@pytest.mark.slow
def test_a_blocked_data_source_trips_the_watchdog(tmp_path):
    workdir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "t5x_like.train", "--config=configs/quickstart.py",
         f"--workdir={workdir}", "--module=blocking_tasks", "--config.task=blocking_task",
         *TINY, "--config.num_train_steps=1000", *WATCHDOG_FLAGS],
        cwd=REPO, env=_blocking_env(tmp_path, 0, 40), capture_output=True, text=True,
        timeout=240)
    _check_hang(tmp_path, workdir, result, time.time(), 1, 0)


@pytest.mark.slow
def test_one_blocked_process_of_two_is_named_and_both_write_stacks(tmp_path):
    workdir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "t5x_like.launch_local", "--num_processes=2",
         "--devices_per_process=1", "--timeout_s=200", "--",
         "--config=configs/quickstart.py", f"--workdir={workdir}", "--module=blocking_tasks",
         "--config.task=blocking_task", *TINY, "--config.num_train_steps=1000",
         *WATCHDOG_FLAGS],
        cwd=REPO, env=_blocking_env(tmp_path, 1, 20), capture_output=True, text=True,
        timeout=240)
    _check_hang(tmp_path, workdir, result, time.time(), 2, 1)


def test_startup_names_the_processes_that_never_arrived(tmp_path):
    """Process 0 of 2 starts alone: one line naming process 1, exit 2, well before JAX's
    own deadline (which would abort with a C++ check failure naming no one)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu",
               **{partitioning.ENV_COORDINATOR: f"127.0.0.1:{free_port()}",
                  partitioning.ENV_NUM_PROCESSES: "2", partitioning.ENV_PROCESS_ID: "0"})
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "t5x_like.train", "--config=configs/quickstart.py",
         f"--workdir={tmp_path / 'run'}", *TINY, "--config.startup_timeout_s=3"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("train: ")]
    assert "did not all join within startup_timeout_s=3 s" in line
    assert "process(es) 1 never arrived" in line and "arrived: 0 (" in line
    assert time.monotonic() - started < 60
