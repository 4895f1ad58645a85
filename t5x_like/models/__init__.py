"""The families' Flax modules (``t5``, ``bart``, ``decoder``, ``encoder``, ``electra``,
``bilm``) and what they share. Which module a ``model.family`` builds, and with which
structure, is the family registry's (``t5x_like.structures.families``)."""

from __future__ import annotations

import numpy as np


def example_inputs(model, lengths: dict | None = None, batch_size: int = 1) -> tuple:
    """Positional inputs that ``model.init`` needs, as int32 ones (shapes only matter):
    one per feature the model's class names in ``init_features``, at its length in
    ``lengths`` (8 where absent). NumPy, not jax.numpy: a concrete device array would
    compile a fill on the backend, and ``jax.eval_shape`` over these must compile
    nothing (a run is resolved before anything expensive)."""
    lengths = lengths or {}
    return tuple(np.ones((batch_size, lengths.get(name, 8)), np.int32)
                 for name in type(model).init_features)
