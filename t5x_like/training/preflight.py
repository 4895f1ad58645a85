"""Resolving a training run before anything runs: one call turns (config, devices,
workdir state) into the checked, frozen spec and what ``train`` builds from it, with
every ``ConfigError`` raised here: before the workdir lock, before any checkpoint
restore, before any compile. ``train`` then only holds the workdir, builds, restores or
initialises, and loops.

``resolve_training`` checks, in order: the spec (``resolving.resolve_spec``: keys, types,
task, labels, what the family can do), the workdir and ``checkpoint.local_dir``, the
vocabulary and the task's steps, the evaluators (``evaluation.in_training``: mixtures,
packages, harness tasks), the mesh on the devices, the trainer (shapes only, nothing
compiled), PEFT fitting the model, each active training mode's checks and frozen models
(``modes``: a distillation teacher, a DPO or KL reference; their configs, not their
arrays), ``init_from`` (its config), and the workdir's newest checkpoint against this
run's fingerprint and input streams.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import jax

from t5x_like import cli_flags, config, modes, resolving, structures
from t5x_like.checkpoints import checkpoint_store
from t5x_like.checkpoints.param_sources.source import check_same_model, resolve
from t5x_like.config import RunSpec
from t5x_like.data import get_task_or_mixture
from t5x_like.engine import partitioning
from t5x_like.engine import trainer as trainer_lib
from t5x_like.engine.trainer import flat_with_paths
from t5x_like.errors import ConfigError, UserError
from t5x_like.evaluation import in_training
from t5x_like.models import pipeline_parallel
from t5x_like.resilience import resume_fingerprint
from t5x_like.system import hardware, storage
from t5x_like.telemetry import trackers


@dataclasses.dataclass
class Resume:
    """The workdir's newest checkpoint, checked: its step and saved config (sectioned), and
    the fingerprint keys ``checkpoint.allow_resume_changes`` lets differ."""

    step: int
    saved: dict
    changed: list[str]


@dataclasses.dataclass
class TrainingRun:
    """What ``train`` builds from, every check passed."""

    spec: RunSpec
    workdir: Any
    asked_vocabulary: Any          # config.vocabulary resolved (None: the task's own)
    vocabulary: Any                # what the task tokenizes with
    devices: list
    mesh_shape: dict
    trainer: Any                   # built on the mesh: shapes and jitted steps, nothing compiled
    fingerprint: dict
    num_streams: int
    resume: Resume | None
    evaluators: dict               # {name: prepared}, see evaluation.in_training
    frozen: dict = dataclasses.field(default_factory=dict)  # the modes' frozen models by
    #                                name (modes.Frozen): sources checked, params not read
    started: float = 0.0           # when resolving began (goodput counts start-up from it)
    notices: tuple[str, ...] = ()  # what resolving changed on its own, said at the start
    microbatches_asked: int = 0    # the config's optimizer.microbatches (0: the spec's)

    @property
    def run_config(self) -> dict:
        """What every checkpoint saves beside the state: the spec, the resolved stream
        count, the fingerprint and the rows each device held at a time (which a resume
        on another mesh keeps, ``_holding_the_saved_rows``)."""
        tree = self.spec.to_dict()
        tree["data"]["streams"] = self.num_streams
        return dict(tree, fingerprint=self.fingerprint, **{
            config.ROWS_PER_DEVICE: config.rows_per_device(self.spec, self.mesh_shape),
            config.MICROBATCHES_ASKED: (self.microbatches_asked
                                        or self.spec.optimizer.microbatches)})


def resolve_training(run_config, workdir: str, devices=None, process_count: int | None = None
                     ) -> TrainingRun:
    """Everything ``train`` checks, in order, none of it building state or compiling."""

    started = time.time()
    spec = resolving.resolve_spec(run_config)
    storage.check_checkpoint_location(workdir, "--workdir")
    cli_flags.check_writable_folder(workdir)
    process_count = jax.process_count() if process_count is None else process_count
    _check_local_dir(spec)
    trackers.check_ready(spec.trackers, spec.tracking)
    asked = _config_vocabulary(spec)
    vocabulary = asked or get_task_or_mixture(spec.task).vocabulary
    newest = _newest_saved_config(spec, storage.path(workdir))
    spec = structures.structure_class(spec.model.family).with_start_id(
        spec, vocabulary, resolving.saved_start_id(newest[1] if newest else
                                                   _init_from_config(spec)))
    resolving.check_model_fits_vocabulary(spec, vocabulary)
    resolving.check_task_steps(spec, asked)
    evaluators = _prepared_evaluators(in_training, spec, asked)
    devices = jax.devices() if devices is None else list(devices)
    hardware.check_quantization(spec.quantization.kind, devices[0].device_kind)
    mesh_shape = config.check_devices(spec, len(devices), process_count,
                                      partitioning.num_slices(devices))
    asked_microbatches = spec.optimizer.microbatches
    spec, notices = _holding_the_saved_rows(spec, newest, mesh_shape)
    if notices:  # the new microbatches meet the mesh's checks too
        config.check_devices(spec, len(devices), process_count, partitioning.num_slices(devices))
    trainer = trainer_lib.build_trainer(spec, partitioning.make_mesh(
        mesh_shape, devices, spec.partitioning.split_physical_axes))
    check_peft_fits(spec, trainer.abstract_state.params)
    fingerprint = resume_fingerprint.fingerprint(
        spec, vocabulary, trainer.abstract_state.opt_state,
        pipeline_parallel.stack_layout(trainer.pipeline_settings, getattr(spec.model, "num_layers", 0)))
    frozen = _checked_modes(spec, vocabulary, trainer)
    _check_init_from(spec)
    resume = _checked_resume(spec, newest, fingerprint)
    num_streams = config.resolve_data_streams(spec, process_count,
                                              resume.saved if resume else None)
    return TrainingRun(spec, storage.path(workdir), asked, vocabulary, devices, mesh_shape,
                       trainer, fingerprint, num_streams, resume, evaluators, frozen,
                       started, notices, asked_microbatches)


def _holding_the_saved_rows(spec, newest, mesh_shape) -> tuple[RunSpec, tuple[str, ...]]:
    """A resume onto a mesh that splits the batch into fewer shards (fewer devices, or
    devices moved to other axes) would put more rows on each device than the run that
    saved the checkpoint held at a time, which may not fit: the optimizer microbatches
    grow until each device holds at most that many, and the global batch stays. Only
    while ``optimizer.microbatches`` is what the checkpoint's run asked for (another
    value is the user's choice) and the checkpoint says how many rows it held."""
    if newest is None or not isinstance(newest[1].get(config.ROWS_PER_DEVICE), int):
        return spec, ()
    saved, held = newest[1], newest[1][config.ROWS_PER_DEVICE]
    asked = saved.get(config.MICROBATCHES_ASKED) or config.migrated(saved)[0].get(
        "optimizer", {}).get("microbatches", 1)
    if (spec.optimizer.microbatches != asked
            or not structures.for_config(spec).splits_into_microbatches):
        return spec, ()  # chosen by the user, or a structure that trains on whole batches
    microbatches = config.microbatches_holding(spec, mesh_shape, held)
    if microbatches == spec.optimizer.microbatches:
        return spec, ()
    rows = spec.batch_size // config.batch_shards(spec, mesh_shape)
    spec = dataclasses.replace(spec, optimizer=dataclasses.replace(spec.optimizer,
                                                                   microbatches=microbatches))
    return spec, (
        f"This mesh splits each batch of {spec.batch_size} rows into "
        f"{config.batch_shards(spec, mesh_shape)} shards of {rows} rows; the checkpoint's "
        f"mesh held {held} rows a device at a time: training in optimizer.microbatches="
        f"{microbatches} of {rows // microbatches} rows, the same global batch (set "
        "--config.optimizer.microbatches to choose another).",)


