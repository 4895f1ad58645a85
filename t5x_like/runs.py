"""Resolving a run before anything is built: its config (loaded, overridden, validated,
its tasks found), the labels of a task head, the vocabulary it tokenizes with (the
task's own, a checkpoint's tokenizer, or one at a path) and the checks between them
(the vocabulary fits the embedding table, a checkpoint holds this model, the task's
steps accept these lengths). Shared by ``train``, ``eval``, ``infer``, ``peft merge``,
distillation and ``convert export``; every refusal is a ``UserError`` (a
``ConfigError`` where a config key is at fault), raised before any compile.
"""

from __future__ import annotations

import pathlib

import ml_collections

from t5x_like import config_lib, storage
from t5x_like.checkpoints.source import Source, check_same_model, config_from_saved, resolve
from t5x_like.errors import ConfigError, UserError


def load_and_validate(config_path: str, overrides: list[str]):
    config = config_lib.load_config_file(config_path)
    config_lib.apply_overrides(config, overrides)
    config_lib.validate(config)
    from t5x_like.data import get_task_or_mixture
    for key in ("task", "eval.mixture"):
        name = config.task if key == "task" else config.eval.mixture
        if key == "eval.mixture" and not name:
            continue
        try:
            get_task_or_mixture(name)
        except KeyError as e:
            raise ConfigError(
                f"{key}: {e.args[0]} Register it with TaskRegistry.add in your module and load "
                "it with --module=YOUR.MODULE.") from None
    return config


def resolve_head_labels(config) -> None:
    """``head.labels`` from the task when the config leaves them empty, so the saved run
    config names the labels the head's outputs mean (eval and infer read them there)."""
    from t5x_like.data import dataset_providers as dp
    from t5x_like.data import head_features

    head = config.get("head")
    if head is None or not head.kind:
        return
    provider = dp.get_task_or_mixture(config.task)
    if isinstance(provider, dp.Mixture):
        raise ConfigError(
            f"head.kind={head.kind!r} trains one head on one task's labels; task "
            f"{config.task!r} is a mixture. Fine-tune a head per task (--config.task=NAME).")
    if head.kind in ("classification", "token_classification") and not head.labels:
        try:
            head.labels = tuple(head_features.labels_from_task(provider, head.kind))
        except ValueError as e:
            raise ConfigError(str(e)) from None


def run_vocabulary(config):
    """``config.vocabulary`` resolved: None (each task's own), the tokenizer ``init_from``
    carries (``checkpoint``), or the tokenizer at a path."""
    if not config.get("vocabulary"):
        return None
    from t5x_like.data import hf_tokenizers
    if config.vocabulary == "checkpoint":
        try:
            source = resolve(config.init_from)
            step = source.steps()[-1] if source.steps() else 0
            vocabulary = trained_vocabulary(source, source.saved_config(step))
        except UserError as e:
            raise ConfigError(f"vocabulary='checkpoint' with init_from="
                                         f"{config.init_from!r}: {e}") from None
        if vocabulary is None:
            raise ConfigError(
                f"vocabulary='checkpoint': init_from={config.init_from!r} carries no tokenizer "
                "(imported without one); re-import it from a folder with tokenizer.json or set "
                "--config.vocabulary=PATH.")
        return vocabulary
    try:
        return hf_tokenizers.load(config.vocabulary)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"vocabulary={config.vocabulary!r}: {e}") from None


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


def check_task_steps(config, vocabulary) -> None:
    """Every preprocessing step's own check (lengths, sentinels, a mask token) against
    this run's lengths and vocabulary, before anything is built: one message, exit 2."""
    from t5x_like.data import dataset_providers as dp
    provider = dp.with_vocabulary(dp.get_task_or_mixture(config.task), vocabulary)
    for task in provider.tasks:
        try:
            task.check("train", dict(config.task_feature_lengths))
        except ValueError as e:
            raise ConfigError(str(e)) from None


