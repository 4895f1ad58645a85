"""What ``eval`` and ``infer`` load: checkpoints of a run, one step, or a pretrained folder.

``--checkpoint`` may be a training workdir (every complete step, oldest first), one
step folder (``<workdir>/checkpoints/<step>``) or a params-only pretrained folder
(``model_config.json`` + ``params/``, from ``convert import``). Checkpoints are
opened read-only: evaluation never writes into, cleans or rotates them.
"""

from __future__ import annotations

import dataclasses
import json

import ml_collections
from etils import epath

from t5x_like import config_lib, storage
from t5x_like.errors import ConfigError, UserError


@dataclasses.dataclass(frozen=True)
class Source:
    kind: str                         # "run" | "pretrained"
    path: epath.Path                  # the checkpoints/ folder, or the pretrained folder
    only_step: int | None = None      # a single step folder was given

    def steps(self) -> list[int]:
        if self.kind == "pretrained":
            return [0]
        if self.only_step is not None:
            return [self.only_step]
        return self.open_checkpointer().all_steps()

    def open_checkpointer(self):
        """A read-only checkpointer over the run's steps (close it after use)."""
        from t5x_like import checkpointing
        return checkpointing.Checkpointer(self.path, keep=1, async_save=False, read_only=True)

    def saved_config(self, step: int) -> dict:
        """The run config saved with ``step`` (pretrained folders: their model only)."""
        if self.kind == "pretrained":
            return {"model": json.loads((self.path / "model_config.json").read_text())}
        checkpointer = self.open_checkpointer()
        try:
            return checkpointer.restore_config(step)
        except Exception as e:  # noqa: BLE001 - an unreadable config item is damage
            from t5x_like.checkpointing import one_line
            raise UserError(f"Checkpoint {self.path / str(step)} has no readable config "
                            f"({one_line(e)}); evaluate another step.") from None
        finally:
            checkpointer.close()

    def restore_params(self, step: int, trainer):
        """Params of ``step`` on the trainer's mesh and shardings."""
        if self.kind == "pretrained":
            from t5x_like.convert import pretrained
            _, params = pretrained.load_pretrained(self.path)
            try:
                return trainer.place_params(params)
            except ValueError as e:
                raise UserError(f"{self.path}: {e}") from None
        from t5x_like import checkpointing, peft
        folder = self.path / str(step)
        problem = checkpointing.manifest_problem(folder)
        if problem is not None:
            raise UserError(f"Checkpoint {folder} is damaged ({problem}); evaluate another "
                            "step, or resume training, which moves it aside.")
        saved = self.saved_config(step)
        checkpointer = self.open_checkpointer()
        try:
            state, _ = peft.restore_state(checkpointer, step, trainer, saved,
                                          config_from_saved(saved), where=str(folder))
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - a read failure is the checkpoint's, not ours
            raise UserError(f"Checkpoint {folder} does not restore ({checkpointing.one_line(e)}); "
                            "evaluate another step, or resume training, which moves a damaged "
                            "step aside.") from None
        finally:
            checkpointer.close()
        return state.params


def base_params(init_from: str, config, mesh, step: int | None = None) -> tuple[dict, int | None]:
    """``(host params, step)`` of what fine-tuning starts from: a params-only folder
    (``convert import``; step None), or a run's workdir or step folder (its newest
    step, or ``step``), checked to hold ``config``'s model."""
    import jax

    from t5x_like import trainer as trainer_lib
    from t5x_like.convert import pretrained
    from t5x_like.train import _check_same_model

    try:
        source = resolve(init_from)
    except UserError:
        raise ConfigError(
            f"init_from={init_from!r} is not a pretrained folder (no model_config.json), "
            "a training workdir or a checkpoint step folder; point it at the --out folder of "
            "`python -m t5x_like.convert import` or at a run's workdir.") from None
    if source.kind == "pretrained":
        model_config, params = pretrained.load_pretrained(source.path)
        _check_same_model({"model": model_config}, config, source=f"init_from={init_from!r}")
        return params, None
    steps = source.steps()
    if not steps:
        raise ConfigError(f"init_from={init_from!r} holds no complete checkpoint yet.")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise UserError(f"init_from={init_from!r} no longer holds step {step} (it has "
                        f"{steps}); restore that step or use the base it was trained on.")
    saved = source.saved_config(step)
    _check_same_model(saved, config, source=f"init_from={init_from!r}")
    saved_config = run_config(source, step, None, [])
    params = source.restore_params(step, trainer_lib.build_trainer(saved_config, mesh))
    return jax.device_get(params), step


