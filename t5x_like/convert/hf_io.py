"""Reading and writing Hugging Face checkpoint folders: ``config.json`` + safetensors.

Pickle-based ``pytorch_model.bin`` files are refused: unpickling can run code
from the file, safetensors cannot.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np


def _safetensors_numpy():
    try:
        from safetensors import numpy as st_numpy
    except ImportError as e:
        raise ImportError("Checkpoint conversion needs the safetensors package: "
                          "pip install -c constraints.txt -e '.[hf]'") from e
    return st_numpy


def read_config(folder: str | pathlib.Path) -> dict:
    path = pathlib.Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json; point --hf_dir at a Hugging Face "
                                "model folder (the one save_pretrained writes).")
    return json.loads(path.read_text())


def read_weights(folder: str | pathlib.Path) -> dict[str, np.ndarray]:
    """All tensors of the folder as float32/int numpy arrays, by Hugging Face name."""
    folder = pathlib.Path(folder)
    st_numpy = _safetensors_numpy()
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        pickles = sorted(p.name for p in folder.glob("*.bin"))
        hint = (f" It has {', '.join(pickles)}: pickle files can execute code when loaded, so "
                "they are not read. Re-save the model with save_pretrained(..., "
                "safe_serialization=True) in a trusted environment.") if pickles else ""
        raise FileNotFoundError(f"No model.safetensors in {folder}.{hint}")
    weights: dict[str, np.ndarray] = {}
    for name in files:
        for key, value in st_numpy.load_file(str(folder / name)).items():
            weights[key] = value.astype(np.float32) if value.dtype.kind == "f" else value
    return weights


def write_folder(folder: str | pathlib.Path, config: dict, weights: dict[str, np.ndarray]) -> None:
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _safetensors_numpy().save_file(
        {k: np.ascontiguousarray(v) for k, v in weights.items()}, str(folder / "model.safetensors"),
        metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
