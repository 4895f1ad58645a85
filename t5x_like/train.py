"""Pretraining entry point.

    python -m t5x_like.train --config=configs/quickstart.py --workdir=/tmp/run \
        [--config.num_train_steps=500 --config.batch_size=32 ...]

Writes ``metrics.jsonl``, TensorBoard events, orbax checkpoints and the resolved
config under ``--workdir``, and resumes from the newest checkpoint found there.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import math
import shlex
import signal
import sys
import time
from typing import Any

from t5x_like import cli_flags, config_lib, errors, runs, storage

USAGE = ("python -m t5x_like.train --config=FILE --workdir=DIR [--config.KEY=VALUE ...]\n"
         "  e.g. python -m t5x_like.train --config=configs/quickstart.py --workdir=/tmp/t5x_like_run "
         "--config.num_train_steps=100")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Splits ``--config.key=value`` overrides from the other flags."""
    parser = argparse.ArgumentParser(prog="python -m t5x_like.train", usage=USAGE,
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="Python config file with get_config().")
    parser.add_argument("--workdir", required=True,
                        help="Output directory; an existing run there is resumed.")
    parser.add_argument("--quiet", action="store_true", help="No progress output.")
    cli_flags.add_module_flag(parser)
    cli_flags.add_multi_process_flags(parser)
    rest, overrides = config_lib.split_overrides(argv)
    return parser.parse_args(rest), overrides


class _PreemptionFlag:
    """Set by SIGTERM; the loop then saves a checkpoint and exits 0."""

    def __init__(self):
        self.requested = False
        self._previous = signal.signal(signal.SIGTERM, self._handler)

    def _handler(self, signum, frame):
        self.requested = True

    def restore(self):
        signal.signal(signal.SIGTERM, self._previous)


def _restore_for_resume(checkpointer, config, trainer, fingerprint: dict, step: int):
    """One checkpoint step, checked against this run's fingerprint, restored onto the
    trainer: ``(saved config, state, data state or None, changed keys)``. Refusals are
    ``ConfigError``s (not damage); any other exception means the step is unreadable."""
    import jax

    from t5x_like import checkpoints, run_guard
    from t5x_like import trainer as trainer_lib

    where = str(checkpointer.step_folder(step))
    saved = checkpointer.restore_config(step)
    if not isinstance(saved, dict):
        raise ValueError(f"config item is {type(saved).__name__}, not a JSON object")
    changed = run_guard.check_resume(saved, fingerprint, config.allow_resume_changes)
    config_lib.resolve_data_streams(config, jax.process_count(), saved)
    try:
        if any(key.startswith("optimizer.") for key in changed):
            # An intended optimizer change: the params and step carry over, the optimizer
            # state starts fresh (restored first in the layout it was saved in).
            saved_config = checkpoints.config_from_saved(saved)
            saved_trainer = trainer_lib.build_trainer(saved_config, trainer.mesh)
            old, data_state = checkpoints.restore_state(checkpointer, step, saved_trainer, saved,
                                                 saved_config, where)
            state = trainer.state_from_params(jax.device_get(old.params)).replace(step=old.step)
        else:
            state, data_state = checkpoints.restore_state(checkpointer, step, trainer, saved, config,
                                                   where)
    except errors.UserError:
        raise  # a refusal (the PEFT base is gone or changed), not damage
    except Exception as e:  # noqa: BLE001
        model_changes = [k for k in changed if k.startswith(("model.", "head.", "peft."))]
        if model_changes:  # not damage: the allowed change does not fit the saved arrays
            from t5x_like.checkpointing import one_line
            raise errors.ConfigError(
                f"allow_resume_changes lets {', '.join(model_changes)} change, but the "
                f"checkpoint's arrays do not fit the changed model ({one_line(e)}). Only "
                "changes that keep every parameter's shape can resume; use a new --workdir "
                "with init_from to start from these weights otherwise.") from None
        raise
    if any(key.split(".")[0] in ("task", "task_feature_lengths", "vocabulary")
           for key in changed):
        data_state = None  # another input stream: it starts from its beginning
    return saved, state, data_state, changed


