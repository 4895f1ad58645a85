"""Pretraining entry point.

    python -m t5x_like.train --config=configs/quickstart.py --workdir=/tmp/run \
        [--config.num_train_steps=500 --config.batch_size=32 ...]

Writes ``metrics.jsonl``, TensorBoard events, orbax checkpoints and the resolved
config under ``--workdir``, and resumes from the newest checkpoint found there.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import shlex
import signal
import sys
import time

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
    from t5x_like.checkpoints import peft_state

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
            old, data_state = peft_state.restore_state(checkpointer, step, saved_trainer, saved,
                                                 saved_config, where)
            state = trainer.state_from_params(jax.device_get(old.params)).replace(step=old.step)
        else:
            state, data_state = peft_state.restore_state(checkpointer, step, trainer, saved, config,
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

    from t5x_like import checkpoints
    from t5x_like.checkpoints import peft_state
    from t5x_like.models import peft as peft_modules

    params, step = checkpoints.base_params(config.init_from, config, trainer.mesh)
    identity = (peft_state.base_identity(config.init_from, step, params)
                if peft_state.saves_partial(config) else None)
    if "backbone" in trainer.abstract_state.params and "backbone" not in params:
        params = {"backbone": params}  # a pretrained body under a new head
    expected = traverse_util.flatten_dict(peft_modules.plain_dicts(trainer.abstract_state.params))
    given = traverse_util.flatten_dict(peft_modules.plain_dicts(params))
    if config.model.family == "electra" and config.head.kind:  # the discriminator fine-tunes
        given = {key: value for key, value in given.items() if key[:2] != ("backbone", "generator")}
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

    ``devices`` defaults to all devices; tests pass a subset to compare meshes.
    """
    import jax  # imported late: config mistakes are reported before JAX starts

    from t5x_like import (
        checkpointing,
        distill,
        flops,
        hardware,
        metrics_writer,
        partitioning,
        run_guard,
        structures,
    )
    from t5x_like import trainer as trainer_lib
    from t5x_like.checkpoints import peft_state
    from t5x_like.data import get_task_or_mixture, pipeline

    runs.resolve_head_labels(config)
    process_index, process_count = jax.process_index(), jax.process_count()
    devices = jax.devices() if devices is None else list(devices)
    mesh_shape = config_lib.validate_for_devices(config, len(devices), process_count,
                                                 partitioning.num_slices(devices))
    is_chief = process_index == 0
    workdir = storage.path(workdir)
    progress = metrics_writer.Progress(config.num_train_steps, enabled=is_chief and not quiet)

    # Model, optimizer, mesh: built (shapes only, nothing compiled) before the checkpoint
    # is read, so a resume is checked against this run's fingerprint.
    asked_vocabulary = runs.run_vocabulary(config)
    vocabulary = asked_vocabulary or get_task_or_mixture(config.task).vocabulary
    runs.check_model_fits_vocabulary(config, vocabulary)
    runs.check_task_steps(config, asked_vocabulary)
    mesh = partitioning.make_mesh(mesh_shape, devices)
    trainer = trainer_lib.build_trainer(config, mesh)
    fingerprint = run_guard.fingerprint(config, vocabulary, trainer.abstract_state.opt_state)
    teacher_params = None
    if distill.enabled(config):  # the teacher is checked before any checkpoint is touched
        teacher, teacher_params = distill.load_teacher(config, mesh, vocabulary)
        trainer.attach_teacher(teacher.model, teacher_params, distill.make_loss_fn(
            structures.for_config(config), teacher, config.loss, config.distill))

    # Checkpoints: resume from the newest step that restores; damaged newer steps are
    # moved aside. The folder is created only once the config has passed every check.
    def open_checkpointer():
        return checkpointing.Checkpointer(workdir / "checkpoints", keep=config.keep_checkpoints,
                                          keep_every=config.keep_checkpoints_every_steps,
                                          log=_print_on_chief(is_chief))

    checkpointer = open_checkpointer() if (workdir / "checkpoints").is_dir() else None
    resumed = checkpointer.restore_newest(functools.partial(
        _restore_for_resume, checkpointer, config, trainer, fingerprint)) if checkpointer else None
    saved_config = resumed.value[0] if resumed else None
    num_streams = config_lib.resolve_data_streams(config, process_count, saved_config)
    # Saved with every checkpoint: the resolved stream count and the fingerprint.
    run_config = dict(config.to_dict(), data_streams=num_streams, fingerprint=fingerprint)

    # Data: V input streams; this process runs its V/P of them, which fill exactly its
    # rows of each global batch (t5x_like/data/streams.py), so batches depend on V only.
    lengths = dict(config.task_feature_lengths)
    structure = structures.for_config(config)
    data_options = {"feature_converter": structure.feature_converter(lengths, pack=config.pack),
                    "seed": config.seed, "vocabulary": asked_vocabulary}
    train_streams = functools.partial(pipeline.build_dataset, config.task, "train", lengths,
                                      shuffle=True, **data_options)
    eval_streams = functools.partial(pipeline.build_dataset, config.task, "validation", lengths,
                                     shuffle=False, repeat=False, **data_options)

    def host_batches(streams):
        return pipeline.HostBatchIterator(streams, config.batch_size, num_streams, process_count,
                                          process_index)

    # Every process must run the same number of eval steps: the fewest any process has.
    num_eval_batches = partitioning.min_over_processes(pipeline.count_batches(
        host_batches(eval_streams), limit=config.eval_batches))
    if num_eval_batches == 0:
        raise errors.ConfigError(
            f"The validation split holds fewer than one batch of batch_size={config.batch_size} "
            f"({config.batch_size // num_streams} rows from each of {num_streams} input streams); "
            "lower batch_size.")

    # State: resume or initialise.
    checkpointer = checkpointer or open_checkpointer()
    if asked_vocabulary is not None and is_chief:
        runs.keep_tokenizer(workdir, asked_vocabulary)
    train_iter = host_batches(train_streams)
    # A PEFT run from a base on disk saves only what trains, and names the base it needs.
    peft_base = None
    if resumed is not None:
        _, state, data_state, changed = resumed.value
        peft_base = saved_config.get(peft_state.IDENTITY_KEY)
        if data_state is not None:
            try:
                train_iter.set_state(data_state)
            except ValueError as e:
                raise errors.ConfigError(str(e)) from None
        if changed:
            progress.message(f"Resuming with intended changes (allow_resume_changes): "
                             f"{', '.join(changed)}"
                             + ("; the input stream starts over" if data_state is None else ""))
        progress.message(f"Resumed from {checkpointer.step_folder(resumed.step)} at step "
                         f"{resumed.step}.")
    elif config.init_from:
        state, peft_base = _pretrained_state(config, trainer)
        progress.message(f"Initialised params from {config.init_from} (optimizer state fresh).")
    elif teacher_params is not None and config.distill.student_init == "teacher_layers":
        state = trainer.state_from_params(distill.student_from_teacher(
            teacher_params, trainer.abstract_state.params))
        progress.message(f"Student initialised from the teacher {config.distill.teacher} "
                         "(evenly spaced layers).")
    else:
        state = trainer.init_state(config.seed)
    del teacher_params  # placed on the devices by attach_teacher
    if peft_base:
        run_config[peft_state.IDENTITY_KEY] = peft_base
    start_step = int(state.step)
    if is_chief:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "config.json").write_text(json.dumps(run_config, indent=2, default=list))
        trains = ""
        if trainer.trainable is not None:
            count = trainer_lib.param_count(peft_state.trainable_only(state.params, trainer.trainable))
            trains = f" ({count:,} trainable)"
        progress.message(f"t5x_like: {trainer_lib.param_count(state.params):,} parameters{trains}, "
                         f"mesh {mesh_shape}, {len(devices)} {devices[0].platform} devices, "
                         f"steps {start_step} -> {config.num_train_steps}, workdir {workdir}")

    writer = metrics_writer.MetricsWriter(workdir, enabled=is_chief)
    preemption = _PreemptionFlag()
    tokens_per_step = config.batch_size * sum(lengths.values())
    flops_per_step = 3.0 * structure.forward_flops_per_sequence(
        config.model.to_dict(), lengths) * config.batch_size
    peak = hardware.peak_flops(devices[0].device_kind, config.peak_flops_per_device)

    def evaluate(params) -> dict:
        eval_iter = host_batches(eval_streams)
        totals = None
        for _ in range(num_eval_batches):
            out = trainer.eval_step(params, partitioning.global_batch(next(eval_iter), mesh))
            totals = out if totals is None else jax.tree.map(lambda a, b: a + b, totals, out)
        totals = jax.device_get(totals)
        tokens = max(float(totals["num_target_tokens"]), 1.0)
        others = {f"eval_{name[:-len('_sum')]}": float(value) / tokens
                  for name, value in totals.items()
                  if name.endswith("_sum") and name not in ("loss_sum", "correct_sum")}
        return {"eval_loss": float(totals["loss_sum"]) / tokens,
                "eval_accuracy": float(totals["correct_sum"]) / tokens, **others}

    divergence = run_guard.DivergenceMonitor(
        config.divergence.zero_grad_steps, config.divergence.loss_spike_factor,
        config.divergence.median_window, config.model.vocab_size)
    benchmark = (_benchmark_evaluator(config, trainer, asked_vocabulary) if config.eval.mixture
                 else None)
    bench_every = config.eval.every_steps or config.eval_every_steps

    def evaluate_benchmark(params, step: int) -> dict:
        from t5x_like.evaluation import evaluator as evaluator_lib
        from t5x_like.evaluation import results as result_files
        results = benchmark.evaluate(params)
        progress.message(result_files.format_table(step, results))
        record = {f"bench/{r.task}/{k}": v for r in results for k, v in r.metrics.items()}
        mean = evaluator_lib.average(results)
        if mean is not None:
            record["bench/average"] = mean
        return record

    def save(step: int, force: bool = False) -> None:
        # Each process holds its own streams' states; process 0 writes the merged one.
        data_state = pipeline.merge_states(partitioning.gather_json(train_iter.get_state()))
        saved_state = peft_state.saved_view(state, trainer) if peft_base else state
        checkpointer.save(step, saved_state, data_state, run_config, force=force)

    last_train, last_eval = {}, {}
    pending: list[dict] = []
    interval_start, interval_steps = time.monotonic(), 0
    step = start_step
    preempted = False
    try:
        while step < config.num_train_steps:
            batch = partitioning.global_batch(next(train_iter), mesh)
            state, metrics = trainer.train_step(state, batch)
            step += 1
            pending.append(metrics)
            interval_steps += 1
            is_last = step == config.num_train_steps
            do_eval = step % config.eval_every_steps == 0 or is_last
            do_checkpoint = step % config.checkpoint_every_steps == 0 or is_last
            # One process alone may get SIGTERM: processes agree at log and checkpoint
            # steps (a cheap all-gather), so they save and stop at the same step.
            if process_count == 1:
                preempted = preemption.requested
            elif step % config.log_every_steps == 0 or do_checkpoint:
                preempted = partitioning.any_process(preemption.requested)
            do_bench = config.eval.mixture and (step % bench_every == 0 or is_last)
            do_log = (step % config.log_every_steps == 0 or step == start_step + 1 or do_eval
                      or do_bench or preempted)
            if do_log or do_checkpoint:
                fetched = jax.device_get(pending)
                pending = []
                elapsed = time.monotonic() - interval_start
                record = _interval_record(fetched)
                record["tokens_per_sec"] = tokens_per_step * interval_steps / max(elapsed, 1e-9)
                record["steps_per_sec"] = interval_steps / max(elapsed, 1e-9)
                if peak:
                    record["mfu"] = flops.mfu(flops_per_step, record["steps_per_sec"],
                                              len(devices), peak)
                bad = _first_nonfinite_step(fetched, step)
                if bad is not None and config.on_nonfinite_loss == "stop":
                    raise FloatingPointError(
                        f"Train loss or gradient is NaN/Inf at step {bad}; stopping without saving. "
                        f"{_where_the_next_run_starts(checkpointer)} "
                        "Lower optimizer.learning_rate or enable optimizer.grad_clip_norm, or set "
                        "--config.on_nonfinite_loss=skip_update to skip such steps.")
                first = step - len(fetched) + 1
                for offset, m in enumerate(fetched):
                    found = divergence.check(first + offset, float(m["loss"]),
                                             float(m["grad_norm"]))
                    if found is not None:
                        raise run_guard.Diverged(_stop_diverged(checkpointer, step, *found))
                if do_eval:
                    last_eval = evaluate(state.params)
                    record.update(last_eval)
                if benchmark is not None and (step % bench_every == 0 or is_last):
                    record.update(evaluate_benchmark(state.params, step))
                last_train = record
                if step == start_step + 1:
                    progress.message(f"first step (compilation included) took {elapsed:.1f} s")
                writer.write(step, record)
                progress.update(step, record)
                if do_eval:
                    progress.message(f"step {step}: held-out loss {last_eval['eval_loss']:.4f}, "
                                     f"accuracy {last_eval['eval_accuracy']:.3f}")
                interval_start, interval_steps = time.monotonic(), 0
            if do_checkpoint or preempted:
                save(step, force=preempted)
            if preempted:
                progress.message(f"SIGTERM received: saved a checkpoint at step {step}, exiting.")
                break
    finally:
        checkpointer.close()
        writer.close()
        progress.close()
        preemption.restore()

    if is_chief and not quiet:
        latest = checkpointer.latest_step()
        print(_summary(workdir, latest, last_train, last_eval, config_path, config, overrides,
                       modules), flush=True)
    return {"train": last_train, "eval": last_eval, "step": step}


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
        "  TensorBoard       " + shlex.join(["tensorboard", "--logdir",
                                              str(workdir / "tensorboard")]),
        f"  resolved config   {workdir / 'config.json'}",
        "  continue training (resumes from the checkpoint):",
        "    " + shlex.join(
            [cli_flags.this_python(), "-m", "t5x_like.train", f"--config={config_path}",
             f"--workdir={workdir}"] + [f"--module={m}" for m in modules]
            + [f"--config.{o}" for o in overrides if not o.startswith("num_train_steps=")]
            + [f"--config.num_train_steps={config.num_train_steps * 2}"]),
    ]
    return "\n".join(lines)


@errors.command_line("train")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, overrides = parse_args(argv)
    cli_flags.import_modules(args.module)
    config = runs.load_and_validate(args.config, overrides)
    storage.check_checkpoint_location(args.workdir, "--workdir")
    cli_flags.check_writable_folder(args.workdir)
    cli_flags.start_processes(args)
    try:
        run(config, args.workdir, config_path=args.config, quiet=args.quiet,
            overrides=overrides, modules=args.module)
    except FloatingPointError as e:  # not the user's mistake: the run's outcome, exit 1
        print(f"Training diverged: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