def _config_vocabulary(spec):
    """``vocabulary``: "" (the task's), ``checkpoint`` (what ``init_from`` carries) or a path."""
    try:
        source = resolve(spec.init_from, "init_from") if spec.vocabulary == "checkpoint" else None
        return resolving.asked_vocabulary(spec.vocabulary, source, "vocabulary")
    except UserError as e:
        raise ConfigError(f"vocabulary={spec.vocabulary!r}: {e}") from None


def _prepared_evaluators(in_training, spec, vocabulary) -> dict:
    """Each evaluator's ``prepare`` (its mixture found, its packages installed, its harness
    tasks loaded); a problem names its key."""
    prepared = {}
    for name, settings in spec.evals.items():
        if not settings.enabled:
            continue
        try:
            prepared[name] = in_training.KINDS[settings.kind].prepare(name, settings, spec,
                                                                      vocabulary)
        except UserError as e:
            raise ConfigError(f"evals.{name}: {e}") from None
    return prepared


def _check_local_dir(spec) -> None:
    """``checkpoint.local_dir``: a folder this process can write (each process of a
    multi-process run writes its own shards there, ``checkpoint_per_host``)."""
    local = spec.checkpoint.local_dir
    if not local:
        return
    try:
        cli_flags.check_writable_folder(local, "checkpoint.local_dir")
    except UserError as e:
        raise ConfigError(str(e)) from None