def _pretrained_state(config, trainer):
    """``(step-0 state, PEFT base identity or None)`` from pretrained params, for
    fine-tuning or continued pretraining: a params-only folder (``convert import``), or a
    training workdir / checkpoint step (its newest step's params; the optimizer state is
    left behind). What the base lacks starts fresh: a new head, LoRA and adapters."""
    import jax
    from flax import traverse_util

    from t5x_like import checkpoints, structures
    from t5x_like.checkpoints import peft_state
    from t5x_like.models import peft as peft_modules

    params, step = checkpoints.base_params(config.init_from, config, trainer.mesh)
    identity = (peft_state.base_identity(config.init_from, step, params)
                if peft_state.saves_partial(config) else None)
    if "backbone" in trainer.abstract_state.params and "backbone" not in params:
        params = {"backbone": params}  # a pretrained body under a new head
    expected = traverse_util.flatten_dict(peft_modules.plain_dicts(trainer.abstract_state.params))
    given = traverse_util.flatten_dict(peft_modules.plain_dicts(params))
    if config.head.kind:
        given = structures.structure_class(config.model.family).body_params_for_head(given)
    missing = [key for key in expected if key not in given]
    if missing and all(key[0] == "head" or peft_modules.is_peft_param(key) for key in missing):
        fresh = traverse_util.flatten_dict(peft_modules.plain_dicts(jax.device_get(
            trainer.init_state(config.seed).params)))
        given.update(peft_modules.prompts_from_table({key: fresh[key] for key in missing},
                                                     given))
        params = traverse_util.unflatten_dict(given)
    try:
        return trainer.state_from_params(params), identity
    except ValueError as e:
        raise errors.ConfigError(f"init_from={config.init_from!r}: {e}") from None


def _print_on_chief(is_chief: bool):
    """Damage reports print even with --quiet: they say where checkpoints went."""
    def log(line: str) -> None:
        if is_chief:
            print(line, file=sys.stderr, flush=True)
    return log


def run(config, workdir: str, config_path: str = "CONFIG", quiet: bool = False,
        devices=None, overrides: list[str] = (), modules: list[str] = ()) -> dict:
    """Trains to ``config.num_train_steps``; returns the last train and eval metrics.

    Set-up (``_set_up``: every check, then the model, checkpoints, data and state), then
    the loop: a step, then whichever hooks are due (``_Hooks``: logging with the
    divergence checks and evaluations, checkpoints, preemption). ``devices`` defaults to
    all devices; tests pass a subset to compare meshes.
    """
    import jax  # imported late: config mistakes are reported before JAX starts

    from t5x_like import goodput_events, partitioning, watchdog

    held = _Held()
    hooks = None
    status = "error"
    try:
        r = _set_up(config, workdir, quiet, devices, held)
        hooks = _Hooks(r)
        # Goodput events (process 0): the run's start, its set-up, then a record per log.
        gp = held.goodput = hooks.goodput = goodput_events.Recorder(r.workdir, r.is_chief,
                                                                    held.started)
        gp.event("setup", restore_s=round(r.restore_s, 6), resumed_from=hooks.start_step)
        watch = hooks.watchdog = _watchdog(r, held)
        watch.start()
        step, pending, preempted = hooks.start_step, [], False
        while step < config.num_train_steps:
            watch.doing("reading the batch of step", step + 1)
            with gp.timed("data"):
                batch = partitioning.global_batch(next(r.train_iter), r.mesh)
            compiling = step == hooks.start_step
            watch.doing("train step (compiling)" if compiling else "train step", step + 1,
                        watchdog.COMPILE_PATIENCE if compiling else 1.0)
            if compiling:  # dispatching the first step waits for its compilation
                with gp.timed("compile"):
                    r.state, metrics = r.trainer.train_step(r.state, batch)
            else:
                r.state, metrics = r.trainer.train_step(r.state, batch)
            step += 1
            watch.done("train step", step)
            pending.append(metrics)
            hooks.interval_steps += 1
            do_eval, do_checkpoint, do_bench = hooks.due(step)
            preempted = hooks.preemption_agreed(step, do_checkpoint)
            do_log = (step % config.log_every_steps == 0 or step == hooks.start_step + 1
                      or do_eval or do_bench or preempted)
            if do_log or do_checkpoint:
                watch.doing("fetching the metrics of step", step)
                hooks.log(step, jax.device_get(pending), do_eval, do_bench)
                gp.steps(step)
                pending = []
            if do_checkpoint or preempted:
                _check_still_ours(held.lock, step)
                with gp.timed("checkpoint_save"):
                    hooks.checkpoint(step, force=preempted)
            if preempted:
                r.progress.message(f"SIGTERM received: saved a checkpoint at step {step}, "
                                   "exiting.")
                break
        status = "preempted" if preempted else "done"
    finally:
        try:
            if hooks is not None:
                with hooks.goodput.timed("checkpoint_save"):
                    hooks.close()  # waits for the last checkpoint save, watched for a hang
        finally:
            held.release(status)
    if r.is_chief:
        account = goodput_events.account(goodput_events.read_events(r.workdir))
        goodput_events.write_tensorboard(r.workdir, account, step)
        if not quiet:
            print(_summary(r.workdir, r.checkpointer.latest_step(), hooks.last_train,
                           hooks.last_eval, config_path, config, overrides, modules),
                  flush=True)
            print(goodput_events.one_line(account), flush=True)
    return {"train": hooks.last_train, "eval": hooks.last_eval, "step": step}


