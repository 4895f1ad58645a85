"""Hang detection: a run that stops making progress is stopped, with every process's
stacks written down, and the run exits :data:`HANG_EXIT_CODE` so the scheduler restarts it.

A thread per process watches for progress (``done``: a train step, an evaluation, a
checkpoint save). When none has finished for ``hang_timeout_s`` (the first step, which compiles
and starts the input streams, from the end of set-up on: ``first_step_timeout_s``, by default
:data:`COMPILE_PATIENCE` times ``hang_timeout_s``) it

1. writes the stacks of all this process's threads (``faulthandler``) to
   ``WORKDIR/hangs/<run start, UTC>/process_<i>.txt`` and what the process last finished
   and was doing to ``process_<i>.json``;
2. waits a little for the other processes' files (their own watchdogs fire at about the
   same time: collectives keep the processes within a step of each other);
3. on process 0 (or on any process when process 0 wrote nothing), logs which process was
   furthest behind and where it stood, and writes ``summary.txt``;
4. calls ``before_exit`` (release the workdir lock) and ends the process with
   :data:`HANG_EXIT_CODE`: the main thread is stuck, so nothing else could end it.

The folder is named after the time this run started, which every process agrees on
at start-up; the hang's own time is in the files. A multi-process start-up that never
completes is covered by :func:`start_up_guard`.
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from t5x_like.system import storage

# EX_TEMPFAIL (sysexits.h, "try again later"): the run hung and was stopped; restarting it
# resumes from its newest checkpoint. Distinct from 1 (a bug or divergence) and 2 (the
# user's mistake).
HANG_EXIT_CODE = 75
DEFAULT_ACCELERATOR_TIMEOUT_S = 1800.0
# The first step of a run compiles the train step: by default it may take this many timeouts.
COMPILE_PATIENCE = 3.0


def resolve_timeout(hang_timeout_s: float, platform: str) -> float:
    """``hang_timeout_s`` as set, or for -1: 1800 s on TPU and GPU, 0 (off) on CPU."""
    if hang_timeout_s >= 0:
        return float(hang_timeout_s)
    return 0.0 if platform == "cpu" else DEFAULT_ACCELERATOR_TIMEOUT_S


def resolve_first_step_timeout(first_step_timeout_s: float, timeout_s: float) -> float:
    """``first_step_timeout_s`` as set, or for -1: :data:`COMPILE_PATIENCE` times the
    resolved ``hang_timeout_s``."""
    return float(first_step_timeout_s) if first_step_timeout_s > 0 else COMPILE_PATIENCE * timeout_s


def utc_stamp(seconds: float) -> str:
    """A UTC time usable as a folder name on disks and in buckets: 20250102T030405Z."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y%m%dT%H%M%SZ")


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%H:%M:%S UTC")


def all_stacks() -> str:
    """Every thread's Python stack, as ``faulthandler`` writes it (it needs a real file)."""
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(f, all_threads=True)
        f.seek(0)
        return f.read()


