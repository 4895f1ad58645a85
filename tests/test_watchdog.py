"""Hang detection: a data source that blocks forever trips the watchdog within its timeout
plus a bound, with every thread's stack written (naming the blocking frame), the process
furthest behind named, and exit status 75; for 1 and 2 processes. A multi-process start-up
that never completes names the processes that never arrived."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from storage_emulators import free_port

from t5x_like import goodput_events, partitioning, watchdog
from t5x_like.workdir_lock import LOCK_NAME

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = ["--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
        "--config.model.d_model=32", "--config.model.num_heads=2", "--config.model.head_dim=16",
        "--config.model.d_ff=64", "--config.batch_size=8",
        "--config.task_feature_lengths.inputs=32", "--config.task_feature_lengths.targets=8",
        "--config.eval_every_steps=0", "--config.log_every_steps=1000",
        "--config.checkpoint_every_steps=2"]

# A task whose training records stop coming after BLOCK_AFTER reads, on the process
# BLOCK_PROCESS only; the moment it starts blocking is written to BLOCK_MARK.
BLOCKING_TASKS = textwrap.dedent("""
    import os
    import threading
    import time
    from collections.abc import Sequence

    from t5x_like.data import dataset_providers as dp
    from t5x_like.data.sources import FunctionSource

    base = dp.get_task_or_mixture("embedded_en_span_corruption")
    HERE = os.environ.get("T5X_LIKE_PROCESS_ID", "0") == os.environ["BLOCK_PROCESS"]


    def block_forever_in_the_data_source():
        with open(os.environ["BLOCK_MARK"], "w") as f:
            f.write(str(time.time()))
        threading.Event().wait()


    class BlockingRecords(Sequence):
        def __init__(self, records):
            self.records, self.reads = records, 0

        def __len__(self):
            return len(self.records)

        def __getitem__(self, index):
            self.reads += 1
            if HERE and self.reads > int(os.environ["BLOCK_AFTER"]):
                block_forever_in_the_data_source()
            return self.records[index]


    def load(split):
        records = base.source.get(split)
        return BlockingRecords(records) if split == "train" else records


    dp.TaskRegistry.add("blocking_task", FunctionSource(load), base.preprocessors,
                        base.output_features)
""")


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
    dog.start()
    assert dog.fired.wait(10)
    while not codes and time.monotonic() - started < 10:
        time.sleep(0.05)
    stuck.set()
    assert codes == [watchdog.HANG_EXIT_CODE] and released == [True]
    assert time.monotonic() - started < 0.5 + 3
    stacks = (tmp_path / "hangs" / "run" / "process_0.txt").read_text()
    assert "stuck_in_a_collective_for_the_test" in stacks and "hang-watchdog" not in stacks[:0]
    report = json.loads((tmp_path / "hangs" / "run" / "process_0.json").read_text())
    assert (report["last_done"], report["last_done_step"]) == ("train step", 7)
    summary = "\n".join(lines)
    assert "furthest behind: process 0" in summary
    assert "last finished train step 7" in summary and "reading the batch of step 8" in summary
    assert "status 75" in summary
    assert (tmp_path / "hangs" / "run" / "summary.txt").read_text().strip() == summary


def test_timeout_defaults_off_on_cpu_and_generous_on_accelerators():
    assert watchdog.resolve_timeout(-1, "cpu") == 0
    assert watchdog.resolve_timeout(-1, "tpu") == watchdog.resolve_timeout(-1, "gpu") == 1800
    assert watchdog.resolve_timeout(5, "cpu") == 5 and watchdog.resolve_timeout(0, "tpu") == 0


def _blocking_env(tmp_path, block_process: int, block_after: int) -> dict:
    (tmp_path / "blocking_tasks.py").write_text(BLOCKING_TASKS)
    return dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}", JAX_PLATFORMS="cpu",
                BLOCK_PROCESS=str(block_process), BLOCK_AFTER=str(block_after),
                BLOCK_MARK=str(tmp_path / "blocked_at"))


HANG_TIMEOUT_S = 6  # x 3 for the first step: its compilation, on a loaded 2-core machine
BOUND_S = 15        # the watchdog polls every second, then writes and waits for the others


def _check_hang(tmp_path, workdir, result, ended: float, process_count: int, slowest: int):
    assert result.returncode == watchdog.HANG_EXIT_CODE, result.stderr[-4000:]
    blocked_at = float((tmp_path / "blocked_at").read_text())
    trip_s = ended - blocked_at
    print(f"watchdog tripped {trip_s:.1f} s after the data source blocked "
          f"(hang_timeout_s={HANG_TIMEOUT_S}, {process_count} process(es))")
    assert HANG_TIMEOUT_S <= trip_s < HANG_TIMEOUT_S + BOUND_S
    [folder] = (workdir / "hangs").iterdir()
    for i in range(process_count):
        assert "Thread" in (folder / f"process_{i}.txt").read_text()
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
         *TINY, "--config.num_train_steps=1000", f"--config.hang_timeout_s={HANG_TIMEOUT_S}"],
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
         f"--config.hang_timeout_s={HANG_TIMEOUT_S}"],
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
