"""Reading and writing Hugging Face checkpoint folders: ``config.json`` + safetensors.

Pickle-based ``pytorch_model.bin`` files are refused: unpickling can run code
from the file, safetensors cannot.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from t5x_like.errors import MissingFile, UserError, install_hint
from t5x_like.system import progress

# Imports inside functions: safetensors loads only when a checkpoint is read or written in
# that format.


def _safetensors_numpy():
    try:
        from safetensors import numpy as st_numpy
    except ImportError as e:
        raise ImportError("Checkpoint conversion needs the safetensors package: "
                          f"{install_hint('hf')}") from e
    return st_numpy


def read_config(folder: str | pathlib.Path, flag: str = "--hf_dir") -> dict:
    path = pathlib.Path(folder) / "config.json"
    if not pathlib.Path(folder).is_dir():
        raise MissingFile(f"{flag}={folder}: no such folder; point {flag} at a Hugging Face "
                          "model folder (the one save_pretrained writes).")
    if not path.is_file():
        raise MissingFile(f"{folder} has no config.json; point {flag} at a Hugging Face "
                          "model folder (the one save_pretrained writes).")
    config = _read_json(path)
    if not isinstance(config, dict):
        raise UserError(f"{path} holds a JSON {type(config).__name__}, not an object; a Hugging "
                        "Face config.json is an object like {\"model_type\": \"gpt2\", ...}.")
    return config


def _read_json(path: pathlib.Path):
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); re-save the model with "
                        "save_pretrained or fix the file.") from None


def _load_safetensors(path: pathlib.Path, st_numpy) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise MissingFile(f"{path} is listed in the folder's index but missing; copy the "
                          "whole model folder.")
    try:
        return st_numpy.load_file(str(path))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type
        raise UserError(f"{path} is not a readable safetensors file ({type(e).__name__}: {e}); "
                        "it may be truncated or not safetensors at all. Download or copy it "
                        "again.") from None


def read_weights(folder: str | pathlib.Path) -> dict[str, np.ndarray]:
    """All tensors of the folder as float32/int numpy arrays, by Hugging Face name."""
    folder = pathlib.Path(folder)
    st_numpy = _safetensors_numpy()
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        listing = _read_json(index)
        weight_map = listing.get("weight_map") if isinstance(listing, dict) else None
        if not isinstance(weight_map, dict):
            raise UserError(f"{index} has no \"weight_map\" object; it is not a safetensors "
                            "index. Re-save the model with save_pretrained.")
        files = sorted(set(weight_map.values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        pickles = sorted(p.name for p in folder.glob("*.bin"))
        hint = (f" It has {', '.join(pickles)}: pickle files can execute code when loaded, so "
                "they are not read. Re-save the model with save_pretrained(..., "
                "safe_serialization=True) in a trusted environment.") if pickles else (
            " Save the model there with save_pretrained, which writes safetensors.")
        raise MissingFile(f"No model.safetensors in {folder}.{hint}")
    weights: dict[str, np.ndarray] = {}
    sizes = {name: (folder / name).stat().st_size if (folder / name).is_file() else 0
             for name in files}
    with progress.Meter(f"reading {folder.name}", sum(sizes.values()), "B",
                        from_first_advance=False) as meter:
        for name in files:
            for key, value in _load_safetensors(folder / name, st_numpy).items():
                weights[key] = value.astype(np.float32) if value.dtype.kind == "f" else value
            meter.advance(sizes[name])
    return weights


MAX_SHARD_BYTES = 5 * 2**30  # save_pretrained's default max_shard_size, "5GB"


def write_folder(folder: str | pathlib.Path, config: dict, weights: dict[str, np.ndarray],
                 max_shard_bytes: int = MAX_SHARD_BYTES) -> None:
    """``model.safetensors`` and ``config.json``; past ``max_shard_bytes``, shards
    ``model-0000i-of-0000n.safetensors`` with their ``model.safetensors.index.json``, as
    ``save_pretrained`` writes them (tensors in order, a shard closed before it would
    pass the limit), with the bytes written shown as they go."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shards, size = [[]], 0
    for name, value in weights.items():
        if shards[-1] and size + value.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += value.nbytes
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    total = sum(v.nbytes for v in weights.values())
    with progress.Meter(f"writing {folder.name}", total, "B", from_first_advance=False) as meter:
        for file, keys in zip(names, shards, strict=True):
            _safetensors_numpy().save_file({k: np.ascontiguousarray(weights[k]) for k in keys},
                                           str(folder / file), metadata={"format": "pt"})
            meter.advance(sum(weights[k].nbytes for k in keys))
    if len(shards) > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": {k: file for file, keys in zip(names, shards, strict=True)
                                for k in keys}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
