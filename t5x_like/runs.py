"""Resolving a run before anything runs: one call turns (config, devices, workdir state)
into the checked, frozen spec and what the command builds from it, with every
``ConfigError`` raised here: before the workdir lock, before any checkpoint restore,
before any compile. The commands then only hold, build, restore or initialise, and
loop.

- ``resolve_spec``: the config's spec, its task and evaluators found, a head's labels
  taken from its task, the family's structure asked what it can do;
- ``resolve_training`` (``train``): the vocabulary and the task's steps, the
  evaluators prepared, the mesh on the devices, the trainer (shapes only), PEFT
  fitting the model, the distillation teacher and ``init_from`` read (their configs,
  not their arrays), and the workdir's newest checkpoint checked against this run's
  fingerprint and input streams;
- ``resolve_checkpoint`` (``eval``, ``infer``, the harness, ``embed``, ``convert
  export``): the spec a checkpoint evaluates with, and the vocabulary it was trained
  with and the one asked for.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import ml_collections

from t5x_like import cli_flags, config, storage
from t5x_like.checkpoints.source import Source, check_same_model, config_from_saved, resolve
from t5x_like.config import RunSpec
from t5x_like.errors import ConfigError, UserError


def load_config(config_path: str, overrides) -> ml_collections.ConfigDict:
    """A config file with ``--config.KEY=VALUE`` overrides, in the sectioned layout."""
    loaded = config.load_config_file(config_path)
    config.apply_overrides(loaded, overrides)
    return loaded


def load_and_validate(config_path: str, overrides) -> RunSpec:
    """The checked spec of a config file and its overrides (its task and evaluators found)."""
    return resolve_spec(load_config(config_path, overrides))


def resolve_spec(run_config) -> RunSpec:
    """The spec of a config (or spec), checked against the registries: the task and every
    benchmark evaluator's mixture exist, a head's labels are its task's, and the family's
    structure can do what the run asks (``structures.check_run``)."""
    from t5x_like import structures
    from t5x_like.data import get_task_or_mixture
    spec = config.spec_of(run_config)
    names = [("task", spec.task)] + [(f"evals.{name}.mixture", settings.mixture)
                                     for name, settings in spec.evals.items()
                                     if settings.kind == "benchmark"]
    for key, name in names:
        try:
            get_task_or_mixture(name)
        except KeyError as e:
            raise ConfigError(f"{key}: {e.args[0]} Register it with TaskRegistry.add in your "
                              "module and load it with --module=YOUR.MODULE.") from None
    structures.check_run(spec)
    return with_head_labels(spec)


def with_head_labels(spec: RunSpec) -> RunSpec:
    """``head.labels`` from the task when the spec leaves them empty, so the saved run
    config names the labels the head's outputs mean (eval and infer read them there)."""
    from t5x_like.data import dataset_providers as dp
    from t5x_like.data import head_features
    head = spec.head
    if not head.kind:
        return spec
    provider = dp.get_task_or_mixture(spec.task)
    if isinstance(provider, dp.Mixture):
        raise ConfigError(
            f"head.kind={head.kind!r} trains one head on one task's labels; task "
            f"{spec.task!r} is a mixture. Fine-tune a head per task (--config.task=NAME).")
    if head.kind in ("classification", "token_classification") and not head.labels:
        try:
            labels = tuple(head_features.labels_from_task(provider, head.kind))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return spec.replace(head=head.replace(labels=labels))
    return spec


# -- vocabularies ---------------------------------------------------------------------------

def checkpoint_vocabulary(source: Source, saved: dict):
    """The vocabulary a checkpoint was trained with, when known: the tokenizer a
    pretrained folder carries (``convert import``), the tokenizer a run fine-tuned with
    (copied into its workdir), else the vocabulary of the task the run trained on."""
    from t5x_like.convert.pretrained import TOKENIZER_FOLDER
    from t5x_like.data import hf_tokenizers
    folder = source.path if source.kind == "pretrained" else source.path.parent
    if (folder / TOKENIZER_FOLDER).is_dir():
        try:
            return hf_tokenizers.load(folder / TOKENIZER_FOLDER)
        except (FileNotFoundError, ValueError) as e:
            raise UserError(f"The tokenizer saved with the checkpoint does not load ({e}); "
                            "restore the folder's tokenizer files from where the model came "
                            "from.") from None
    trained_on = saved.get("task")
    if not trained_on:
        return None
    from t5x_like.data import dataset_providers as dp
    try:
        return dp.get_task_or_mixture(trained_on).vocabulary
    except KeyError:
        return None  # a task from a module not imported here: nothing to compare with


