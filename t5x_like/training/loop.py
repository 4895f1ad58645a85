"""What the training loop does besides stepping, each when it is due (``train.py``'s
loop calls it): the state it starts from and its data, logging with the NaN and
divergence checks, the evaluators of ``config.evals``, checkpoints, agreeing on a
SIGTERM across processes, and the summary at the end. Everything here runs after the
run resolved (``preflight.resolve_training``): its errors are the run's, not the config's.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time

import jax

from t5x_like import errors, modes, resolving, structures
from t5x_like.checkpoints import run_commands
from t5x_like.checkpoints.param_sources import peft_partial
from t5x_like.data import pipeline
from t5x_like.engine import flops, partitioning
from t5x_like.engine import trainer as trainer_lib
from t5x_like.evaluation import in_training
from t5x_like.resilience import divergence
from t5x_like.resilience.holding import RunHolding
from t5x_like.system import hardware
from t5x_like.telemetry import goodput_events, metrics_writer
from t5x_like.training import starting_state


def holding(resolved, quiet: bool) -> RunHolding:
    """What the run holds while it trains (the workdir lock, the hang watchdog, goodput,
    the SIGTERM flag), with the progress printer of process 0."""
    progress = metrics_writer.Progress(resolved.spec.num_train_steps,
                                       enabled=jax.process_index() == 0 and not quiet)
    return RunHolding(resolved, progress)


class Loop:
    """The state, its data and what the loop does besides stepping, each when it is due:
    logging (interval means, throughput, MFU) with the NaN and divergence checks, the
    evaluators, checkpoints, and agreeing on a SIGTERM across processes."""

    def __init__(self, resolved, holding: RunHolding, command: str = ""):
        progress = holding.progress
        self.resolved, self.holding, self.progress = resolved, holding, progress
        self.spec, self.trainer, self.mesh = resolved.spec, resolved.trainer, resolved.trainer.mesh
        self.is_chief = jax.process_index() == 0
        self.checkpointer = None
        attached = self._attach_frozen()
        self.checkpointer = starting_state.open_checkpointer(self.spec, resolved.workdir,
                                                             self.is_chief)
        start = starting_state.start(resolved, self.checkpointer, attached)
        self.state, self.peft_base = start.state, start.peft_base
        if self.is_chief and command:  # the launch, kept with the run (a model card reads it)
            run_commands.record(resolved.workdir, command, int(self.state.step))
        holding.goodput.event("setup", restore_s=round(start.restore_s, 6),
                              resumed_from=int(self.state.step))
        self.train_batches = self.host_batches(self._streams("train"),
                                               batch_size=self.spec.prompts_per_step())
        if start.data_state is not None:
            try:
                self.train_batches.set_state(start.data_state)
            except ValueError as e:
                raise errors.UserError(str(e)) from None
        self.start_step = self.step = int(self.state.step)
        # A mode's own batches (online RL's rollouts), else the task's rows.
        self.batch_source = modes.batch_source(self.spec, self.trainer, self.trainer_structure(),
                                               resolved.vocabulary, self.train_batches)
        self.batch_metrics, self.source_batch = {}, None
        self.saved_once = False
        # Evaluators that have run: an evaluator's first run compiles its programs, and
        # gets the first step's allowance from the hang watchdog.
        self.evaluated_once: set[int] = set()
        # Steps one batch of the mode's serves (rl.iterations): a stop (preemption) waits
        # for the end of the current batch's updates, as checkpoints do (config checks).
        self.updates_per_batch = (self.batch_source.updates_per_batch
                                  if self.batch_source is not None else 1)
        self.evaluators = in_training.build(self.spec, resolved.evaluators, in_training.Context(
            self.spec, self.trainer, resolved.asked_vocabulary, self._streams("validation"),
            self.host_batches, resolved.num_streams, progress))
        self._announce("\n".join((*resolved.notices, start.message)).strip())
        self.writer = metrics_writer.MetricsWriter(
            resolved.workdir, enabled=self.is_chief, tracker_names=self.spec.trackers,
            tracking=self.spec.tracking, run_config=self.run_config)
        lengths = dict(self.spec.task_feature_lengths)
        self.tokens_per_step = (self.spec.batch_size * sum(lengths.values())
                                * self.trainer_structure().rows_per_example)
        self.flops_per_step = 3.0 * self.trainer_structure().forward_flops_per_sequence(
            self.spec.model, lengths) * self.spec.batch_size
        self.peak = hardware.peak_flops(resolved.devices[0].device_kind,
                                        self.spec.logging.peak_flops_per_device)
        self.stability = divergence.StabilityChecks(self.spec, self.checkpointer)
        self.last_train, self.last_eval, self.pending, self.preempted = {}, {}, [], False
        self.stop_agreed = False  # a SIGTERM the processes agreed on, waiting for a boundary
        self.interval_start, self.interval_steps = time.monotonic(), 0

    def trainer_structure(self):
        return structures.for_config(self.spec)

    def _attach_frozen(self) -> dict:
        """The run's modes' frozen models (a teacher, a reference) in the train step, each
        loaded from the source checked when the run resolved; ``{name: host params}`` (a
        mode may start the run from them, ``modes.start_from``)."""
        return {frozen.name: frozen.attach(self.spec, self.resolved.frozen[frozen.name],
                                           self.trainer, self.trainer_structure())
                for frozen in modes.frozen_of(self.spec)}

    def _streams(self, split: str):
        lengths = dict(self.spec.task_feature_lengths)
        converter = self.trainer_structure().feature_converter(lengths, pack=self.spec.data.pack)
        return functools.partial(pipeline.build_dataset, self.spec.task, split, lengths,
                                 shuffle=split == "train", repeat=split == "train",
                                 feature_converter=converter, seed=self.spec.seed,
                                 vocabulary=self.resolved.asked_vocabulary)

    def host_batches(self, streams, padding=None, batch_size=None):
        """This process's rows of each global batch (of ``batch_size`` rows, default the
        run's), from its V/P of the V input streams (``data/streams.py``), so batches
        depend on V only; with ``padding``, a one-pass read whose short batches are
        padded."""
        return pipeline.HostBatchIterator(streams, batch_size or self.spec.batch_size,
                                          self.resolved.num_streams, jax.process_count(),
                                          jax.process_index(), padding)

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
            resolving.keep_tokenizer(workdir, self.resolved.asked_vocabulary)
        trains = ""
        if self.trainer.trainable is not None:
            count = trainer_lib.param_count(peft_partial.trainable_only(self.state.params,
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
            saved[peft_partial.IDENTITY_KEY] = self.peft_base
        return saved

    def next_batch(self):
        """The next global batch (this process's rows of it, sharded over the mesh): the
        task's rows, or the run's mode's (``modes.BatchSource``: online RL's rollouts of
        the next step's prompts)."""
        if self.batch_source is not None:
            return self._source_batch()
        # The first batch starts the input streams (files opened, workers started).
        self.holding.watchdog.doing("reading the batch of step", self.step + 1,
                                    first=self.step == self.start_step)
        with self.holding.goodput.timed("data"):
            local = next(self.train_batches)
        return partitioning.global_batch(local, self.mesh, self.trainer.rules)

    def _source_batch(self):
        """A new batch when the source says one is due, else the last one again (or the
        part of it the source names: PPO's minibatches) with the source's
        ``reused_metrics``."""
        source = self.batch_source
        if self.source_batch is not None and not source.due(self.step):
            self.batch_metrics = source.reused_metrics
            part = source.part(self.step)
            if part is not None:
                self.source_batch = partitioning.global_batch(part, self.mesh,
                                                              self.trainer.rules)
            return self.source_batch
        # The updates still in flight (steps are dispatched asynchronously) finish first:
        # the new batch is sampled with their params, so it waits for them anyway, and
        # waiting here books their time to training, not to the batch's phase (it made
        # goodput book most of a PPO run's update time as rollout).
        jax.block_until_ready(self.state.params)
        self.holding.watchdog.doing(source.DOING, self.step + 1,
                                    first=self.step == self.start_step)
        with self.holding.goodput.timed(source.PHASE):
            local, self.batch_metrics = source.next(self.state.params, self.step)
        self.source_batch = partitioning.global_batch(local, self.mesh, self.trainer.rules)
        return self.source_batch

    def train_step(self, batch):
        """One jitted step; the first compiles (its dispatch waits for the compilation)."""
        watch, compiling = self.holding.watchdog, self.step == self.start_step
        watch.doing("train step (compiling)" if compiling else "train step", self.step + 1,
                    first=compiling)
        with self.holding.goodput.timed("compile") if compiling else contextlib.nullcontext():
            self.state, metrics = self.trainer.train_step(self.state, batch)
        metrics = {**metrics, **self.batch_metrics}
        self.step += 1
        watch.done("train step", self.step)
        return metrics

    def after_step(self, metrics) -> None:
        """Logging, evaluators, checkpoint and preemption, each when due at this step."""
        step = self.step
        self.pending.append(metrics)
        self.interval_steps += 1
        due = [e for e in self.evaluators if e.due(step)]
        do_checkpoint = (step % self.spec.checkpoint.every_steps == 0
                         or step == self.spec.num_train_steps)
        agreed = self._preemption_agreed(step, do_checkpoint)  # every process calls it
        self.stop_agreed = self.stop_agreed or agreed
        self.preempted = self.stop_agreed and step % self.updates_per_batch == 0
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
        (a cheap all-gather), so they save and stop at the same step (``after_step``: the
        first step from the agreed one on that ends a rollout batch; every process sees
        the same agreed step, so the same stop)."""
        requested = self.holding.preemption.requested
        if jax.process_count() == 1:
            return requested
        if step % self.spec.logging.every_steps == 0 or do_checkpoint:
            return partitioning.any_process(requested)
        return False

    def _log(self, step: int, fetched: list[dict], due: list) -> None:
        elapsed = time.monotonic() - self.interval_start
        record = divergence.interval_record(fetched)
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
                self.holding.watchdog.doing(f"{evaluator.DOING} at step", step,
                                            first=id(evaluator) not in self.evaluated_once)
                with self.holding.goodput.timed("evaluation"):
                    evaluated.update(evaluator.metrics(params, step))
                self.evaluated_once.add(id(evaluator))
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
        state = (peft_partial.saved_view(self.state, self.trainer) if self.peft_base else self.state)
        # The run's first save starts the checkpointer's threads and builds its transfer
        # programs: like the first step, it has the first step's allowance.
        self.holding.watchdog.doing("checkpoint save at step", step, first=not self.saved_once)
        self.checkpointer.save(step, state, data_state, self.run_config, force=force)
        self.saved_once = True
        self.holding.watchdog.done("checkpoint save at step", step)

    def close(self) -> None:
        """Waits for the last checkpoint save (watched for a hang), closes the writers, and
        says if the run stopped for a SIGTERM."""
        if self.preempted:
            self.progress.message(f"SIGTERM received: saved a checkpoint at step {self.step}, "
                                  "exiting.")
        self.holding.watchdog.doing("closing: waiting for the last checkpoint save")
        with self.holding.goodput.timed("checkpoint_save"):
            self.checkpointer.close()
        self.writer.close(failed=self.holding.status not in ("done", "preempted"))
        self.progress.close()

    def account(self) -> dict:
        """Goodput over the workdir's runs, written as TensorBoard scalars (process 0)."""
        account = goodput_events.account(goodput_events.read_events(self.resolved.workdir))
        if "tensorboard" in self.spec.trackers:
            goodput_events.write_tensorboard(self.resolved.workdir, account, self.step)
        return account


