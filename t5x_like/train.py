"""Pretraining entry point.

    python -m t5x_like.train --config=configs/quickstart.py --workdir=/tmp/run \
        [--config.num_train_steps=500 --config.batch_size=32 ...]

Writes ``metrics.jsonl``, TensorBoard events, orbax checkpoints and the resolved
config under ``--workdir``, and resumes from the newest checkpoint found there.

Read top to bottom: ``run`` resolves the run (every check, ``runs.resolve_training``),
holds the workdir (lock, watchdog, goodput, SIGTERM: ``run_holding``), starts the state
(``starting_state``), then loops: a step, then whatever is due (``Loop``: logging with
the divergence checks, the evaluators of ``config.evals``, checkpoints, preemption).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import shlex
import sys
import time

import jax

from t5x_like import (
    cli_flags,
    config,
    distill,
    errors,
    flops,
    goodput_events,
    hardware,
    metrics_writer,
    partitioning,
    run_guard,
    runs,
    starting_state,
    structures,
    watchdog,
)
from t5x_like import trainer as trainer_lib
from t5x_like.checkpoints import peft_state
from t5x_like.data import pipeline
from t5x_like.evaluation import in_training
from t5x_like.run_holding import RunHolding

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
    rest, overrides = config.split_overrides(argv)
    return parser.parse_args(rest), overrides


def run(run_config, workdir: str, config_path: str = "CONFIG", quiet: bool = False,
        devices=None, overrides: list[str] = (), modules: list[str] = ()) -> dict:
    """Trains to ``num_train_steps``; returns the last train and eval metrics and the step.
    ``devices`` defaults to all devices; tests pass a subset to compare meshes."""
    resolved = runs.resolve_training(run_config, workdir, devices)
    spec, is_chief = resolved.spec, jax.process_index() == 0
    progress = metrics_writer.Progress(spec.num_train_steps, enabled=is_chief and not quiet)
    with RunHolding(resolved, progress) as holding:
        loop = Loop(resolved, holding, progress)
        step, watch, goodput = loop.start_step, holding.watchdog, holding.goodput
        while step < spec.num_train_steps:
            watch.doing("reading the batch of step", step + 1)
            with goodput.timed("data"):
                batch = partitioning.global_batch(next(loop.train_batches), loop.mesh)
            compiling = step == loop.start_step  # its dispatch waits for the compilation
            watch.doing("train step (compiling)" if compiling else "train step", step + 1,
                        watchdog.COMPILE_PATIENCE if compiling else 1.0)
            with goodput.timed("compile") if compiling else contextlib.nullcontext():
                loop.state, metrics = loop.trainer.train_step(loop.state, batch)
            step += 1
            watch.done("train step", step)
            loop.after_step(step, metrics)
            if loop.preempted:
                progress.message(f"SIGTERM received: saved a checkpoint at step {step}, "
                                 "exiting.")
                break
        holding.status = "preempted" if loop.preempted else "done"
        with goodput.timed("checkpoint_save"):
            loop.close()  # waits for the last checkpoint save, watched for a hang
    if is_chief:
        account = goodput_events.account(goodput_events.read_events(resolved.workdir))
        goodput_events.write_tensorboard(resolved.workdir, account, step)
        if not quiet:
            print(_summary(resolved.workdir, loop.checkpointer.latest_step(), loop.last_train,
                           loop.last_eval, config_path, spec, overrides, modules), flush=True)
            print(goodput_events.one_line(account), flush=True)
    return {"train": loop.last_train, "eval": loop.last_eval, "step": step}


class Loop:
    """The state, its data and what the loop does besides stepping, each when it is due:
    logging (interval means, throughput, MFU) with the NaN and divergence checks, the
    evaluators, checkpoints, and agreeing on a SIGTERM across processes."""

    def __init__(self, resolved, holding: RunHolding, progress):
        self.resolved, self.holding, self.progress = resolved, holding, progress
        self.spec, self.trainer, self.mesh = resolved.spec, resolved.trainer, resolved.trainer.mesh
        self.is_chief = jax.process_index() == 0
        self.checkpointer = None
        teacher_params = self._attach_teacher()
        self.checkpointer = starting_state.open_checkpointer(self.spec, resolved.workdir,
                                                             self.is_chief)
        start = starting_state.start(resolved, self.checkpointer, teacher_params)
        self.state, self.peft_base = start.state, start.peft_base
        holding.goodput.event("setup", restore_s=round(start.restore_s, 6),
                              resumed_from=int(self.state.step))
        self.train_batches = self.host_batches(self._streams("train"))
        if start.data_state is not None:
            try:
                self.train_batches.set_state(start.data_state)
            except ValueError as e:
                raise errors.UserError(str(e)) from None
        self.start_step = int(self.state.step)
        self.evaluators = in_training.build(self.spec, resolved.evaluators, in_training.Context(
            self.spec, self.trainer, resolved.asked_vocabulary, self._streams("validation"),
            self.host_batches, resolved.num_streams, progress))
        self._announce(start.message)
        self.writer = metrics_writer.MetricsWriter(resolved.workdir, enabled=self.is_chief)
        lengths = dict(self.spec.task_feature_lengths)
        self.tokens_per_step = self.spec.batch_size * sum(lengths.values())
        self.flops_per_step = 3.0 * self.trainer_structure().forward_flops_per_sequence(
            self.spec.model, lengths) * self.spec.batch_size
        self.peak = hardware.peak_flops(resolved.devices[0].device_kind,
                                        self.spec.logging.peak_flops_per_device)
        self.stability = run_guard.StabilityChecks(self.spec, self.checkpointer)
        self.last_train, self.last_eval, self.pending, self.preempted = {}, {}, [], False
        self.interval_start, self.interval_steps = time.monotonic(), 0

    def trainer_structure(self):
        return structures.for_config(self.spec)

    def _attach_teacher(self):
        """Distillation's teacher in the train step; its host params (the student may start
        from its layers), or None without one."""
        teacher = self.resolved.teacher
        if teacher is None:
            return None
        structure, params = distill.load_teacher(self.spec, teacher, self.mesh)
        self.trainer.attach_teacher(structure.model, params, distill.make_loss_fn(
            self.trainer_structure(), structure, self.spec.loss, self.spec.distill))
        return params

    def _streams(self, split: str):
        lengths = dict(self.spec.task_feature_lengths)
        converter = self.trainer_structure().feature_converter(lengths, pack=self.spec.data.pack)
        return functools.partial(pipeline.build_dataset, self.spec.task, split, lengths,
                                 shuffle=split == "train", repeat=split == "train",
                                 feature_converter=converter, seed=self.spec.seed,
                                 vocabulary=self.resolved.asked_vocabulary)

    def host_batches(self, streams, padding=None):
        """This process's rows of each global batch, from its V/P of the V input streams
        (``data/streams.py``), so batches depend on V only; with ``padding``, a one-pass
        read whose short batches are padded."""
        return pipeline.HostBatchIterator(streams, self.spec.batch_size, self.resolved.num_streams,
                                          jax.process_count(), jax.process_index(), padding)

    def _announce(self, start_message: str) -> None:
        """The resolved config in the workdir (and the tokenizer the run asked for), and
        one line on what will run."""
        if start_message:
            self.progress.message(start_message)
        if not self.is_chief:
            return
        workdir = self.resolved.workdir
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "config.json").write_text(json.dumps(self.run_config, indent=2, default=list))
        if self.resolved.asked_vocabulary is not None:
            runs.keep_tokenizer(workdir, self.resolved.asked_vocabulary)
        trains = ""
        if self.trainer.trainable is not None:
            count = trainer_lib.param_count(peft_state.trainable_only(self.state.params,
                                                                      self.trainer.trainable))
            trains = f" ({count:,} trainable)"
        devices = self.resolved.devices
        self.progress.message(
            f"t5x_like: {trainer_lib.param_count(self.state.params):,} parameters{trains}, "
            f"mesh {self.resolved.mesh_shape}, {len(devices)} {devices[0].platform} devices, "
            f"steps {int(self.state.step)} -> {self.spec.num_train_steps}, workdir {workdir}")

    @property
    def run_config(self) -> dict:
        """Saved with every checkpoint: the spec, streams, fingerprint and PEFT base."""
        saved = self.resolved.run_config
        if self.peft_base:
            saved[peft_state.IDENTITY_KEY] = self.peft_base
        return saved

    def after_step(self, step: int, metrics) -> None:
        self.pending.append(metrics)
        self.interval_steps += 1
        due = [e for e in self.evaluators if e.due(step)]
        do_checkpoint = (step % self.spec.checkpoint.every_steps == 0
                         or step == self.spec.num_train_steps)
        self.preempted = self._preemption_agreed(step, do_checkpoint)
        if (step % self.spec.logging.every_steps == 0 or step == self.start_step + 1 or due
                or self.preempted or do_checkpoint):
            self.holding.watchdog.doing("fetching the metrics of step", step)
            self._log(step, jax.device_get(self.pending), due)
            self.holding.goodput.steps(step)
            self.pending = []
        if do_checkpoint or self.preempted:
            self.holding.check_still_ours(step)
            with self.holding.goodput.timed("checkpoint_save"):
                self._checkpoint(step, force=self.preempted)

    def _preemption_agreed(self, step: int, do_checkpoint: bool) -> bool:
        """One process alone may get SIGTERM: processes agree at log and checkpoint steps
        (a cheap all-gather), so they save and stop at the same step."""
        requested = self.holding.preemption.requested
        if jax.process_count() == 1:
            return requested
        if step % self.spec.logging.every_steps == 0 or do_checkpoint:
            return partitioning.any_process(requested)
        return False

    def _log(self, step: int, fetched: list[dict], due: list) -> None:
        elapsed = time.monotonic() - self.interval_start
        record = run_guard.interval_record(fetched)
        record["tokens_per_sec"] = self.tokens_per_step * self.interval_steps / max(elapsed, 1e-9)
        record["steps_per_sec"] = self.interval_steps / max(elapsed, 1e-9)
        if self.peak:
            record["mfu"] = flops.mfu(self.flops_per_step, record["steps_per_sec"],
                                      len(self.resolved.devices), self.peak)
        self.stability.check(step, fetched)
        if due:
            params = self.trainer.evaluation_params(self.state)
            evaluated = {}
            for evaluator in due:
                self.holding.watchdog.doing(f"{evaluator.DOING} at step", step)
                with self.holding.goodput.timed("evaluation"):
                    evaluated.update(evaluator.evaluate(params, step))
                self.holding.watchdog.done(f"{evaluator.DOING} at step", step)
            record.update(evaluated)
            self.last_eval = evaluated
        self.last_train = record
        if step == self.start_step + 1:
            self.progress.message(f"first step (compilation included) took {elapsed:.1f} s")
        self.writer.write(step, record)
        self.progress.update(step, record)
        self.interval_start, self.interval_steps = time.monotonic(), 0

    def _checkpoint(self, step: int, force: bool = False) -> None:
        """Each process holds its own streams' states; process 0 writes the merged one."""
        data_state = pipeline.merge_states(partitioning.gather_json(self.train_batches.get_state()))
        state = (peft_state.saved_view(self.state, self.trainer) if self.peft_base else self.state)
        self.holding.watchdog.doing("checkpoint save at step", step)
        self.checkpointer.save(step, state, data_state, self.run_config, force=force)
        self.holding.watchdog.done("checkpoint save at step", step)

    def close(self) -> None:
        self.holding.watchdog.doing("closing: waiting for the last checkpoint save")
        self.checkpointer.close()
        self.writer.close()
        self.progress.close()


def _summary(workdir, latest, last_train, last_eval, config_path, spec, overrides=(),
             modules=()) -> str:
    lines = ["", "Done."]
    if last_train:
        lines.append(f"  final train loss  {last_train['loss']:.4f}")
    if "eval_loss" in (last_eval or {}):
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
            + [f"--config.num_train_steps={spec.num_train_steps * 2}"]),
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
    run_config = runs.load_config(args.config, overrides)
    timeout = config.spec_of(run_config).resilience.startup_timeout_s
    cli_flags.start_processes(args, timeout, args.workdir)
    try:
        run(run_config, args.workdir, config_path=args.config, quiet=args.quiet,
            overrides=overrides, modules=args.module)
    except FloatingPointError as e:  # not the user's mistake: the run's outcome, exit 1
        print(f"Training diverged: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