class _Held:
    """What a run holds while it trains and gives back however it ends: the workdir lock
    (process 0) and the hang watchdog; ``started``: the run's start, agreed by every
    process (it names the run's hang folder)."""

    def __init__(self):
        self.lock = None
        self.watchdog = None
        self.goodput = None
        self.started = time.time()

    def release(self, status: str) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.goodput is not None:
            self.goodput.close("end", status=status)
        if self.lock is not None:
            self.lock.release()

    def on_hang(self) -> None:
        """The watchdog's last act before the process exits 75."""
        if self.goodput is not None:
            self.goodput.close("hang")
        if self.lock is not None:
            self.lock.release()


def _take_workdir(config, workdir, process_index: int, held: _Held) -> None:
    """Process 0 takes the workdir lock (or is refused, or takes over a stale one) before
    anything expensive; the other processes learn its outcome and its start time, so a
    refusal stops every process with the same message."""
    from t5x_like import partitioning, workdir_lock
    outcome, failure = {"started": held.started}, None
    if process_index == 0:
        lock = workdir_lock.WorkdirLock(workdir, config.lock_stale_after_s,
                                        log=_print_on_chief(True))
        try:
            lock.acquire()
            held.lock = lock
        except Exception as e:  # noqa: BLE001  (told to the others, then raised here)
            failure = e
            outcome = {"refused": str(e) if isinstance(e, errors.UserError) else
                       f"process 0 could not take the workdir lock ({type(e).__name__}: {e})"}
    outcome = partitioning.gather_json(outcome)[0]
    if failure is not None:
        raise failure
    if "refused" in outcome:
        raise workdir_lock.WorkdirBusy(outcome["refused"])
    held.started = outcome["started"]
    if held.lock is not None:
        held.lock.start_heartbeat()


def _check_still_ours(lock, step: int) -> None:
    """Before a save: a run whose lock another train took over (its heartbeat stalled past
    lock_stale_after_s) stops instead of writing over the new owner's checkpoints."""
    if lock is not None and lock.lost:
        raise errors.UserError(
            f"Stopped at step {step} without saving: the workdir lock {lock.file} was taken "
            f"over ({lock.lost}) while this run's heartbeat was late. The other train now "
            "owns the workdir; raise lock_stale_after_s if this run was only slow.")


def _watchdog(r, held: _Held):
    """``hang_timeout_s`` resolved for the platform; the hang folder is named after the
    run's start; a hang releases the workdir lock before the process exits."""
    from t5x_like import watchdog
    timeout = watchdog.resolve_timeout(r.config.hang_timeout_s, r.devices[0].platform)
    held.watchdog = watchdog.HangWatchdog(
        timeout, r.workdir / "hangs" / watchdog.utc_stamp(held.started), r.process_index,
        r.process_count, log=_print_on_chief(True),
        before_exit=held.on_hang)
    if timeout > 0:
        r.progress.message(f"Hang watchdog: {timeout:g} s without a finished step, "
                           f"evaluation or checkpoint save stops the run (exit "
                           f"{watchdog.HANG_EXIT_CODE}).")
    return held.watchdog


@dataclasses.dataclass
class _Run:
    """What the loop works on, built and checked by ``_set_up`` before the first step."""

    config: Any
    workdir: Any
    devices: list
    mesh_shape: dict
    mesh: Any
    trainer: Any
    structure: Any
    progress: Any
    process_index: int
    process_count: int
    asked_vocabulary: Any
    run_config: dict
    num_streams: int
    train_streams: Any
    eval_streams: Any
    checkpointer: Any = None
    num_eval_batches: int = 0  # 0: no held-out evaluation
    eval_padding: dict | None = None
    train_iter: Any = None
    state: Any = None
    peft_base: dict | None = None  # a PEFT run from a base on disk saves only what trains
    harness_tasks: list | None = None  # lm-eval's loaded tasks (config.eval.harness_tasks)
    restore_s: float = 0.0  # seconds set-up spent finding and restoring the checkpoint

    @property
    def is_chief(self) -> bool:
        return self.process_index == 0

    def host_batches(self, streams, padding=None):
        """This process's rows of each global batch, from its V/P of the V input streams
        (t5x_like/data/streams.py), so batches depend on V only; with ``padding``, a
        one-pass read whose short batches are padded."""
        from t5x_like.data import pipeline
        return pipeline.HostBatchIterator(streams, self.config.batch_size, self.num_streams,
                                          self.process_count, self.process_index, padding)


