"""t5x_like's params-only checkpoint: ``model_config.json`` + an orbax ``params/`` tree.

This is what conversion writes and what fine-tuning or continued pretraining
starts from (the train state, optimizer included, lives in run checkpoints).
"""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import orbax.checkpoint as ocp


def save_pretrained(folder: str | pathlib.Path, model_config: dict, params) -> None:
    folder = pathlib.Path(folder).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "params"
    if target.exists():
        raise FileExistsError(f"{target} exists; choose a new --out folder so nothing is overwritten.")
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(target, jax.tree.map(np.asarray, params))
    (folder / "model_config.json").write_text(json.dumps(model_config, indent=2, default=list))


def load_pretrained(folder: str | pathlib.Path) -> tuple[dict, dict]:
    """``(model_config, params)`` with params as host numpy arrays."""
    folder = pathlib.Path(folder).absolute()
    config_path = folder / "model_config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder} is not a t5x_like pretrained folder (no "
                                "model_config.json); create one with `python -m t5x_like.convert import`.")
    model_config = json.loads(config_path.read_text())
    if "mlp_activations" in model_config:
        model_config["mlp_activations"] = tuple(model_config["mlp_activations"])
    with ocp.StandardCheckpointer() as checkpointer:
        params = checkpointer.restore(folder / "params")
    return model_config, jax.tree.map(np.asarray, params)
