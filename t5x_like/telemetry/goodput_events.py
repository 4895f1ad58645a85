"""Goodput: what every run of a workdir spent its wall time on, across restarts.

``train`` (process 0) appends one JSON line per event to ``WORKDIR/goodput.jsonl``:

* ``start``: the run began (``t``: when ``train.run`` was entered);
* ``setup``: set-up finished (``restore_s`` of it restoring a checkpoint;
  ``resumed_from``: the step it resumed from, 0 for a new run);
* ``steps``: at every log step, for the steps since the last record: ``step`` (the
  last one), ``data_s`` (waiting for input), ``rollout_s`` (online RL sampling and
  scoring completions, ``rl.py``), ``checkpoint_save_s``, ``evaluation_s``,
  ``compile_s`` (the first step of a run: compilation included);
* ``end``: the run ended (``status``: done, preempted, error) after ``checkpoint_save_s``
  waiting for the last saves; ``hang``: the watchdog stopped it.

The accounting (:func:`account`) splits the time from the first run's start to the
last record into causes that add up to it exactly: every interval between two records of
a run is split into what that record measured and the rest (productive step time, or
``other`` outside the loop); the time between one run's last record and the next run's
start is ``between_runs`` (a killed or preempted run's unrecorded tail, the restart);
steps a later run trained again (it resumed from an earlier checkpoint) move from
productive to ``lost_to_restart``; a run stopped by the watchdog counts the time since
its last record as ``hang``.

No library is used for the accounting: Google's ml-goodput-measurement reads its events
from Cloud Logging (not available offline or outside Google Cloud), and its model
(job start, step start, checkpoint times) is what this module records in a file.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid

from t5x_like.system import storage

EVENTS_NAME = "goodput.jsonl"
CAUSES = ("productive", "startup", "checkpoint_restore", "compile", "data", "rollout",
          "checkpoint_save", "evaluation", "lost_to_restart", "hang", "between_runs", "other")
_MEASURED = ("compile", "data", "rollout", "checkpoint_save", "evaluation")


class Recorder:
    """Appends a run's events (enabled on process 0 only); ``timed(cause)`` adds the
    time of a block to what the next ``steps`` record reports."""

    def __init__(self, workdir, enabled: bool, started: float | None = None):
        self.file = storage.path(workdir) / EVENTS_NAME
        self._log = storage.AppendLog(self.file) if enabled else None
        self.run = uuid.uuid4().hex[:12]
        self.pending = dict.fromkeys(_MEASURED, 0.0)
        self.event("start", t=time.time() if started is None else started)

    def event(self, kind: str, **fields) -> None:
        if self._log is None:
            return
        record = {"run": self.run, "kind": kind, "t": time.time(), **fields}
        self._log.append(json.dumps(record) + "\n")

    @contextlib.contextmanager
    def timed(self, cause: str):
        began = time.monotonic()
        try:
            yield
        finally:
            self.pending[cause] += time.monotonic() - began

    def steps(self, step: int) -> None:
        self.event("steps", step=step, **{f"{k}_s": round(v, 6) for k, v in self.pending.items()})
        self.pending = dict.fromkeys(_MEASURED, 0.0)

    def close(self, kind: str = "end", **fields) -> None:
        self.event(kind, checkpoint_save_s=round(self.pending["checkpoint_save"], 6), **fields)
        if self._log is not None:
            self._log.close()
            self._log = None


def read_events(workdir) -> list[dict]:
    file = storage.path(workdir) / EVENTS_NAME
    if not file.exists():
        return []
    events = []
    for line in file.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a torn last line of a killed run
    return events


def _runs(events: list[dict]) -> list[list[dict]]:
    """Events grouped by run, runs in order of their start."""
    runs: dict[str, list[dict]] = {}
    for event in events:
        runs.setdefault(event["run"], []).append(event)
    ordered = [sorted(evs, key=lambda e: e["t"]) for evs in runs.values()
               if any(e["kind"] == "start" for e in evs)]
    return sorted(ordered, key=lambda evs: evs[0]["t"])


def account(events: list[dict]) -> dict:
    """``{"wall_s", "causes": {cause: seconds}, "goodput", "runs": [...]}``; the causes
    add up to ``wall_s``."""
    runs = _runs(events)
    causes = dict.fromkeys(CAUSES, 0.0)
    summaries = []
    if not runs:
        return {"wall_s": 0.0, "causes": causes, "goodput": None, "runs": []}
    # Steps each run trained that a later run trained again: (run index, from, to].
    resumed = [next((e.get("resumed_from", 0) for e in run if e["kind"] == "setup"), None)
               for run in runs]
    for index, run in enumerate(runs):
        later = [r for r in resumed[index + 1:] if r is not None]
        redo_from = min(later) if later else None  # steps above it were trained again
        previous, last_step = run[0], resumed[index] or 0
        ended = "killed"
        for event in run[1:]:
            interval = max(event["t"] - previous["t"], 0.0)
            kind = event["kind"]
            if kind == "setup":
                restore = min(event.get("restore_s", 0.0), interval)
                causes["checkpoint_restore"] += restore
                causes["startup"] += interval - restore
            elif kind == "steps":
                measured = {c: min(event.get(f"{c}_s", 0.0), interval) for c in _MEASURED}
                scale = min(1.0, interval / max(sum(measured.values()), 1e-12))
                for cause, seconds in measured.items():
                    causes[cause] += seconds * scale
                productive = interval - sum(measured.values()) * scale
                step = event["step"]
                if redo_from is not None and step > redo_from and step > last_step:
                    lost = productive * (step - max(last_step, redo_from)) / (step - last_step)
                    causes["lost_to_restart"] += lost
                    productive -= lost
                causes["productive"] += productive
                last_step = step
            elif kind == "hang":
                causes["hang"] += interval
                ended = "hang"
            elif kind == "end":
                save = min(event.get("checkpoint_save_s", 0.0), interval)
                causes["checkpoint_save"] += save
                causes["other"] += interval - save
                ended = event.get("status", "end")
            else:
                causes["other"] += interval
            previous = event
        if index + 1 < len(runs):
            causes["between_runs"] += max(runs[index + 1][0]["t"] - previous["t"], 0.0)
        summaries.append({"run": run[0]["run"], "start": run[0]["t"], "end": previous["t"],
                          "resumed_from": resumed[index], "last_step": last_step,
                          "ended": ended})
    wall = sum(causes.values())
    return {"wall_s": wall, "causes": causes,
            "goodput": causes["productive"] / wall if wall > 0 else None, "runs": summaries}


def one_line(result: dict) -> str:
    """``goodput 71.2% of 35.1 s over 2 runs (badput: compile 5.0 s, ...)``."""
    if result["goodput"] is None:
        return "goodput: no events recorded."
    bad = sorted(((s, c) for c, s in result["causes"].items()
                  if c != "productive" and s >= 0.05), reverse=True)
    parts = ", ".join(f"{c} {s:.1f} s" for s, c in bad) or "none"
    runs = len(result["runs"])
    return (f"goodput {100 * result['goodput']:.1f}% of {result['wall_s']:.1f} s over {runs} "
            f"run{'s' if runs != 1 else ''} (badput: {parts})")


def write_tensorboard(workdir, result: dict, step: int) -> None:
    """The account as TensorBoard scalars beside the training curves (``tensorboard/``):
    ``goodput/fraction`` and ``goodput/<cause>_s`` at ``step``, the run's last, so the
    restarts' history shows as one point per run."""
    if result["goodput"] is None:
        return
    # A file of its own: tensorboardX names files by the second they open in, and train's
    # next run (its metrics writer) may open one within the same second and replace it.
    writer = storage.summary_writer(storage.path(workdir) / "tensorboard",
                                    filename_suffix=f".goodput.{step}")
    try:
        writer.add_scalar("goodput/fraction", result["goodput"], global_step=step)
        for cause, seconds in result["causes"].items():
            writer.add_scalar(f"goodput/{cause}_s", seconds, global_step=step)
    finally:
        writer.close()