def _set_up(config, workdir, quiet: bool, devices, held: _Held) -> _Run:
    """Every check before anything trains, then the model, optimizer and mesh (shapes only,
    nothing compiled) before the checkpoint is read, so a resume is checked against this
    run's fingerprint; then the checkpoints, the input streams and the state."""
    import jax

    from t5x_like import metrics_writer, run_guard, structures
    from t5x_like import trainer as trainer_lib
    from t5x_like.data import get_task_or_mixture, pipeline

    runs.resolve_head_labels(config)
    process_index, process_count = jax.process_index(), jax.process_count()
    if config.checkpoint.local_dir and process_count > 1:
        raise errors.ConfigError(
            f"checkpoint.local_dir is single-process for now ({process_count} processes: each "
            "host's disk would hold only its own shards); leave it empty to save to the "
            "workdir.")
    devices = jax.devices() if devices is None else list(devices)
    workdir = storage.path(workdir)
    progress = metrics_writer.Progress(config.num_train_steps,
                                       enabled=process_index == 0 and not quiet)
    asked_vocabulary = runs.run_vocabulary(config)
    vocabulary = asked_vocabulary or get_task_or_mixture(config.task).vocabulary
    runs.check_model_fits_vocabulary(config, vocabulary)
    runs.check_task_steps(config, asked_vocabulary)
    if config.eval.mixture:
        from t5x_like.evaluation import evaluator
        evaluator.check_metrics_installed(evaluator.leaf_tasks(config.eval.mixture))
    harness = _harness_tasks(config)
    _take_workdir(config, workdir, process_index, held)  # before anything is built or read
    mesh_shape, trainer = trainer_lib.build_on_devices(config, devices, process_count)
    mesh = trainer.mesh
    fingerprint = run_guard.fingerprint(config, vocabulary, trainer.abstract_state.opt_state)
    teacher_params = _attach_teacher(config, trainer, mesh, vocabulary)
    began = time.monotonic()
    checkpointer, resumed = _resume_point(config, workdir, trainer, fingerprint,
                                          process_index == 0)
    restore_s = time.monotonic() - began
    saved_config = resumed.value[0] if resumed else None
    num_streams = config_lib.resolve_data_streams(config, process_count, saved_config)
    lengths = dict(config.task_feature_lengths)
    structure = structures.for_config(config)
    data_options = {"feature_converter": structure.feature_converter(lengths, pack=config.pack),
                    "seed": config.seed, "vocabulary": asked_vocabulary}
    r = _Run(config, workdir, devices, mesh_shape, mesh, trainer, structure, progress,
             process_index, process_count, asked_vocabulary,
             # saved with every checkpoint: the resolved stream count and the fingerprint
             run_config=dict(config.to_dict(), data_streams=num_streams, fingerprint=fingerprint),
             num_streams=num_streams,
             train_streams=functools.partial(pipeline.build_dataset, config.task, "train",
                                             lengths, shuffle=True, **data_options),
             eval_streams=functools.partial(pipeline.build_dataset, config.task, "validation",
                                            lengths, shuffle=False, repeat=False,
                                            **data_options))
    r.harness_tasks, r.restore_s = harness, restore_s
    _plan_held_out(r)
    # The checkpoint folder is created only once the config has passed every check.
    r.checkpointer = checkpointer or _open_checkpointer(config, workdir, r.is_chief)
    if asked_vocabulary is not None and r.is_chief:
        runs.keep_tokenizer(workdir, asked_vocabulary)
    r.train_iter = r.host_batches(r.train_streams)
    _initial_state(r, resumed, saved_config, teacher_params)
    _announce(r)
    return r


def _plan_held_out(r: _Run) -> None:
    """Held-out evaluation reads the validation split once, every example, its last
    batch filled with padding rows (weighed 0); every process runs the same number of
    batches, the most any process has. Off, said once, with ``eval_every_steps=0`` or
    when a task has no validation examples."""
    import numpy as np

    from t5x_like import partitioning
    from t5x_like.data import dataset_providers, get_task_or_mixture, pipeline
    config = r.config
    if config.eval_every_steps == 0:
        r.progress.message("Held-out evaluation is off (eval_every_steps=0).")
        return
    missing = dataset_providers.missing_validation(get_task_or_mixture(config.task))
    if missing:
        r.progress.message(f"Held-out evaluation is off: {'; '.join(missing)}.")
        return
    first_row = next(iter(r.eval_streams(shard_index=0, num_shards=r.num_streams)))
    r.eval_padding = {key: np.zeros_like(value) for key, value in first_row.items()}
    r.num_eval_batches = partitioning.max_over_processes(pipeline.count_batches(
        r.host_batches(r.eval_streams, r.eval_padding), limit=config.eval_batches))


def _attach_teacher(config, trainer, mesh, vocabulary):
    """Distillation's teacher, checked before any checkpoint is touched and placed in the
    train step; its host params (for the student's start), or None without a teacher."""
    from t5x_like import distill, structures
    if not distill.enabled(config):
        return None
    teacher, teacher_params = distill.load_teacher(config, mesh, vocabulary)
    trainer.attach_teacher(teacher.model, teacher_params, distill.make_loss_fn(
        structures.for_config(config), teacher, config.loss, config.distill))
    return teacher_params


