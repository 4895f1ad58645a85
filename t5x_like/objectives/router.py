"""The routers' terms of a mixture-of-experts objective: what the sparse layers sow
(``models.moe``, the ``router`` collection) averaged over those layers, as the term
added to the objective and the step's metrics.

A loop of layers sows one value per layer; a scanned stack one value with a leading
layer axis; both read the same here.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax.numpy as jnp
from flax import traverse_util

#: the collection ``models.moe`` sows into (named here too: objectives never import models)
COLLECTION = "router"


def _per_layer(sown: Mapping, name: str, vector: bool = False) -> jnp.ndarray:
    """Every layer's ``name``, stacked: ``[layers]`` (or ``[layers, E]`` for a ``vector``)."""
    found = []
    for key, values in traverse_util.flatten_dict(dict(sown)).items():
        if key[-1] != name:
            continue
        for value in values:  # sow keeps a tuple of what each call added
            value = jnp.asarray(value)
            found.append(value.reshape(-1, value.shape[-1]) if vector else value.reshape(-1))
    return jnp.concatenate(found)


def router_terms(state: Mapping) -> tuple[jnp.ndarray, dict]:
    """``(objective term, metrics)`` from a model's mutable state after ``apply``: the
    mean over sparse layers of each layer's weighted auxiliary loss, and the metrics
    ``moe_load_balancing_loss``, ``moe_router_z_loss``, ``moe_dropped_fraction`` and
    ``moe_expert_fraction_<e>`` (each expert's share of the assignments). A dense model
    sows nothing: ``(0, {})``."""
    sown = state.get(COLLECTION) if state else None
    if not sown:
        return jnp.zeros((), jnp.float32), {}
    metrics = {}
    for name in ("load_balancing_loss", "router_z_loss", "dropped_fraction"):
        metrics[f"moe_{name}"] = _per_layer(sown, name).mean()
    fractions = _per_layer(sown, "expert_fraction", vector=True).mean(axis=0)
    for expert, fraction in enumerate(fractions):
        metrics[f"moe_expert_fraction_{expert}"] = fraction
    return _per_layer(sown, "aux_loss").mean(), metrics
