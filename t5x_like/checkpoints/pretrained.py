"""t5x_like's params-only checkpoint: ``model_config.json`` (the model spec) + an orbax
``params/`` tree, and the tokenizer that goes with the model in ``tokenizer/`` (Hugging
Face files).

This is what conversion writes and what fine-tuning or continued pretraining
starts from (the train state, optimizer included, lives in run checkpoints).
``metadata.json`` says where the folder came from and which tokenizer files it holds.
A folder made from a run (``peft merge``) also carries ``run_config.json``: what of
the run evaluation reads (its task, feature lengths, how a decoder read its prompts,
its head), so ``eval`` of the folder gives the run's own numbers without flags.
"""

from __future__ import annotations

import json
import pathlib
import tempfile

import jax
import numpy as np
import orbax.checkpoint as ocp

from t5x_like.data import hf_tokenizers
from t5x_like.errors import MissingFile, UserError
from t5x_like.system import storage

TOKENIZER_FOLDER = "tokenizer"


def check_new_folder(folder: str | pathlib.Path) -> None:
    """Refuses an ``--out`` that holds a checkpoint already (or a location checkpoints
    cannot go to), before any work."""
    storage.check_checkpoint_location(folder, "--out")
    folder = storage.path(folder)
    if (folder / "params").exists() or (folder / TOKENIZER_FOLDER).exists():
        raise UserError(f"{folder} holds a checkpoint already; choose a new --out folder "
                        "so nothing is overwritten.")


RUN_CONFIG = "run_config.json"
# What of a run travels with a folder made from it (the rest is training's own).
RUN_KEYS = ("task", "task_feature_lengths", "batch_size", "data", "head")


def save_pretrained(folder: str | pathlib.Path, model_config: dict, params, *,
                    vocabulary=None, tokenizer_from: str | pathlib.Path | None = None,
                    metadata: dict | None = None, run: dict | None = None) -> None:
    """Writes the folder; the tokenizer is ``vocabulary`` written as Hugging Face files,
    or the tokenizer files copied from the Hugging Face folder ``tokenizer_from``;
    ``run``: the run config it comes from (its ``RUN_KEYS`` are kept)."""
    check_new_folder(folder)
    folder = storage.path(folder)
    target = folder / "params"
    if storage.is_remote(folder):
        # Built on disk, then uploaded with model_config.json last (the same promise).
        with tempfile.TemporaryDirectory() as local:
            save_pretrained(pathlib.Path(local) / "out", model_config, params,
                            vocabulary=vocabulary, tokenizer_from=tokenizer_from,
                            metadata=metadata, run=run)
            storage.copy_tree(pathlib.Path(local) / "out", folder, last=("model_config.json",))
        return
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # The tokenizer first (the step most likely to fail), model_config.json last: a
    # folder is a pretrained folder only once everything is in it.
    files = []
    if tokenizer_from is not None:
        files = hf_tokenizers.copy_tokenizer(tokenizer_from, folder / TOKENIZER_FOLDER)
    elif vocabulary is not None:
        files = hf_tokenizers.write_tokenizer(vocabulary, folder / TOKENIZER_FOLDER)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(target, jax.tree.map(np.asarray, params))
    info = dict(metadata or {})
    info["tokenizer"] = {"folder": TOKENIZER_FOLDER, "files": files} if files else None
    (folder / "metadata.json").write_text(json.dumps(info, indent=2))
    if run is not None:
        kept = {key: run[key] for key in RUN_KEYS if key in run}
        (folder / RUN_CONFIG).write_text(json.dumps(kept, indent=2, default=_plain))
    (folder / "model_config.json").write_text(json.dumps(model_config, indent=2, default=_plain))


def _plain(value):
    """JSON of a spec's sections (and ConfigDicts): their dicts; tuples as lists."""
    to_dict = getattr(value, "to_dict", None)
    return to_dict() if callable(to_dict) else list(value)


def load_pretrained(folder) -> tuple[dict, dict]:
    """``(model_config, params)`` with params as host numpy arrays (``model_config`` as
    the folder holds it: the sectioned spec, or the flat keys of older folders)."""
    folder = storage.path(folder)
    config_path = folder / "model_config.json"
    if not config_path.is_file():
        raise MissingFile(f"{folder} is not a t5x_like pretrained folder (no "
                          "model_config.json); create one with `python -m t5x_like.convert import`.")
    model_config = json.loads(config_path.read_text())
    with ocp.StandardCheckpointer() as checkpointer:
        params = checkpointer.restore(folder / "params")
    return model_config, jax.tree.map(np.asarray, params)