def _open_checkpointer(config, workdir, is_chief: bool):
    from t5x_like import checkpointing
    return checkpointing.Checkpointer(workdir / "checkpoints", keep=config.keep_checkpoints,
                                      keep_every=config.keep_checkpoints_every_steps,
                                      log=_print_on_chief(is_chief),
                                      local_dir=config.checkpoint.local_dir or None)


def _resume_point(config, workdir, trainer, fingerprint: dict, is_chief: bool):
    """``(checkpointer or None, the newest step that restores or None)``: damaged newer
    steps are moved aside."""
    from t5x_like import checkpointing
    local = config.checkpoint.local_dir
    if not ((workdir / "checkpoints").is_dir() or (local and checkpointing.local_tier(
            local, workdir / "checkpoints").is_dir())):
        return None, None
    checkpointer = _open_checkpointer(config, workdir, is_chief)
    return checkpointer, checkpointer.restore_newest(functools.partial(
        _restore_for_resume, checkpointer, config, trainer, fingerprint))


def _initial_state(r: _Run, resumed, saved_config, teacher_params) -> None:
    """The state the loop starts from: resumed, fine-tuned from ``init_from``, a
    distillation student from its teacher's layers, or a fresh init."""
    from t5x_like import distill
    from t5x_like.checkpoints import peft_state

    config, trainer, progress = r.config, r.trainer, r.progress
    if resumed is not None:
        _, r.state, data_state, changed = resumed.value
        r.peft_base = saved_config.get(peft_state.IDENTITY_KEY)
        if data_state is not None:
            try:
                r.train_iter.set_state(data_state)
            except ValueError as e:
                raise errors.ConfigError(str(e)) from None
        if changed:
            progress.message(f"Resuming with intended changes (allow_resume_changes): "
                             f"{', '.join(changed)}"
                             + ("; the input stream starts over" if data_state is None else ""))
        progress.message(f"Resumed from {r.checkpointer.step_folder(resumed.step)} at step "
                         f"{resumed.step}.")
    elif config.init_from:
        r.state, r.peft_base = _pretrained_state(config, trainer)
        progress.message(f"Initialised params from {config.init_from} (optimizer state fresh).")
    elif teacher_params is not None and config.distill.student_init == "teacher_layers":
        r.state = trainer.state_from_params(distill.student_from_teacher(
            teacher_params, trainer.abstract_state.params))
        progress.message(f"Student initialised from the teacher {config.distill.teacher} "
                         "(evenly spaced layers).")
    else:
        r.state = trainer.init_state(config.seed)
    if r.peft_base:
        r.run_config[peft_state.IDENTITY_KEY] = r.peft_base


def _announce(r: _Run) -> None:
    """The resolved config in the workdir, and one line on what will run."""
    from t5x_like import trainer as trainer_lib
    from t5x_like.checkpoints import peft_state
    if not r.is_chief:
        return
    r.workdir.mkdir(parents=True, exist_ok=True)
    (r.workdir / "config.json").write_text(json.dumps(r.run_config, indent=2, default=list))
    trains = ""
    if r.trainer.trainable is not None:
        count = trainer_lib.param_count(peft_state.trainable_only(r.state.params,
                                                                  r.trainer.trainable))
        trains = f" ({count:,} trainable)"
    r.progress.message(
        f"t5x_like: {trainer_lib.param_count(r.state.params):,} parameters{trains}, "
        f"mesh {r.mesh_shape}, {len(r.devices)} {r.devices[0].platform} devices, "
        f"steps {int(r.state.step)} -> {r.config.num_train_steps}, workdir {r.workdir}")