def asked_vocabulary(asked: str, source: Source | None, key: str):
    """What ``key`` (``vocabulary``, ``--vocabulary``) asks for: None/"" (each task's own),
    ``checkpoint`` (the tokenizer ``source`` was trained with) or a path (a tokenizer
    folder, ``tokenizer.json`` or ``.model``)."""
    if not asked:
        return None
    from t5x_like.data import hf_tokenizers
    if asked == "checkpoint":
        trained = checkpoint_vocabulary(source, source.saved_config(_newest_step(source)))
        if trained is None:
            raise UserError(
                f"{key}=checkpoint: {source.path} carries no tokenizer (no tokenizer/ folder "
                "and no training task to take one from). Re-import the model from a Hugging "
                "Face folder that has tokenizer.json, or give the tokenizer's path.")
        return trained
    try:
        return hf_tokenizers.load(asked)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(f"{key}={asked}: {e}") from None


def _newest_step(source: Source) -> int:
    steps = source.steps()
    return steps[-1] if steps else 0


def check_fits(spec, vocabulary, what: str, fix: str = "") -> None:
    """Refuses a vocabulary with more ids than the model's embedding table has rows."""
    from t5x_like.data import vocabularies
    vocabularies.check_fits(vocabulary, spec.model.vocab_size, what, fix or (
        "the tokenizer is not the model's. Use the tokenizer the model was trained with "
        "(--vocabulary=checkpoint)."))


def check_model_fits_vocabulary(spec, vocabulary) -> None:
    try:
        check_fits(spec, vocabulary, f"Task {spec.task!r}",
                   f"set --config.model.vocab_size={vocabulary.vocab_size} or larger.")
    except UserError as e:
        raise ConfigError(str(e)) from None
    pad_id = getattr(vocabulary, "pad_id", 0)
    model_pad = getattr(spec.model, "pad_id", pad_id)
    if pad_id is not None and model_pad != pad_id:
        raise ConfigError(
            f"model.pad_id={model_pad} but task {spec.task!r} pads with id {pad_id}; set "
            f"--config.model.pad_id={pad_id} (a model must mask the padding its data uses).")


def check_vocabulary(spec, task, trained, asked=None) -> None:
    """Refuses a task whose vocabulary does not fit the model, or is not the one the
    checkpoint was trained with (``trained``) unless the user asked for it (``asked``)."""
    from t5x_like.data import vocabularies
    check_fits(spec, task.vocabulary, f"Task {task.name!r}")
    if trained is None or asked is not None:
        return
    ours, theirs = vocabularies.describe(task.vocabulary), vocabularies.describe(trained)
    if ours != theirs:
        raise UserError(
            f"Task {task.name!r} tokenizes with {ours}, but the checkpoint was trained with "
            f"{theirs}. Pass --vocabulary=checkpoint to re-tokenize the task with the "
            "checkpoint's own tokenizer, or evaluate tasks that share its vocabulary.")


def check_task_steps(spec, vocabulary) -> None:
    """Every preprocessing step's own check (lengths, sentinels, a mask token) against
    this run's lengths and vocabulary, before anything is built: one message, exit 2."""
    from t5x_like.data import dataset_providers as dp
    provider = dp.with_vocabulary(dp.get_task_or_mixture(spec.task), vocabulary)
    for task in provider.tasks:
        try:
            task.check("train", dict(spec.task_feature_lengths))
        except ValueError as e:
            raise ConfigError(str(e)) from None


