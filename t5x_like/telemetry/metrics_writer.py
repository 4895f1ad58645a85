"""Where metrics go: ``metrics.jsonl``, the run's trackers (TensorBoard event files,
W&B, MLflow: ``trackers.py``) and the console.

Only process 0 writes; other processes get a writer that does nothing, so the
loop never needs to ask which process it is on.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TextIO

from t5x_like.config.run import TrackingSpec
from t5x_like.system import progress, storage
from t5x_like.telemetry import trackers


class MetricsWriter:
    """Each logged step as a line of ``metrics.jsonl`` and to every tracker, the same
    scalars to each (``trackers``: any of tensorboard, wandb, mlflow)."""

    def __init__(self, workdir, enabled: bool = True, tracker_names: Sequence[str] = ("tensorboard",),
                 tracking: TrackingSpec | None = None, run_config: Mapping | None = None):
        self.enabled = enabled
        self._jsonl = None
        self._trackers = []
        if enabled:
            workdir = storage.path(workdir)
            workdir.mkdir(parents=True, exist_ok=True)
            self._jsonl = storage.AppendLog(workdir / "metrics.jsonl")
            self._trackers = trackers.open_trackers(workdir, tuple(tracker_names),
                                                    tracking or TrackingSpec(), run_config or {})

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        scalars = {k: float(v) for k, v in metrics.items()}
        self._jsonl.append(json.dumps({"step": int(step), **scalars}) + "\n")
        for tracker in self._trackers:
            tracker.write(int(step), scalars)

    def close(self, failed: bool = False) -> None:
        if self.enabled:
            self._jsonl.close()
            for tracker in self._trackers:
                tracker.close(failed)


class Progress:
    """A one-line progress bar on a terminal, plain log lines elsewhere (CI, files)."""

    def __init__(self, total_steps: int, enabled: bool = True,
                 stream: TextIO | None = None, width: int = 24):
        self.total = total_steps
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.width = width
        self._baseline: tuple[int, float] | None = None

    def eta_seconds(self, step: int) -> float:
        """Extrapolated from the steps since the first update, so compile time is left out."""
        if self._baseline is None:
            self._baseline = (step, time.monotonic())
            return float("nan")
        first_step, first_time = self._baseline
        done = step - first_step
        if done <= 0:
            return float("nan")
        return (time.monotonic() - first_time) / done * (self.total - step)

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        eta = self.eta_seconds(step)
        eta_text = progress.duration(eta)  # --:-- while unknown
        fields = f"loss {metrics['loss']:.3f}"
        if "accuracy" in metrics:
            fields += f"  acc {metrics['accuracy']:.3f}"
        fields += f"  {metrics.get('tokens_per_sec', 0):,.0f} tok/s"
        if "mfu" in metrics:
            fields += f"  MFU {100 * metrics['mfu']:.1f}%"
        fields += f"  ETA {eta_text}"
        if self.tty:
            filled = int(self.width * step / max(self.total, 1))
            bar = "#" * filled + "." * (self.width - filled)
            self.stream.write(f"\r[{bar}] step {step}/{self.total}  {fields}\033[K")
        else:
            self.stream.write(f"step {step}/{self.total}  {fields}\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