class _Hooks:
    """What the loop does besides stepping, each when it is due: logging (interval means,
    throughput, MFU) with the NaN and divergence checks, held-out and benchmark
    evaluation, checkpoints, and agreeing on a SIGTERM across processes."""

    def __init__(self, r: _Run):
        from t5x_like import hardware, metrics_writer, run_guard
        config = r.config
        self.r = r
        self.writer = metrics_writer.MetricsWriter(r.workdir, enabled=r.is_chief)
        self.preemption = _PreemptionFlag()
        lengths = dict(config.task_feature_lengths)
        self.tokens_per_step = config.batch_size * sum(lengths.values())
        self.flops_per_step = 3.0 * r.structure.forward_flops_per_sequence(
            config.model.to_dict(), lengths) * config.batch_size
        self.peak = hardware.peak_flops(r.devices[0].device_kind, config.peak_flops_per_device)
        self.divergence = run_guard.DivergenceMonitor(
            config.divergence.zero_grad_steps, config.divergence.loss_spike_factor,
            config.divergence.median_window, config.model.vocab_size)
        self.benchmark = (_benchmark_evaluator(config, r.trainer, r.asked_vocabulary)
                          if config.eval.mixture else None)
        self.harness = _harness_model(r) if r.harness_tasks else None
        self.bench_every = config.eval.every_steps or config.eval_every_steps  # 0: at the end
        self.start_step = int(r.state.step)
        self.last_train, self.last_eval = {}, {}
        self.interval_start, self.interval_steps = time.monotonic(), 0
        from t5x_like import goodput_events, watchdog
        # Off until run() sets the real ones.
        self.watchdog = watchdog.HangWatchdog(0, None)
        self.goodput = goodput_events.Recorder(r.workdir, enabled=False)

    def due(self, step: int) -> tuple[bool, bool, bool]:
        """``(held-out evaluation, checkpoint, benchmark)`` due at ``step``."""
        config = self.r.config
        is_last = step == config.num_train_steps
        return (self.r.num_eval_batches > 0 and (step % config.eval_every_steps == 0 or is_last),
                step % config.checkpoint_every_steps == 0 or is_last,
                (self.benchmark is not None or self.harness is not None) and (is_last or (
                    self.bench_every > 0 and step % self.bench_every == 0)))

    def preemption_agreed(self, step: int, do_checkpoint: bool) -> bool:
        """One process alone may get SIGTERM: processes agree at log and checkpoint steps
        (a cheap all-gather), so they save and stop at the same step."""
        from t5x_like import partitioning
        if self.r.process_count == 1:
            return self.preemption.requested
        if step % self.r.config.log_every_steps == 0 or do_checkpoint:
            return partitioning.any_process(self.preemption.requested)
        return False

    def log(self, step: int, fetched: list[dict], do_eval: bool, do_bench: bool) -> None:
        from t5x_like import flops
        elapsed = time.monotonic() - self.interval_start
        record = _interval_record(fetched)
        record["tokens_per_sec"] = self.tokens_per_step * self.interval_steps / max(elapsed, 1e-9)
        record["steps_per_sec"] = self.interval_steps / max(elapsed, 1e-9)
        if self.peak:
            record["mfu"] = flops.mfu(self.flops_per_step, record["steps_per_sec"],
                                      len(self.r.devices), self.peak)
        self.check_stable(step, fetched)
        params = self.r.trainer.evaluation_params(self.r.state) if do_eval or do_bench else None
        watch = self.watchdog
        if do_eval:
            watch.doing("held-out evaluation at step", step)
            with self.goodput.timed("evaluation"):
                self.last_eval = self.evaluate(params)
            record.update(self.last_eval)
            watch.done("held-out evaluation at step", step)
        if do_bench and self.benchmark is not None:
            watch.doing("benchmark evaluation at step", step)
            with self.goodput.timed("evaluation"):
                record.update(self.evaluate_benchmark(params, step))
            watch.done("benchmark evaluation at step", step)
        if do_bench and self.harness is not None:
            watch.doing("lm-evaluation-harness at step", step)
            with self.goodput.timed("evaluation"):
                record.update(self.evaluate_harness(params, step))
            watch.done("lm-evaluation-harness at step", step)
        self.last_train = record
        progress = self.r.progress
        if step == self.start_step + 1:
            progress.message(f"first step (compilation included) took {elapsed:.1f} s")
        self.writer.write(step, record)
        progress.update(step, record)
        if do_eval:
            progress.message(f"step {step}: held-out loss {self.last_eval['eval_loss']:.4f}, "
                             f"accuracy {self.last_eval['eval_accuracy']:.3f}")
        self.interval_start, self.interval_steps = time.monotonic(), 0

    def check_stable(self, step: int, fetched: list[dict]) -> None:
        """Stops on a NaN/Inf loss or gradient (unless such steps are skipped) and on the
        divergence rules, before anything of those steps is saved."""
        from t5x_like import run_guard
        checkpointer = self.r.checkpointer
        bad = _first_nonfinite_step(fetched, step)
        if bad is not None and self.r.config.on_nonfinite_loss == "stop":
            raise FloatingPointError(
                f"Train loss or gradient is NaN/Inf at step {bad}; stopping without saving. "
                f"{_where_the_next_run_starts(checkpointer)} "
                "Lower optimizer.learning_rate or enable optimizer.grad_clip_norm, or set "
                "--config.on_nonfinite_loss=skip_update to skip such steps.")
        first = step - len(fetched) + 1
        for offset, m in enumerate(fetched):
            found = self.divergence.check(first + offset, float(m["loss"]), float(m["grad_norm"]))
            if found is not None:
                raise run_guard.Diverged(_stop_diverged(checkpointer, step, *found))

    def evaluate(self, params) -> dict:
        """Held-out loss and accuracy (and the objective's other sums) over the validation
        batches every process agreed on."""
        import jax

        from t5x_like import partitioning
        eval_iter = self.r.host_batches(self.r.eval_streams, self.r.eval_padding)
        totals = None
        for _ in range(self.r.num_eval_batches):
            local = next(eval_iter, None)  # None: this process's streams have ended
            batch = partitioning.global_batch(
                eval_iter.padding_batch() if local is None else local, self.r.mesh)
            out = self.r.trainer.eval_step(params, batch)
            totals = out if totals is None else jax.tree.map(lambda a, b: a + b, totals, out)
        totals = jax.device_get(totals)
        tokens = max(float(totals["num_target_tokens"]), 1.0)
        others = {f"eval_{name[:-len('_sum')]}": float(value) / tokens
                  for name, value in totals.items()
                  if name.endswith("_sum") and name not in ("loss_sum", "correct_sum")}
        return {"eval_loss": float(totals["loss_sum"]) / tokens,
                "eval_accuracy": float(totals["correct_sum"]) / tokens, **others}

    def evaluate_benchmark(self, params, step: int) -> dict:
        from t5x_like.evaluation import evaluator as evaluator_lib
        from t5x_like.evaluation import results as result_files
        results = self.benchmark.evaluate(params)
        self.r.progress.message(result_files.format_table(step, results))
        record = {f"bench/{res.task}/{k}": v for res in results for k, v in res.metrics.items()}
        mean = evaluator_lib.average(results)
        if mean is not None:
            record["bench/average"] = mean
        return record

    def evaluate_harness(self, params, step: int) -> dict:
        """lm-evaluation-harness tasks on the training params (Levanter's in-loop harness):
        ``harness/<task>/<metric>`` in the metrics file, lm-eval's table on the console."""
        from t5x_like.evaluation import harness_tasks
        config = self.r.config
        self.harness.loaded.params = params
        fewshot = config.eval.harness_num_fewshot
        out = harness_tasks.evaluate(self.harness, self.r.harness_tasks,
                                     num_fewshot=None if fewshot < 0 else fewshot,
                                     limit=config.eval.harness_limit)
        self.r.progress.message(f"step {step}: lm-evaluation-harness\n"
                                f"{harness_tasks.format_table(out)}")
        return harness_tasks.scalars(out)

    def checkpoint(self, step: int, force: bool = False) -> None:
        """Each process holds its own streams' states; process 0 writes the merged one."""
        from t5x_like import partitioning
        from t5x_like.checkpoints import peft_state
        from t5x_like.data import pipeline
        r = self.r
        data_state = pipeline.merge_states(partitioning.gather_json(r.train_iter.get_state()))
        saved_state = peft_state.saved_view(r.state, r.trainer) if r.peft_base else r.state
        self.watchdog.doing("checkpoint save at step", step)
        r.checkpointer.save(step, saved_state, data_state, r.run_config, force=force)
        self.watchdog.done("checkpoint save at step", step)

    def close(self) -> None:
        self.watchdog.doing("closing: waiting for the last checkpoint save")
        self.r.checkpointer.close()
        self.writer.close()
        self.r.progress.close()
        self.preemption.restore()


