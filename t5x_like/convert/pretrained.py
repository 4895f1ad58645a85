"""t5x_like's params-only checkpoint: ``model_config.json`` + an orbax ``params/`` tree,
and the tokenizer that goes with the model in ``tokenizer/`` (Hugging Face files).

This is what conversion writes and what fine-tuning or continued pretraining
starts from (the train state, optimizer included, lives in run checkpoints).
``metadata.json`` says where the folder came from and which tokenizer files it holds.
"""

from __future__ import annotations

import json
import pathlib
import tempfile

import jax
import numpy as np
import orbax.checkpoint as ocp

from t5x_like import storage
from t5x_like.errors import MissingFile, UserError

TOKENIZER_FOLDER = "tokenizer"


def check_new_folder(folder: str | pathlib.Path) -> None:
    """Refuses an ``--out`` that holds a checkpoint already (or a location checkpoints
    cannot go to), before any work."""
    storage.check_checkpoint_location(folder, "--out")
    folder = storage.path(folder)
    if (folder / "params").exists() or (folder / TOKENIZER_FOLDER).exists():
        raise UserError(f"{folder} holds a checkpoint already; choose a new --out folder "
                        "so nothing is overwritten.")


def save_pretrained(folder: str | pathlib.Path, model_config: dict, params, *,
                    vocabulary=None, tokenizer_from: str | pathlib.Path | None = None,
                    metadata: dict | None = None) -> None:
    """Writes the folder; the tokenizer is ``vocabulary`` written as Hugging Face files,
    or the tokenizer files copied from the Hugging Face folder ``tokenizer_from``."""
    from t5x_like.data import hf_tokenizers

    check_new_folder(folder)
    folder = storage.path(folder)
    target = folder / "params"
    if storage.is_remote(folder):
        # Built on disk, then uploaded with model_config.json last (the same promise).
        with tempfile.TemporaryDirectory() as local:
            save_pretrained(pathlib.Path(local) / "out", model_config, params,
                            vocabulary=vocabulary, tokenizer_from=tokenizer_from,
                            metadata=metadata)
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
    (folder / "model_config.json").write_text(json.dumps(model_config, indent=2, default=list))


def load_pretrained(folder) -> tuple[dict, dict]:
    """``(model_config, params)`` with params as host numpy arrays."""
    folder = storage.path(folder)
    config_path = folder / "model_config.json"
    if not config_path.is_file():
        raise MissingFile(f"{folder} is not a t5x_like pretrained folder (no "
                          "model_config.json); create one with `python -m t5x_like.convert import`.")
    model_config = json.loads(config_path.read_text())
    if "mlp_activations" in model_config:
        model_config["mlp_activations"] = tuple(model_config["mlp_activations"])
    with ocp.StandardCheckpointer() as checkpointer:
        params = checkpointer.restore(folder / "params")
    return model_config, jax.tree.map(np.asarray, params)
