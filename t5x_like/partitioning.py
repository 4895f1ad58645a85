"""The one place that decides sharding: mesh from config, logical-axis rules, shardings.

Models name axes logically; a rule set maps each logical name to mesh axes.
Changing strategy (data parallel, FSDP, FSDP + tensor) is a config change.
"""

from __future__ import annotations

from typing import Mapping

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Each rule: logical name -> mesh axis (or tuple of axes, or None = replicated).
RULE_SETS: dict[str, tuple[tuple[str, object], ...]] = {
    "data_parallel": (
        ("batch", BATCH_AXES),
    ),
    # ZeRO-3-like: parameters sharded along their embed dimension over fsdp.
    "fsdp": (
        ("batch", BATCH_AXES),
        ("embed", "fsdp"),
    ),
    # FSDP plus Megatron-style tensor parallelism over heads, MLP and vocabulary.
    "fsdp_tensor": (
        ("batch", BATCH_AXES),
        ("embed", "fsdp"),
        ("vocab", "tensor"),
        ("mlp", "tensor"),
        ("heads", "tensor"),
    ),
}


def axis_rules(name: str) -> tuple[tuple[str, object], ...]:
    if name not in RULE_SETS:
        raise ValueError(f"Unknown partitioning.rules {name!r}; choose from {sorted(RULE_SETS)}.")
    return RULE_SETS[name]


def make_mesh(shape: Mapping[str, int], devices=None) -> Mesh:
    """Mesh over ``devices`` (default: all) with the resolved ``shape`` per axis."""
    devices = jax.devices() if devices is None else devices
    sizes = tuple(int(shape[axis]) for axis in MESH_AXES)
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(f"Mesh {dict(zip(MESH_AXES, sizes))} needs {int(np.prod(sizes))} "
                         f"devices, got {len(devices)}.")
    # Auto axes: XLA propagates shardings from the annotations the model provides.
    return jax.make_mesh(sizes, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                         devices=devices)


def logical_shardings(boxed_tree, mesh: Mesh, rules):
    """NamedShardings for a tree of ``nn.LogicallyPartitioned`` (from ``jax.eval_shape``)."""
    specs = nn.get_partition_spec(boxed_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Batch dimension over the data-parallel axes, everything else replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Process-local numpy rows -> global ``jax.Array``s sharded over the batch axes."""
    sharding = batch_sharding(mesh)
    return {key: jax.make_array_from_process_local_data(sharding, value)
            for key, value in local_batch.items()}