def _benchmark_evaluator(config, trainer, vocabulary=None):
    """``config.eval``: the benchmark evaluator run inside training, on the run's mesh,
    its tasks in the run's vocabulary (``config.vocabulary``, resolved once by ``run``)."""
    from t5x_like.evaluation import evaluator, runner
    lengths = dict(config.task_feature_lengths)
    settings = evaluator.EvalSettings(
        split=config.eval.split, max_examples=config.eval.max_examples,
        batch_size=config.eval.batch_size or config.batch_size,
        max_decode_length=config.eval.max_decode_length, seed=config.seed)
    try:
        return runner.build_evaluator(config, trainer, config.eval.mixture, settings, lengths,
                                        vocabulary)
    except errors.UserError as e:
        raise errors.ConfigError(f"eval.mixture={config.eval.mixture!r}: {e}") from None


def _harness_tasks(config) -> list | None:
    """``config.eval.harness_tasks`` found and their datasets loaded, before anything
    compiles (a decoder only: the harness scores language models)."""
    if not config.eval.harness_tasks:
        return None
    from t5x_like.evaluation import harness_tasks
    harness_tasks.check_decoder(config, "eval.harness_tasks", "Use eval.mixture for its tasks.")
    harness_tasks.check_installed("eval.harness_tasks")
    names = harness_tasks.task_names(config.eval.harness_tasks, "--config.eval.harness_tasks")
    return harness_tasks.load(names, config.eval.harness_include_path)


