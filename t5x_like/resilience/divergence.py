"""Divergence rules beyond NaN: what the loop checks on every logged interval (a NaN or
Inf loss or gradient, a gradient norm stuck at 0, a loss spike), stopping the run before
anything of the bad steps is saved, with the checkpoints saved after the first bad step
moved aside; and the interval's logged record.
"""

from __future__ import annotations

import collections
import math
import statistics

import numpy as np


class Diverged(FloatingPointError):
    """The run stopped because a divergence rule fired; no checkpoint of the bad steps
    was written."""


class DivergenceMonitor:
    """Rules over per-step ``loss`` and ``grad_norm`` that catch a dead or exploding
    run which never produces a NaN:

    * ``zero_grad_steps`` N: the gradient norm is exactly 0 for N steps in a row (a
      model whose updates blew it to a constant, e.g. loss stuck at the uniform value
      ln(vocab_size) after a learning rate of 1e6);
    * ``loss_spike_factor`` k: a step's loss is above k times the median of the last
      ``median_window`` losses (after ``median_window // 2`` steps of history).
    """

    def __init__(self, zero_grad_steps: int, loss_spike_factor: float, median_window: int,
                 vocab_size: int):
        self.zero_grad_steps = zero_grad_steps
        self.loss_spike_factor = loss_spike_factor
        self.median_window = median_window
        self.uniform_loss = math.log(vocab_size) if vocab_size > 1 else 0.0
        self._zero_run = 0
        self._losses = collections.deque(maxlen=max(median_window, 1))

    def check(self, step: int, loss: float, grad_norm: float,
              no_signal: bool = False) -> tuple[str, int] | None:
        """``(why, first bad step)`` if the run has diverged by ``step``, else None. Call
        once per step, in order. ``no_signal``: a step with nothing to learn from by
        construction (online RL whose every group of completions got equal rewards: zero
        advantages, zero gradient), which the rules pass over."""
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return None  # the NaN/Inf rule (on_nonfinite_loss) owns these
        if no_signal:
            return None
        if self.zero_grad_steps:
            self._zero_run = self._zero_run + 1 if grad_norm == 0.0 else 0
            if self._zero_run >= self.zero_grad_steps:
                at_uniform = (f", the loss {loss:.4f} is the uniform-distribution value "
                              f"ln(vocab_size)={self.uniform_loss:.4f}"
                              if abs(loss - self.uniform_loss) < 1e-2 else f", loss {loss:.4f}")
                first = step - self._zero_run + 1
                return (f"the gradient norm has been exactly 0 for {self._zero_run} steps "
                        f"(steps {first}-{step}{at_uniform}): the model stopped learning "
                        "(divergence.zero_grad_steps)", first)
        if self.loss_spike_factor > 0 and len(self._losses) >= max(self.median_window // 2, 1):
            median = statistics.median(self._losses)
            if median > 0 and loss > self.loss_spike_factor * median:
                return (f"the loss {loss:.4f} at step {step} is above "
                        f"{self.loss_spike_factor:g} x the median {median:.4f} of the last "
                        f"{len(self._losses)} steps (divergence.loss_spike_factor)", step)
        self._losses.append(loss)
        return None


class StabilityChecks:
    """What the loop runs on every logged interval: a NaN/Inf loss or gradient stops the
    run (unless ``divergence.on_nonfinite_loss`` skips such updates), and so do the
    divergence rules; either way before anything of those steps is saved, with the
    checkpoints saved after the first bad step moved aside."""

    def __init__(self, spec, checkpointer):
        rules = spec.divergence
        self.skip_nonfinite = rules.on_nonfinite_loss == "skip_update"
        self.monitor = DivergenceMonitor(rules.zero_grad_steps, rules.loss_spike_factor,
                                         rules.median_window, spec.model.vocab_size)
        self.checkpointer = checkpointer

    def check(self, step: int, fetched: list[dict]) -> None:
        bad = first_nonfinite_step(fetched, step)
        if bad is not None and not self.skip_nonfinite:
            raise FloatingPointError(
                f"Train loss or gradient is NaN/Inf at step {bad}; stopping without saving. "
                f"{where_the_next_run_starts(self.checkpointer)} Lower "
                "optimizer.learning_rate or enable optimizer.grad_clip_norm, or set "
                "--config.divergence.on_nonfinite_loss=skip_update to skip such steps.")
        first = step - len(fetched) + 1
        for offset, m in enumerate(fetched):
            found = self.monitor.check(first + offset, float(m["loss"]), float(m["grad_norm"]),
                                       no_signal=float(m.get("groups_without_signal", 0.0)) >= 1.0)
            if found is not None:
                raise Diverged(self._stop(step, *found))

    def _stop(self, step: int, reason: str, first_bad_step: int) -> str:
        """Moves aside checkpoints saved at or after the first bad step (kept, not
        deleted), so the next run resumes from the last good one; returns the message."""
        moved = self.checkpointer.move_aside_from(first_bad_step,
                                                  f"saved after divergence: {reason}")
        aside = (f" Checkpoints saved after step {first_bad_step} were moved to "
                 f"{', '.join(str(p) for p in moved)}." if moved else "")
        return (f"Stopped at step {step}: {reason}. Nothing was saved.{aside} "
                f"{where_the_next_run_starts(self.checkpointer)} Lower optimizer.learning_rate "
                "(or set optimizer.grad_clip_norm), or tune the divergence.* rules if this was "
                "a false alarm.")


def where_the_next_run_starts(checkpointer) -> str:
    latest_good = checkpointer.latest_step()
    if latest_good is None:
        return "No checkpoint was saved before it; the next run starts from step 0."
    return (f"The last good checkpoint (step {latest_good}) in {checkpointer.directory} is "
            "intact and the next run resumes from it.")


def interval_record(fetched: list[dict]) -> dict:
    """Means over the steps since the last log; skipped (non-finite) steps are left out
    of the means and counted in ``skipped_updates``. A key some steps lack (a rollout's
    reward, logged by the step that sampled it and not by the later updates of its
    batch) is the mean over the steps that have it."""
    kept = [m for m in fetched if not m.get("skipped_updates", 0.0)] or fetched
    keys = dict.fromkeys(key for m in fetched for key in m)
    record = {}
    for key in keys:
        values = [m[key] for m in kept if key in m] or [m[key] for m in fetched if key in m]
        record[key] = float(np.mean(values))
    if "skipped_updates" in fetched[0]:
        record["skipped_updates"] = float(sum(m["skipped_updates"] for m in fetched))
    record["learning_rate"] = float(fetched[-1]["learning_rate"])
    if "batch_checksum" in fetched[0]:  # every step's batch counts, skipped or not
        record["batch_checksum"] = sum(int(m["batch_checksum"]) for m in fetched) % (2**24)
    return record


def first_nonfinite_step(fetched: list[dict], last_step: int) -> int | None:
    """The step number of the first fetched step with a NaN/Inf loss or gradient norm."""
    first = last_step - len(fetched) + 1
    for offset, m in enumerate(fetched):
        if not (math.isfinite(float(m["loss"])) and math.isfinite(float(m["grad_norm"]))):
            return first + offset
    return None
