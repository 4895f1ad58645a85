"""Where retrieval runs start from and what they leave: a pretrained run's params
(read through ``analysis.hidden_states.load``, the loader ``embed`` uses), and the
run's own params as one msgpack file with a JSON description beside it.

One file rather than orbax: these runs are minutes long and never resumed
mid-way; the description (``run.json``) says which configs rebuild the networks.
"""

from __future__ import annotations

import json
import pathlib

import flax.serialization
import jax
import numpy as np

from t5x_like.analysis import hidden_states
from t5x_like.errors import UserError

PARAMS_FILE = "params.msgpack"
RUN_FILE = "run.json"


def pretrained(checkpoint: str, family_structure: str, flag: str):
    """``(model config dict, host params, vocabulary)`` of a run's newest step or a
    pretrained folder, checked to be the structure asked for; ``flag`` is the option
    that named it (error messages say which to fix)."""

    loaded = hidden_states.load(checkpoint, flag=flag)
    if loaded.structure != family_structure:
        raise UserError(f"{flag}={checkpoint} holds a {loaded.config.model.family} model; this needs "
                        f"an {family_structure} checkpoint.")
    return loaded.config.model.to_dict(), loaded.params, loaded.vocabulary


def save(workdir, params, run: dict) -> None:
    folder = pathlib.Path(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    host = jax.tree.map(np.asarray, jax.device_get(params))
    (folder / PARAMS_FILE).write_bytes(flax.serialization.msgpack_serialize(host))
    (folder / RUN_FILE).write_text(json.dumps(run, indent=2, default=str) + "\n")


def load(workdir) -> tuple[dict, dict]:
    """``(params, run description)`` of a retrieval run."""

    folder = pathlib.Path(workdir)
    if not (folder / PARAMS_FILE).is_file():
        raise UserError(f"{workdir} holds no {PARAMS_FILE}: not a finished retrieval run.")
    params = flax.serialization.msgpack_restore((folder / PARAMS_FILE).read_bytes())
    return params, json.loads((folder / RUN_FILE).read_text())