class HangWatchdog:
    """``done(phase, step)`` after each unit of progress; ``doing(phase, step)`` before
    one starts (so a report says where a process stood); ``start``/``stop``."""

    def __init__(self, timeout_s: float, hangs_dir, process_index: int = 0,
                 process_count: int = 1, log: Callable[[str], None] = print,
                 before_exit: Callable[[], None] | None = None,
                 exit: Callable[[int], None] = os._exit, grace_s: float | None = None,
                 first_step_timeout_s: float = -1.0):
        self.timeout_s = float(timeout_s)
        self.first_step_timeout_s = resolve_first_step_timeout(first_step_timeout_s,
                                                               self.timeout_s)
        self.hangs_dir = hangs_dir
        self.process_index, self.process_count = process_index, process_count
        self.log, self.before_exit, self._exit = log, before_exit, exit
        # How long a process that fired waits for the others' files.
        self.grace_s = grace_s if grace_s is not None else min(60.0, max(10.0, timeout_s / 4))
        self.last_done = ("set-up", None)
        # Until the first step's own phases: the rest of start-up (the input streams'
        # first reads, evaluators) has the first step's allowance.
        self.doing_now = ("the first step", None)
        self.first = True
        self.last_time, self._wall = time.monotonic(), time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired = threading.Event()

    def done(self, phase: str, step: int | None = None) -> None:
        self.last_done, self.last_time = (phase, step), time.monotonic()
        self._wall = time.time()

    def doing(self, phase: str, step: int | None = None, first: bool = False) -> None:
        """``first``: a phase done for the first time (the first step and each evaluator's
        first run, which compile; the first save, which builds its transfer programs) gets
        ``first_step_timeout_s``."""
        self.doing_now, self.first = (phase, step), first

    @property
    def allowed_s(self) -> float:
        """How long the phase now under way may go without anything finishing."""
        return self.first_step_timeout_s if self.first else self.timeout_s

    def start(self) -> None:
        if self.timeout_s <= 0:
            return
        self.last_time, self._wall = time.monotonic(), time.time()
        self._thread = threading.Thread(target=self._watch, name="hang-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        poll = min(1.0, self.timeout_s / 10)
        while not self._stop.wait(poll):
            if time.monotonic() - self.last_time > self.allowed_s:
                self._fire()
                return

    # -- what a hang leaves behind

    def _progress(self, now: float) -> dict:
        (phase, step), (now_phase, now_step) = self.last_done, self.doing_now
        return {"process": self.process_index, "host": socket.gethostname(), "pid": os.getpid(),
                "last_done": phase, "last_done_step": step,
                "last_done_utc": _utc(self._wall), "idle_s": round(now - self._wall, 1),
                "doing": now_phase, "doing_step": now_step, "fired_utc": _utc(now)}

    def _fire(self) -> None:
        self.fired.set()
        now = time.time()
        folder = storage.path(self.hangs_dir)
        stacks = all_stacks()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            storage.write_atomic(folder / f"process_{self.process_index}.txt", stacks)
            storage.write_atomic(folder / f"process_{self.process_index}.json",
                                 json.dumps(self._progress(now)))
            reports = self._gather(folder)
            if self.process_index == 0 or 0 not in reports:
                summary = self.summary(reports, folder)
                storage.write_atomic(folder / "summary.txt", summary + "\n")
                self.log(summary)
            else:
                self.log(f"hang: process {self.process_index} wrote its stacks to "
                         f"{folder / f'process_{self.process_index}.txt'}")
        except Exception as e:  # noqa: BLE001  (still exit: the run is stuck either way)
            self.log(f"hang: could not write the hang report to {folder} ({e}); stacks of "
                     f"process {self.process_index}:\n{stacks}")
        try:
            if self.before_exit is not None:
                self.before_exit()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            self._exit(HANG_EXIT_CODE)

    def _gather(self, folder) -> dict[int, dict]:
        deadline = time.monotonic() + (self.grace_s if self.process_count > 1 else 0)
        while True:
            reports = {}
            for i in range(self.process_count):
                file = folder / f"process_{i}.json"
                try:
                    reports[i] = json.loads(file.read_text())
                except (FileNotFoundError, ValueError):
                    pass
            if len(reports) == self.process_count or time.monotonic() >= deadline:
                return reports
            time.sleep(0.2)

    def summary(self, reports: dict[int, dict], folder) -> str:
        """One paragraph: how long nothing finished, the process furthest behind and
        where it stood, where the stacks are, and the exit status."""
        def where(r):
            step = "" if r["last_done_step"] is None else f" {r['last_done_step']}"
            doing = "" if r["doing_step"] is None else f" {r['doing_step']}"
            return (f"last finished {r['last_done']}{step} at {r['last_done_utc']}, then "
                    f"in {r['doing']}{doing}")

        def behind(item):
            r = item[1]
            return (-1 if r["last_done_step"] is None else r["last_done_step"], -r["idle_s"])
        allowance = ("first_step_timeout_s: a first step, evaluation or save compiles"
                     if self.first else "hang_timeout_s")
        lines = [f"hang: no train step, evaluation or checkpoint save finished for "
                 f"{self.allowed_s:g} s ({allowance})."]
        if reports:
            index, slowest = min(reports.items(), key=behind)
            lines.append(f"  furthest behind: process {index} (host {slowest['host']}, pid "
                         f"{slowest['pid']}): {where(slowest)}.")
        missing = sorted(set(range(self.process_count)) - set(reports))
        if missing:
            lines.append(f"  no report from process(es) {', '.join(map(str, missing))} within "
                         f"{self.grace_s:g} s: they may be dead or stuck outside Python.")
        for index, report in sorted(reports.items()):
            lines.append(f"  process {index}: {where(report)}")
        lines.append(f"  stacks of every thread: {storage.display(folder)}/process_<i>.txt "
                     f"({len(reports)} of {self.process_count} processes). Exiting with "
                     f"status {HANG_EXIT_CODE} so the scheduler restarts the run; it resumes "
                     "from the newest checkpoint.")
        return "\n".join(lines)


# -- multi-process start-up ----------------------------------------------------------

def _arrivals(folder):
    return storage.path(folder) / "startup"


def start_up_guard(initialize: Callable[[], None], timeout_s: float, marks_dir,
                   process_id: int | None, num_processes: int | None, coordinator: str | None,
                   prog: str = "train", exit: Callable[[int], None] = os._exit) -> None:
    """Runs ``initialize`` (``jax.distributed.initialize`` with a longer timeout of its
    own); if it has not returned after ``timeout_s``, prints one line naming the processes
    that never arrived and ends the process with status 2 (JAX would otherwise abort with
    a C++ check failure that names no one).

    Arrivals are marks each process writes in ``marks_dir/startup/`` before joining (the
    workdir: every process of a run can read it); without a folder (or process ids, as on
    auto-detected clusters) the message says only who waited for how long."""
    started = time.time()
    marks = _arrivals(marks_dir) if marks_dir is not None and process_id is not None else None
    if marks is not None:
        try:
            marks.mkdir(parents=True, exist_ok=True)
            storage.write_atomic(marks / f"process_{process_id}.json", json.dumps(
                {"host": socket.gethostname(), "pid": os.getpid(), "time": started}))
        except OSError:
            marks = None
    finished = threading.Event()

    def expire():
        if finished.wait(timeout_s):
            return
        print(f"{prog}: {_never_arrived(marks, started, timeout_s, process_id, num_processes, coordinator)}",
              file=sys.stderr, flush=True)
        exit(2)

    timer = threading.Thread(target=expire, name="startup-timeout", daemon=True)
    timer.start()
    try:
        initialize()
    finally:
        finished.set()


def _never_arrived(marks, started, timeout_s, process_id, num_processes, coordinator) -> str:
    head = (f"the {num_processes or 'N'} processes of this run did not all join within "
            f"startup_timeout_s={timeout_s:g} s (jax.distributed.initialize, coordinator "
            f"{coordinator or 'from the cluster'}; this is process "
            f"{'?' if process_id is None else process_id})")
    if marks is None or num_processes is None:
        return (head + ". Check that every process was started and can reach the "
                "coordinator, or raise --config.startup_timeout_s.")
    arrived, missing = [], []
    for i in range(num_processes):
        try:
            mark = json.loads((marks / f"process_{i}.json").read_text())
        except (FileNotFoundError, ValueError):
            mark = None
        # A mark older than this wait is a previous run's: that process did not arrive.
        if mark is not None and mark.get("time", 0) >= started - timeout_s - 5:
            arrived.append(f"{i} ({mark.get('host')})")
        else:
            missing.append(str(i))
    if not missing:
        return (head + f": every process started (marks in {storage.display(marks)}), but "
                "they could not all reach the coordinator; check the address and the network.")
    return (head + f": process(es) {', '.join(missing)} never arrived (no start-up mark in "
            f"{storage.display(marks)}); arrived: {', '.join(arrived) or 'none'}. Start the "
            "missing processes (same --coordinator_address, their --process_id), or raise "
            "--config.startup_timeout_s.")
