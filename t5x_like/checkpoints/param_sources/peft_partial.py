"""Parameter-efficient runs on disk: checkpoints that hold only what trains, and the
base they need.

A run with ``config.peft`` (LoRA, adapters, BitFit) and ``init_from`` saves, at every
checkpoint, only its trainable parameters (and their optimizer state) plus the base's
identity under ``peft_base`` in the saved config: the ``init_from`` path, the step
read from it (a run's workdir moves on) and a SHA-256 digest of the base's params.
Resume, ``eval`` and ``infer`` read the base back from that path and refuse one whose
digest differs. Without ``init_from`` the base is a random init found nowhere else, so
the whole model is saved as usual.
"""

from __future__ import annotations

import hashlib

import numpy as np

from t5x_like.system import storage

# Imports inside functions: keep JAX out of the commands' start-up: this module is imported
# before the config is read, and what needs JAX loads after it.

IDENTITY_KEY = "peft_base"


def saves_partial(config) -> bool:
    """Whether checkpoints of ``config``'s run hold only what trains."""
    from t5x_like.engine import trainer as trainer_lib
    return trainer_lib.trainable_for(config) is not None and bool(config.init_from)


def params_digest(params) -> str:
    """SHA-256 over every parameter's path, dtype, shape and bytes (host arrays)."""
    from t5x_like.engine import trainer as trainer_lib
    digest = hashlib.sha256()
    for path, leaf in sorted(trainer_lib.flat_with_paths(params), key=lambda item: item[0]):
        array = np.ascontiguousarray(np.asarray(leaf))
        digest.update(f"{path}:{array.dtype}:{array.shape};".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def base_identity(init_from: str, step: int | None, params) -> dict:
    return {"path": str(storage.path(init_from)), "step": step,
            "digest": params_digest(params)}


def trainable_only(params, trainable):
    """``params`` pruned to the leaves where ``trainable`` is true (nested dicts)."""
    if isinstance(params, dict) or hasattr(params, "items"):
        pruned = {}
        for key, value in params.items():
            sub = trainable_only(value, trainable[key])
            if sub is not None:
                pruned[key] = sub
        return pruned or None
    return params if trainable else None


def saved_view(state, trainer):
    """What a checkpoint of a partial-saving run holds: the state with frozen params dropped."""
    return state.replace(params=trainable_only(state.params, trainer.trainable) or {})


def abstract_saved_state(trainer):
    return saved_view(trainer.abstract_state, trainer)


