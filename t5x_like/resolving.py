"""Resolving a run's spec before anything runs, for every command: the config file and
its overrides to the checked spec (``resolve_spec``), the vocabularies (the one a
checkpoint was trained with, the one asked for, whether they fit), and the spec a
checkpoint evaluates with (``resolve_checkpoint``: ``eval``, ``infer``, the harness,
``embed``, ``convert export``). A training run resolves on top of this
(``preflight.resolve_training``).
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
import tempfile
from typing import Any

import ml_collections

from t5x_like import config
from t5x_like.checkpoints.param_sources.source import Source, check_same_model, config_from_saved
from t5x_like.config import RunSpec
from t5x_like.errors import ConfigError, UserError
from t5x_like.system import storage

# Imports inside functions: keep JAX out of the commands' start-up: this module is imported
# before the config is read, and what needs JAX loads after it.


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
    benchmark evaluator's mixture exist, the family's structure can do what the run asks
    (``structures.check_run``), and the run's modes complete it (a head's labels are its
    task's)."""
    from t5x_like import structures
    from t5x_like.data import get_task_or_mixture
    spec = config.spec_of(run_config)
    names = [("task", spec.task)] + [(f"evals.{name}.mixture", settings.mixture)
                                     for name, settings in spec.evals.items()
                                     if settings.kind == "benchmark" and settings.enabled]
    for key, name in names:
        try:
            get_task_or_mixture(name)
        except KeyError as e:
            raise ConfigError(f"{key}: {e.args[0]} Register it with TaskRegistry.add in your "
                              "module and load it with --module=YOUR.MODULE.") from None
    structures.check_run(spec)
    return structures.mode_structures.completed(spec)  # e.g. a head's labels from its task


# -- vocabularies ---------------------------------------------------------------------------

def checkpoint_vocabulary(source: Source, saved: dict):
    """The vocabulary a checkpoint was trained with, when known: the tokenizer a
    pretrained folder carries (``convert import``), the tokenizer a run fine-tuned with
    (copied into its workdir), else the vocabulary of the task the run trained on."""
    from t5x_like.checkpoints.pretrained import TOKENIZER_FOLDER
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


def saved_start_id(saved: dict | None) -> int | None:
    """The id a saved run's rows started with (``model.bos_id`` of its config; one saved
    before the key existed started with 0), for a resume or an ``init_from`` to keep
    (``Structure.with_start_id``); None without a saved config."""
    if saved is None:
        return None
    return max(int(config.migrated(saved)[0].get("model", {}).get("bos_id", 0)), 0)


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
    from t5x_like.checkpoints.pretrained import TOKENIZER_FOLDER
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
        spec = structures.structure_class(spec.model.family).with_start_id(
            spec, None, saved_start_id(saved))
        check_same_model(saved, spec, source=str(source.path))
        return spec
    if source.kind == "pretrained":
        spec = _pretrained_spec(saved)
    else:
        spec = config_from_saved(saved)
    structure = structures.structure_class(spec.model.family)
    spec = structure.evaluate_as_trained(spec, config.migrated(saved)[0],
                                         imported=source.kind == "pretrained")
    spec = structures.mode_structures.as_trained_model(spec)  # e.g. a DPO policy: a causal decoder
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