def resolve(path: str, flag: str = "--checkpoint") -> Source:
    """Where ``path`` (given as ``flag``, which error messages name) keeps its params."""
    storage.check_checkpoint_location(path, flag)
    folder = storage.path(path)
    if not folder.exists():
        raise UserError(f"{flag}={path}: no such folder. Pass a training workdir, one of "
                        "its checkpoints/<step> folders, or a `convert import` output folder.")
    if (folder / "model_config.json").is_file():
        return Source("pretrained", folder)
    if (folder / "checkpoints").is_dir():
        return Source("run", folder / "checkpoints")
    if folder.name.isdigit() and (folder / "state").is_dir():
        return Source("run", folder.parent, only_step=int(folder.name))
    if folder.name == "checkpoints" and any(p.name.isdigit() for p in folder.iterdir()):
        return Source("run", folder)
    raise UserError(f"{flag}={path} is not a training workdir (no checkpoints/), a "
                    "checkpoint step folder (no state/) or a pretrained folder (no "
                    "model_config.json).")


def run_config(source: Source, step: int, config_path: str | None, overrides) -> ml_collections.ConfigDict:
    """The config to build the model with: ``--config`` (checked against what the
    checkpoint holds), else the config saved with the checkpoint."""
    saved = source.saved_config(step)
    if config_path:
        config = config_lib.load_config_file(config_path)
        config_lib.apply_overrides(config, overrides)
        config_lib.validate(config)
        from t5x_like.train import _check_same_model
        _check_same_model(saved, config, source=str(source.path))
        from t5x_like.train import resolve_head_labels
        resolve_head_labels(config)
        return config
    config = config_lib.default_config()
    if source.kind == "pretrained":
        config.model = config_lib.model_defaults(saved["model"]["family"])
        config.model.update({k: v for k, v in saved["model"].items() if k in config.model})
        from t5x_like import models
        width = config.model.get("max_length") or 0
        if (models.structure(config.model.family) == "decoder" and width
                and sum(config.task_feature_lengths.values()) > width):
            # The default lengths do not fit a small decoder's learned positions: a
            # prompt of 3/4 of them and a continuation of the rest (--inputs_length and
            # --targets_length change it; k-shot scoring reads their sum).
            config.task_feature_lengths = {"inputs": width - width // 4, "targets": width // 4}
    else:
        config = config_from_saved(saved)
    config_lib.apply_overrides(config, overrides)
    config_lib.validate(config)
    return config


def config_from_saved(saved: dict) -> ml_collections.ConfigDict:
    """The config a run's checkpoint was saved with, keys added since taken from the
    defaults (the run fingerprint and a PEFT run's base identity saved beside it are
    not config keys)."""
    saved = {k: v for k, v in saved.items() if k not in ("fingerprint", "peft_base")}
    return ml_collections.ConfigDict(_fill_defaults(saved, config_lib.default_config().to_dict()))


def _fill_defaults(saved: dict, defaults: dict) -> dict:
    """A saved config with keys added since it was written taken from the defaults."""
    out = dict(defaults)
    for key, value in saved.items():
        # The model and the task lengths are the run's own: no default keys join them
        # (a default "inputs" length would turn a decoder LM into a prefix LM).
        if (isinstance(value, dict) and isinstance(defaults.get(key), dict)
                and key not in ("model", "task_feature_lengths")):
            out[key] = _fill_defaults(value, defaults[key])
        else:
            out[key] = value
    return out


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
    if vocabulary_fingerprint(trained) != vocabulary_fingerprint(vocabulary):
        raise UserError(
            f"Task {task.name!r} tokenizes with {vocabulary_fingerprint(vocabulary)}, but the "
            f"checkpoint was trained with {vocabulary_fingerprint(trained)}. Pass "
            "--vocabulary=checkpoint to re-tokenize the task with the checkpoint's own "
            "tokenizer, or evaluate tasks that share its vocabulary.")


def check_fits(config, vocabulary, what: str) -> None:
    """Refuses a vocabulary with more ids than the model's embedding table has rows."""
    size = vocabulary.vocab_size
    if size > config.model.vocab_size:
        raise UserError(f"{what} tokenizes with {vocabulary_fingerprint(vocabulary)}, {size} "
                        "token ids, but the checkpoint's embedding table has vocab_size="
                        f"{config.model.vocab_size} rows: the tokenizer is not the model's. Use "
                        "the tokenizer the model was trained with (--vocabulary=checkpoint).")


def vocabulary_fingerprint(vocabulary) -> str:
    """What identifies a vocabulary: its class, size and model file (and the content
    hash of a Hugging Face tokenizer, whose file is always tokenizer.json)."""
    from t5x_like.data import vocabularies
    model_path = vocabularies.model_file(vocabulary)
    where = f" {storage.path(model_path).name}" if model_path else ""
    digest = getattr(vocabulary, "content_sha256", None)
    if digest:
        where += f" sha256:{digest[:12]}"
    return f"{vocabularies.kind(vocabulary)}({vocabulary.vocab_size}{where})"