def keep_tokenizer(workdir, vocabulary) -> None:
    """The tokenizer travels with the run (``eval --vocabulary=checkpoint`` reads this
    copy): on disk written once, whole or not at all; in a bucket, where a folder cannot
    be renamed into place, copied again on every start from a complete local folder."""
    import shutil
    import tempfile

    from t5x_like.convert.pretrained import TOKENIZER_FOLDER
    from t5x_like.data import hf_tokenizers
    if storage.is_remote(workdir):
        with tempfile.TemporaryDirectory() as local:
            hf_tokenizers.write_tokenizer(vocabulary, pathlib.Path(local) / TOKENIZER_FOLDER)
            storage.copy_tree(pathlib.Path(local) / TOKENIZER_FOLDER, workdir / TOKENIZER_FOLDER)
        return
    if (workdir / TOKENIZER_FOLDER).is_dir():
        return
    partial = workdir / (TOKENIZER_FOLDER + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    hf_tokenizers.write_tokenizer(vocabulary, partial)
    partial.rename(workdir / TOKENIZER_FOLDER)


# -- a training run ----------------------------------------------------------------------

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
    teacher: Any = None            # distill.TeacherSource, checked, params not read

    @property
    def run_config(self) -> dict:
        """What every checkpoint saves beside the state: the spec, the resolved stream
        count and the fingerprint."""
        tree = self.spec.to_dict()
        tree["data"]["streams"] = self.num_streams
        return dict(tree, fingerprint=self.fingerprint)


def resolve_training(run_config, workdir: str, devices=None, process_count: int | None = None
                     ) -> TrainingRun:
    """Everything ``train`` checks, in order, none of it building state or compiling."""
    import jax

    from t5x_like import partitioning, run_guard
    from t5x_like import trainer as trainer_lib
    from t5x_like.data import get_task_or_mixture
    from t5x_like.evaluation import in_training
    spec = resolve_spec(run_config)
    storage.check_checkpoint_location(workdir, "--workdir")
    cli_flags.check_writable_folder(workdir)
    process_count = jax.process_count() if process_count is None else process_count
    _check_local_dir(spec, process_count)
    asked = _config_vocabulary(spec)
    vocabulary = asked or get_task_or_mixture(spec.task).vocabulary
    check_model_fits_vocabulary(spec, vocabulary)
    check_task_steps(spec, asked)
    evaluators = _prepared_evaluators(in_training, spec, asked)
    devices = jax.devices() if devices is None else list(devices)
    mesh_shape = config.check_devices(spec, len(devices), process_count,
                                      partitioning.num_slices(devices))
    trainer = trainer_lib.build_trainer(spec, partitioning.make_mesh(mesh_shape, devices))
    check_peft_fits(spec, trainer.abstract_state.params)
    fingerprint = run_guard.fingerprint(spec, vocabulary, trainer.abstract_state.opt_state)
    teacher = _checked_teacher(spec, vocabulary, trainer)
    _check_init_from(spec)
    resume = _checked_resume(spec, storage.path(workdir), fingerprint)
    num_streams = config.resolve_data_streams(spec, process_count,
                                              resume.saved if resume else None)
    return TrainingRun(spec, storage.path(workdir), asked, vocabulary, devices, mesh_shape,
                       trainer, fingerprint, num_streams, resume, evaluators, teacher)


def _config_vocabulary(spec):
    """``vocabulary``: "" (the task's), ``checkpoint`` (what ``init_from`` carries) or a path."""
    try:
        source = resolve(spec.init_from, "init_from") if spec.vocabulary == "checkpoint" else None
        return asked_vocabulary(spec.vocabulary, source, "vocabulary")
    except UserError as e:
        raise ConfigError(f"vocabulary={spec.vocabulary!r}: {e}") from None


def _prepared_evaluators(in_training, spec, vocabulary) -> dict:
    """Each evaluator's ``prepare`` (its mixture found, its packages installed, its harness
    tasks loaded); a problem names its key."""
    prepared = {}
    for name, settings in spec.evals.items():
        if not settings.every_steps:
            continue
        try:
            prepared[name] = in_training.KINDS[settings.kind].prepare(name, settings, spec,
                                                                      vocabulary)
        except UserError as e:
            raise ConfigError(f"evals.{name}: {e}") from None
    return prepared


def _check_local_dir(spec, process_count: int) -> None:
    """``checkpoint.local_dir``: single-process, and a folder this process can write."""
    local = spec.checkpoint.local_dir
    if not local:
        return
    if process_count > 1:
        raise ConfigError(
            f"checkpoint.local_dir is single-process for now ({process_count} processes: each "
            "host's disk would hold only its own shards); leave it empty to save to the "
            "workdir.")
    try:
        cli_flags.check_writable_folder(local, "checkpoint.local_dir")
    except UserError as e:
        raise ConfigError(str(e)) from None


def check_peft_fits(spec, params) -> None:
    """PEFT settings the model cannot honour, refused naming what there is: a LoRA
    pattern that matches no kernel, a prompt longer than the learned positions leave
    room for, BitFit on a model without biases."""
    from t5x_like import structures
    from t5x_like.trainer import flat_with_paths
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


def _checked_teacher(spec, vocabulary, trainer):
    """Distillation's teacher: its config read and checked against the student, and the
    student's start from its layers checked on shapes (its params are read later)."""
    if not spec.distill.teacher:
        return None
    from t5x_like import distill
    try:
        teacher = distill.teacher_source(spec)
        distill.check_teacher(spec, teacher, vocabulary)
        if spec.distill.student_init == "teacher_layers":
            distill.check_student_init(teacher, trainer.abstract_state.params)
    except UserError as e:
        raise ConfigError(str(e)) from None
    return teacher


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


def _checked_resume(spec, workdir, fingerprint: dict) -> Resume | None:
    """The newest step of the workdir (or its local tier) whose config reads, checked
    against this run's fingerprint. A damaged newer step is left to the restore, which
    moves it aside."""
    from t5x_like import run_guard
    for step, saved in _saved_configs_newest_first(spec, workdir):
        changed = run_guard.check_resume(saved, fingerprint,
                                         spec.checkpoint.allow_resume_changes)
        layout = config.migrated(saved)[0]
        return Resume(step, dict(layout, fingerprint=saved.get("fingerprint"),
                                 peft_base=saved.get("peft_base")), changed)
    return None


def _saved_configs_newest_first(spec, workdir):
    """``(step, saved config)`` of the workdir's checkpoints whose config item reads,
    newest first, read straight from the step folders (``config/metadata``)."""
    from t5x_like import checkpointing
    folders = [workdir / "checkpoints"]
    if spec.checkpoint.local_dir:
        folders.insert(0, checkpointing.local_tier(spec.checkpoint.local_dir,
                                                   workdir / "checkpoints"))
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
            yield step, saved


# -- a checkpoint to evaluate ------------------------------------------------------------

@dataclasses.dataclass
class CheckpointRun:
    """What a checkpoint evaluates with: its spec, the vocabulary it was trained with
    (None: unknown) and the one asked for (None: each task's own)."""

    spec: RunSpec
    trained_vocabulary: Any
    asked_vocabulary: Any


def resolve_checkpoint(source: Source, step: int, config_path: str | None = None,
                       overrides=(), vocabulary: str | None = None,
                       vocabulary_flag: str = "--vocabulary") -> CheckpointRun:
    """The spec to build ``source``'s model with: ``--config`` (checked against what the
    checkpoint holds), else the one saved with the checkpoint; and its vocabularies."""
    saved = source.saved_config(step)
    spec = spec_for_checkpoint(source, saved, config_path, overrides)
    trained = checkpoint_vocabulary(source, saved)
    asked = None
    if vocabulary:
        asked = trained if vocabulary == "checkpoint" else asked_vocabulary(
            vocabulary, source, vocabulary_flag)
        if asked is None:
            raise UserError(
                f"{vocabulary_flag}=checkpoint: {source.path} carries no tokenizer (no "
                "tokenizer/ folder and no training task to take one from). Re-import the model "
                "from a Hugging Face folder that has tokenizer.json, or pass "
                f"{vocabulary_flag}=PATH to one.")
    return CheckpointRun(spec, trained, asked)


def spec_for_checkpoint(source: Source, saved: dict, config_path: str | None = None,
                        overrides=()) -> RunSpec:
    from t5x_like import structures
    if config_path:
        spec = resolve_spec(load_config(config_path, overrides))
        check_same_model(saved, spec, source=str(source.path))
        return spec
    if source.kind == "pretrained":
        spec = _pretrained_spec(saved)
    else:
        spec = config_from_saved(saved)
    structure = structures.structure_class(spec.model.family)
    spec = structure.evaluate_as_trained(spec, config.migrated(saved)[0],
                                         imported=source.kind == "pretrained")
    if overrides:
        tree = config.as_config_dict(spec.to_dict())
        config.apply_overrides(tree, overrides)
        spec = config.spec_of(tree)
    return spec


def _pretrained_spec(saved: dict) -> RunSpec:
    """A pretrained folder's model at the default run settings, with the lengths (and
    what else of its run) the folder carries, else lengths that fit it."""
    from t5x_like import structures
    model = config.model_spec_of(saved["model"])
    tree = config.default_config().to_dict()
    tree["model"] = model.to_dict()
    for key, value in (saved.get("run") or {}).items():
        tree[key] = value
    spec = config.spec_of(tree)
    if "run" not in saved:
        fitted = structures.structure_class(model.family).pretrained_lengths(spec)
        if fitted is not None:
            spec = spec.replace(task_feature_lengths=config.FrozenMap(fitted))
    return spec