def _harness_model(r: _Run):
    """The harness's ``t5x_like`` model over the run's mesh and vocabulary; its params
    are the training params of the step being evaluated."""
    from t5x_like.data import get_task_or_mixture
    from t5x_like.evaluation import harness_model
    config = r.config
    vocabulary = r.asked_vocabulary or get_task_or_mixture(config.task).vocabulary
    loaded = harness_model.from_params(config, r.trainer, None, vocabulary, 0,
                                       config.eval.batch_size, config.seed, "training")
    return harness_model.T5xLikeLM(loaded=loaded,
                                   max_gen_toks=config.eval.harness_max_gen_toks)


def _stop_diverged(checkpointer, step: int, reason: str, first_bad_step: int) -> str:
    """Moves aside checkpoints saved at or after the first bad step (kept, not
    deleted), so the next run resumes from the last good one; returns the message."""
    moved = checkpointer.move_aside_from(first_bad_step, f"saved after divergence: {reason}")
    aside = (f" Checkpoints saved after step {first_bad_step} were moved to "
             f"{', '.join(str(p) for p in moved)}." if moved else "")
    return (f"Stopped at step {step}: {reason}. Nothing was saved.{aside} "
            f"{_where_the_next_run_starts(checkpointer)} Lower optimizer.learning_rate (or set "
            "optimizer.grad_clip_norm), or tune the divergence.* rules if this was a false "
            "alarm.")


def _where_the_next_run_starts(checkpointer) -> str:
    latest_good = checkpointer.latest_step()
    if latest_good is None:
        return "No checkpoint was saved before it; the next run starts from step 0."
    return (f"The last good checkpoint (step {latest_good}) in {checkpointer.directory} is "
            "intact and the next run resumes from it.")


def _interval_record(fetched: list[dict]) -> dict:
    """Means over the steps since the last log; skipped (non-finite) steps are left out
    of the means and counted in ``skipped_updates``."""
    import numpy as np

    kept = [m for m in fetched if not m.get("skipped_updates", 0.0)] or fetched
    record = {key: float(np.mean([m[key] for m in kept])) for key in fetched[0]}
    if "skipped_updates" in fetched[0]:
        record["skipped_updates"] = float(sum(m["skipped_updates"] for m in fetched))
    record["learning_rate"] = float(fetched[-1]["learning_rate"])
    return record


def _first_nonfinite_step(fetched: list[dict], last_step: int) -> int | None:
    """The step number of the first fetched step with a NaN/Inf loss or gradient norm."""
    first = last_step - len(fetched) + 1
    for offset, m in enumerate(fetched):
        if not (math.isfinite(float(m["loss"])) and math.isfinite(float(m["grad_norm"]))):
            return first + offset
    return None


def _summary(workdir, latest, last_train, last_eval, config_path, config, overrides=(),
             modules=()) -> str:
    lines = ["", "Done."]
    if last_train:
        lines.append(f"  final train loss  {last_train['loss']:.4f}")
    if last_eval:
        lines.append(f"  held-out loss     {last_eval['eval_loss']:.4f}")
    lines += [
        f"  checkpoint        {workdir / 'checkpoints' / str(latest)}",
        f"  metrics           {workdir / 'metrics.jsonl'}",
        "  TensorBoard       " + tensorboard_command(workdir / "tensorboard"),
        f"  resolved config   {workdir / 'config.json'}",
        "  continue training (resumes from the checkpoint):",
        "    " + shlex.join(
            [cli_flags.this_python(), "-m", "t5x_like.train", f"--config={config_path}",
             f"--workdir={workdir}"] + [f"--module={m}" for m in modules]
            + [f"--config.{o}" for o in overrides if not o.startswith("num_train_steps=")]
            + [f"--config.num_train_steps={config.num_train_steps * 2}"]),
    ]
    return "\n".join(lines)


def tensorboard_command(logdir) -> str:
    """A line that serves ``logdir`` from this Python, with the install in front when the
    ``tensorboard`` extra is missing (train writes the events with tensorboardX alone)."""
    python = cli_flags.this_python()
    serve = shlex.join([python, "-m", "tensorboard.main", "--logdir", str(logdir)])
    if importlib.util.find_spec("tensorboard") is not None:
        return serve
    return f"{python} -m {errors.install_hint('tensorboard')} && {serve}"


@errors.command_line("train")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, overrides = parse_args(argv)
    cli_flags.import_modules(args.module)
    config = runs.load_and_validate(args.config, overrides)
    storage.check_checkpoint_location(args.workdir, "--workdir")
    cli_flags.check_writable_folder(args.workdir)
    cli_flags.start_processes(args, config.startup_timeout_s, args.workdir)
    try:
        run(config, args.workdir, config_path=args.config, quiet=args.quiet,
            overrides=overrides, modules=args.module)
    except FloatingPointError as e:  # not the user's mistake: the run's outcome, exit 1
        print(f"Training diverged: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