def check_peft_fits(spec, params) -> None:
    """PEFT settings the model cannot honour, refused naming what there is: a LoRA
    pattern that matches no kernel, a prompt longer than the learned positions leave
    room for, BitFit on a model without biases."""
    paths = [path for path, _ in flat_with_paths(params)]
    peft = spec.peft
    if peft.lora.rank and not any(p.endswith("/lora_a") for p in paths):
        kernels = [p for p in paths if p.endswith("/kernel")]
        examples = ", ".join(kernels[:4]) + (", ..." if len(kernels) > 4 else "")
        raise ConfigError(f"peft.lora.targets={peft.lora.targets!r} matches none of the "
                          f"model's {len(kernels)} kernels ({examples}); write a regular "
                          "expression searched in such paths, e.g. '(query|value)/kernel$' "
                          "(`python -m t5x_like.summary --depth=9` lists the paths).")
    structure = structures.structure_class(spec.model.family)
    limit = structure.learned_positions(spec.model)
    if peft.prompt.length and limit:
        inputs = int(spec.task_feature_lengths.get("inputs", 0))
        needed = structure.positions_needed(spec, {"inputs": inputs + peft.prompt.length})
        if needed > limit:
            raise ConfigError(
                f"peft.prompt.length={peft.prompt.length} more positions after "
                f"task_feature_lengths.inputs={inputs} pass the model's "
                f"positions.max_length={limit} learned positions; shorten the inputs to "
                f"{limit - peft.prompt.length} or the prompt.")
    if peft.bitfit and not any(p.endswith("/bias") for p in paths):
        raise ConfigError("peft.bitfit trains only bias terms, and this model has none "
                          f"(model.family={spec.model.family!r}; T5 v1.1 has no biases). "
                          "Use a model with biases (use_bias=True) or a fine-tuning head.")


def _checked_modes(spec, vocabulary, trainer) -> dict:
    """One pass over the run's training modes (``modes.registry``): each active mode's
    checks, then the frozen models they need, found and checked (configs only); ``{name:
    source}``. A problem is the run's ``ConfigError``."""
    unregistered = [name for name in spec.modes if name not in modes.MODES]
    if unregistered:
        raise ConfigError(f"modes.{unregistered[0]} has settings but no registered mode; "
                          "register it with t5x_like.modes.register in the module you pass "
                          "with --module.")
    try:
        for mode in modes.active(spec):
            if mode.check is not None:
                mode.check(spec)
        needed = modes.frozen_of(spec)
        if len(needed) > 1:  # Trainer.attach_frozen holds one frozen model
            raise ConfigError(f"The run's modes need {len(needed)} frozen models ("
                              f"{', '.join(frozen.name for frozen in needed)}); a train step "
                              "runs one beside the policy. Turn one of the modes off.")
        return {frozen.name: frozen.resolve(spec, vocabulary, trainer) for frozen in needed}
    except UserError as e:
        raise ConfigError(str(e)) from None


def _init_from_config(spec) -> dict | None:
    """The saved config of the newest checkpoint ``init_from`` names (None: no init_from,
    or one that does not resolve, which ``_check_init_from`` refuses)."""
    if not spec.init_from:
        return None
    try:
        source = resolve(spec.init_from, "init_from")
    except UserError:
        return None
    steps = source.steps()
    return source.saved_config(steps[-1]) if steps else None


def _check_init_from(spec) -> None:
    """``init_from`` holds a checkpoint of this model (its config read, no arrays)."""
    if not spec.init_from:
        return
    try:
        source = resolve(spec.init_from, "init_from")
    except UserError:
        raise ConfigError(
            f"init_from={spec.init_from!r} is not a pretrained folder (no model_config.json), "
            "a training workdir or a checkpoint step folder; point it at the --out folder of "
            "`python -m t5x_like.convert import` or at a run's workdir.") from None
    steps = source.steps()
    if not steps:
        raise ConfigError(f"init_from={spec.init_from!r} holds no complete checkpoint yet.")
    try:
        check_same_model(source.saved_config(steps[-1]), spec, f"init_from={spec.init_from!r}")
    except UserError as e:
        raise ConfigError(str(e)) from None


def _checked_resume(spec, newest, fingerprint: dict) -> Resume | None:
    """The newest step of the workdir (or its local tier) whose config reads
    (``_newest_saved_config``), checked against this run's fingerprint. A damaged newer
    step is left to the restore, which moves it aside."""
    if newest is None:
        return None
    step, saved = newest
    changed = resume_fingerprint.check_resume(saved, fingerprint, spec.checkpoint.allow_resume_changes)
    layout = config.migrated(saved)[0]
    return Resume(step, dict(layout, fingerprint=saved.get("fingerprint"),
                             peft_base=saved.get("peft_base")), changed)


def _newest_saved_config(spec, workdir) -> tuple[int, dict] | None:
    """``(step, saved config)`` of the newest of the workdir's checkpoints whose config
    item reads, read straight from the step folders (``config/metadata``); read once,
    for the rows a resume keeps and the fingerprint it checks."""

    folders = [workdir / "checkpoints"]
    if spec.checkpoint.local_dir:
        process = jax.process_index() if jax.process_count() > 1 else None
        folders.insert(0, checkpoint_store.local_tier(spec.checkpoint.local_dir,
                                                   workdir / "checkpoints", process))
    steps = {}
    for folder in folders:
        if folder.is_dir():
            for path in folder.iterdir():
                if path.name.isdigit() and (path / "config" / "metadata").exists():
                    steps.setdefault(int(path.name), path)
    for step in sorted(steps, reverse=True):
        try:
            saved = json.loads((steps[step] / "config" / "metadata").read_text())
        except (OSError, ValueError):
            continue  # damaged: the restore moves it aside
        if isinstance(saved, dict):
            return step, saved
    return None
