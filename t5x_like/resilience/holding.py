"""What a training run holds while it trains, taken after every check and given back
however the run ends: the workdir lock (process 0), the hang watchdog, the goodput
record and the SIGTERM flag (``docs/training_engine.md``: one writer per workdir,
hangs, goodput, preemption)."""

from __future__ import annotations

import signal
import sys
import time

import jax

from t5x_like import errors
from t5x_like.engine import partitioning
from t5x_like.resilience import watchdog, workdir_lock
from t5x_like.telemetry import goodput_events


def chief_log(is_chief: bool):
    """Damage and takeover reports print even with --quiet: they say where checkpoints
    and locks went."""
    def log(line: str) -> None:
        if is_chief:
            print(line, file=sys.stderr, flush=True)
    return log


class PreemptionFlag:
    """Set by SIGTERM; the loop then saves a checkpoint and exits 0."""

    def __init__(self):
        self.requested = False
        self._previous = signal.signal(signal.SIGTERM, self._handler)

    def _handler(self, signum, frame):
        self.requested = True

    def restore(self):
        signal.signal(signal.SIGTERM, self._previous)


class RunHolding:
    """Enter: process 0 takes the workdir lock (or the run is refused, or takes over a
    stale one), every process learns the outcome and the run's agreed start time, the
    watchdog starts and goodput records the start. Exit: all of it given back, the
    goodput record closed with the run's status (``status``)."""

    def __init__(self, resolved, progress):
        self.resolved, self.progress = resolved, progress
        self.workdir = resolved.workdir
        self.is_chief = jax.process_index() == 0
        self.started = resolved.started or time.time()
        self.lock = None
        self.status = "error"
        self.preemption = PreemptionFlag()
        self.goodput = goodput_events.Recorder(self.workdir, enabled=False)
        self.watchdog = watchdog.HangWatchdog(0, None)

    def __enter__(self) -> RunHolding:
        try:
            self._take_workdir()
            self.goodput = goodput_events.Recorder(self.workdir, self.is_chief, self.started)
            self._start_watchdog()
        except BaseException:
            self._release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._release()

    def _take_workdir(self) -> None:
        outcome, failure = {"started": self.started}, None
        if self.is_chief:
            lock = workdir_lock.WorkdirLock(self.workdir,
                                            self.resolved.spec.resilience.lock_stale_after_s,
                                            log=chief_log(True))
            try:
                lock.acquire()
                self.lock = lock
            except Exception as e:  # noqa: BLE001  (told to the others, then raised here)
                failure = e
                outcome = {"refused": str(e) if isinstance(e, errors.UserError) else
                           f"process 0 could not take the workdir lock ({type(e).__name__}: {e})"}
        outcome = partitioning.gather_json(outcome)[0]
        if failure is not None:
            raise failure
        if "refused" in outcome:
            raise workdir_lock.WorkdirBusy(outcome["refused"])
        self.started = outcome["started"]
        if self.lock is not None:
            self.lock.start_heartbeat()

    def _start_watchdog(self) -> None:
        """``hang_timeout_s`` resolved for the platform; the hang folder is named after the
        run's start; a hang releases the workdir lock before the process exits."""
        resolved = self.resolved
        resilience = resolved.spec.resilience
        timeout = watchdog.resolve_timeout(resilience.hang_timeout_s,
                                           resolved.devices[0].platform)
        self.watchdog = watchdog.HangWatchdog(
            timeout, self.workdir / "hangs" / watchdog.utc_stamp(self.started),
            jax.process_index(), jax.process_count(), log=chief_log(True),
            before_exit=self._on_hang, first_step_timeout_s=resilience.first_step_timeout_s)
        if timeout > 0:
            self.progress.message(f"Hang watchdog: {timeout:g} s without a finished step, "
                                  "evaluation or checkpoint save "
                                  f"({self.watchdog.first_step_timeout_s:g} s for the "
                                  "first, which compiles) stops the run (exit "
                                  f"{watchdog.HANG_EXIT_CODE}).")
        self.watchdog.start()

    def check_still_ours(self, step: int) -> None:
        """Before a save: a run whose lock another train took over (its heartbeat stalled
        past lock_stale_after_s) stops instead of writing over the new owner's checkpoints."""
        check_still_ours(self.lock, step)

    def _on_hang(self) -> None:
        """The watchdog's last act before the process exits 75."""
        self.goodput.close("hang")
        if self.lock is not None:
            self.lock.release()

    def _release(self) -> None:
        self.watchdog.stop()
        self.goodput.close("end", status=self.status)
        self.preemption.restore()
        if self.lock is not None:
            self.lock.release()


def check_still_ours(lock, step: int) -> None:
    if lock is not None and lock.lost:
        raise errors.UserError(
            f"Stopped at step {step} without saving: the workdir lock {lock.file} was taken "
            f"over ({lock.lost}) while this run's heartbeat was late. The other train now "
            "owns the workdir; raise resilience.lock_stale_after_s if this run was only slow.")