def check_model_fits_vocabulary(config, vocabulary) -> None:
    from t5x_like.data import vocabularies
    vocabularies.check_fits(vocabulary, config.model.vocab_size, f"Task {config.task!r}",
                            f"set --config.model.vocab_size={vocabulary.vocab_size} or larger.",
                            error=ConfigError)
    pad_id = getattr(vocabulary, "pad_id", 0)
    if pad_id is not None and config.model.get("pad_id", pad_id) != pad_id:
        raise ConfigError(
            f"model.pad_id={config.model.pad_id} but task {config.task!r} pads with id {pad_id}; "
            f"set --config.model.pad_id={pad_id} (a model must mask the padding its data uses).")


def trained_vocabulary(source: Source, saved: dict):
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


def resolve_vocabulary(value: str | None, source: Source, trained):
    """``--vocabulary``: None/"" (each task's own), ``checkpoint`` (``trained``, the
    tokenizer the checkpoint carries) or a path (a tokenizer folder, ``tokenizer.json``
    or ``.model``)."""
    if not value:
        return None
    from t5x_like.data import hf_tokenizers
    if value == "checkpoint":
        vocabulary = trained
        if vocabulary is None:
            raise UserError(
                f"--vocabulary=checkpoint: {source.path} carries no tokenizer (no tokenizer/ "
                "folder and no training task to take one from). Re-import the model from a "
                "Hugging Face folder that has tokenizer.json, or pass --vocabulary=PATH to one.")
        return vocabulary
    try:
        return hf_tokenizers.load(value)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(f"--vocabulary={value}: {e}") from None


def check_vocabulary(config, task, trained, asked=None) -> None:
    """Refuses a task whose vocabulary does not fit the model, or is not the one the
    checkpoint was trained with (``trained``) unless the user asked for it (``asked``)."""
    vocabulary = task.vocabulary
    check_fits(config, vocabulary, f"Task {task.name!r}")
    if trained is None or asked is not None:
        return
    if _describe(trained) != _describe(vocabulary):
        raise UserError(
            f"Task {task.name!r} tokenizes with {_describe(vocabulary)}, but the "
            f"checkpoint was trained with {_describe(trained)}. Pass "
            "--vocabulary=checkpoint to re-tokenize the task with the checkpoint's own "
            "tokenizer, or evaluate tasks that share its vocabulary.")


def check_fits(config, vocabulary, what: str) -> None:
    """Refuses a vocabulary with more ids than the model's embedding table has rows."""
    from t5x_like.data import vocabularies
    vocabularies.check_fits(vocabulary, config.model.vocab_size, what,
                            "the tokenizer is not the model's. Use the tokenizer the model was "
                            "trained with (--vocabulary=checkpoint).")


def _describe(vocabulary) -> str:
    from t5x_like.data import vocabularies  # imports JAX: not before a config is known good
    return vocabularies.describe(vocabulary)


def run_config(source: Source, step: int, config_path: str | None, overrides) -> ml_collections.ConfigDict:
    """The config to build the model with: ``--config`` (checked against what the
    checkpoint holds), else the config saved with the checkpoint."""
    saved = source.saved_config(step)
    if config_path:
        config = config_lib.load_config_file(config_path)
        config_lib.apply_overrides(config, overrides)
        config_lib.validate(config)
        check_same_model(saved, config, source=str(source.path))
        resolve_head_labels(config)
        return config
    from t5x_like import structures
    config = config_lib.default_config()
    if source.kind == "pretrained":
        config.model = config_lib.model_defaults(saved["model"]["family"])
        config.model.update({k: v for k, v in saved["model"].items() if k in config.model})
        fitted = structures.structure_class(config.model.family).pretrained_lengths(config)
        if fitted is not None:
            config.task_feature_lengths = fitted
    else:
        config = config_from_saved(saved)
    structures.structure_class(config.model.family).evaluate_as_trained(
        config, saved, imported=source.kind == "pretrained")
    config_lib.apply_overrides(config, overrides)
    config_lib.validate(config)
    return config
