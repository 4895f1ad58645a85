"""The one place that decides sharding: mesh from config, logical-axis rules, shardings.

Models name axes logically; a rule set maps each logical name to mesh axes.
Changing strategy (data parallel, FSDP, FSDP + tensor) is a config change.
A multi-slice run (TPU slices joined by the data-center network, DCN) adds the
outer ``dcn`` axis: data parallelism across slices, every other axis inside a
slice, so only gradient all-reduces cross the slow network.
Multi-host runs join through :func:`initialize_distributed` before any device is used.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils, multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from t5x_like.errors import UserError

# Imports inside functions: a private JAX module, read only when a cluster is detected.

MESH_AXES = ("dcn", "stage", "data", "fsdp", "expert", "context", "tensor")
# The expert axis carries batch rows too outside the experts (as MaxText's): a mixture of
# experts trades tokens for experts over it with all-to-all, a dense model is data
# parallel over it.
BATCH_AXES = ("dcn", "data", "fsdp", "expert")
# Inside a mixture's layer the expert axis holds experts, and the rows of each expert's
# slots are split over the other batch axes.
EXPERT_BATCH_AXES = ("dcn", "data", "fsdp")

# The context axis splits every row's positions (activations' ``length`` and attention's
# ``kv_length``; ``models/context_parallel.py``). Parameters' gradients are summed over it
# as over the batch axes; the FSDP rule sets also shard the parameters over it.
CONTEXT_RULES = (("length", "context"), ("kv_length", "context"))
# The axes FSDP splits parameters over (an activation's ``embed`` stays whole: its batch
# and length already use them).
PARAMETER_SHARDS = ("fsdp", "context")

# The stage axis holds pipeline stages (``models/pipeline_parallel.py``): a scanned stack's ``layers``
# are split over it, and the microbatches in flight (``stages``) with them. Across slices
# (``partitioning.pipeline_over_dcn``) the dcn axis carries stages instead of rows.
STAGE_AXES = ("stage",)
STAGE_RULES = (("stages", STAGE_AXES), ("layers", STAGE_AXES))

# Each rule: logical name -> mesh axis (or tuple of axes, or None = replicated).
# Every set shards a mixture's experts over the ``expert`` axis (size 1 unless the mesh
# names one), and rows' positions over the ``context`` axis (size 1 unless named).
RULE_SETS: dict[str, tuple[tuple[str, object], ...]] = {
    "data_parallel": (
        ("expert", "expert"),
        ("expert_batch", EXPERT_BATCH_AXES),
        ("batch", BATCH_AXES),
        *CONTEXT_RULES,
        *STAGE_RULES,
    ),
    # ZeRO-3-like: parameters sharded along their embed dimension over fsdp, and over the
    # context axis too (as MaxText's): its devices would otherwise each hold them whole.
    "fsdp": (
        ("expert", "expert"),
        ("expert_batch", EXPERT_BATCH_AXES),
        ("batch", BATCH_AXES),
        *CONTEXT_RULES,
        *STAGE_RULES,
        ("embed", PARAMETER_SHARDS),
    ),
    # FSDP plus Megatron-style tensor parallelism over heads, MLP and vocabulary.
    "fsdp_tensor": (
        ("expert", "expert"),
        ("expert_batch", EXPERT_BATCH_AXES),
        ("batch", BATCH_AXES),
        *CONTEXT_RULES,
        *STAGE_RULES,
        ("embed", PARAMETER_SHARDS),
        ("vocab", "tensor"),
        ("mlp", "tensor"),
        ("heads", "tensor"),
    ),
}


def axis_rules(name: str, pipeline_over_dcn: bool = False,
               fsdp_over_dcn: bool = False) -> tuple[tuple[str, object], ...]:
    """Rule set ``name``; ``pipeline_over_dcn`` moves the dcn axis from the rows to the
    pipeline stages (slices then hold stages, and only activations cross the slow
    network, once a microbatch and stage boundary); ``fsdp_over_dcn`` shards parameters
    over the slices as well as inside each (full FSDP across slices, not hybrid)."""
    if name not in RULE_SETS:
        raise ValueError(f"Unknown partitioning.rules {name!r}; choose from {sorted(RULE_SETS)}.")
    if fsdp_over_dcn:
        return tuple((logical, ("dcn", *PARAMETER_SHARDS) if logical == "embed" else axes)
                     for logical, axes in RULE_SETS[name])
    if not pipeline_over_dcn:
        return RULE_SETS[name]
    over_dcn = {"batch": _without_dcn(BATCH_AXES), "expert_batch": _without_dcn(EXPERT_BATCH_AXES),
                "stages": ("dcn", *STAGE_AXES), "layers": ("dcn", *STAGE_AXES)}
    return tuple((logical, over_dcn.get(logical, axes)) for logical, axes in RULE_SETS[name])


def _without_dcn(axes: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(a for a in axes if a != "dcn")


def batch_axes(rules) -> tuple[str, ...]:
    """The mesh axes a batch's rows are split over under ``rules``."""
    axes = dict(rules).get("batch", BATCH_AXES)
    return (axes,) if isinstance(axes, str) else tuple(axes)


def make_mesh(shape: Mapping[str, int], devices=None, split_physical_axes: bool = False) -> Mesh:
    """Mesh over ``devices`` (default: all) with the resolved ``shape`` per axis.

    ``shape["dcn"]`` (default 1) splits the devices into that many slices: TPU
    devices by their ``slice_index``; devices without one (CPU, GPU) by process
    when there are that many processes, else into equal blocks in device order
    (how a multi-slice run is rehearsed on fake CPU devices). Inside each slice
    JAX orders the devices for the chip interconnect, each mesh axis a product of whole
    torus dimensions unless ``split_physical_axes`` lets an axis take part of one
    (MaxText's ``allow_split_physical_axes``: expert 4 x fsdp 64 on a 16x16 slice).
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = {axis: int(shape.get(axis, 1)) for axis in MESH_AXES}
    if math.prod(sizes.values()) != len(devices):
        raise ValueError(f"Mesh {sizes} needs {math.prod(sizes.values())} devices, got "
                         f"{len(devices)}.")
    groups = slice_groups(devices, sizes["dcn"])
    inner = tuple(sizes[axis] for axis in MESH_AXES[1:])
    # Auto axes: XLA propagates shardings from the annotations the model provides.
    try:
        per_slice = [mesh_utils.create_device_mesh(inner, group, allow_split_physical_axes=True)
                     if split_physical_axes else
                     jax.make_mesh(inner, MESH_AXES[1:], devices=group,
                                   axis_types=(AxisType.Auto,) * len(inner)).devices
                     for group in groups]
    except NotImplementedError as e:  # a TPU torus the axes do not tile
        raise UserError(
            f"Mesh {sizes} does not tile the chips' torus ({str(e).split('.')[0]}); make each "
            "mesh axis a product of whole physical axes, e.g. on a 4x4x4 slice axes of 4 and "
            "16, not 8 and 8, or let axes split them with "
            "--config.partitioning.split_physical_axes=true.") from None
    return Mesh(np.stack(per_slice), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def num_slices(devices) -> int:
    """How many TPU slices ``devices`` span (1 for devices without a slice index)."""
    return len({getattr(d, "slice_index", 0) for d in devices})


def slice_groups(devices, dcn: int) -> list[list]:
    """``devices`` split into ``dcn`` slices (see ``make_mesh``), each in device order."""
    found = num_slices(devices)
    if found > 1:
        if found != dcn:
            raise ValueError(f"The devices span {found} slices but mesh.dcn={dcn}; set "
                             f"--config.mesh.dcn={found} (or 0 to follow the slices found), so "
                             "that only data parallelism crosses the data-center network.")
        key = lambda d: d.slice_index  # noqa: E731
    elif dcn > 1 and len({d.process_index for d in devices}) == dcn:
        key = lambda d: d.process_index  # noqa: E731
    else:
        if len(devices) % dcn:
            raise ValueError(f"mesh.dcn={dcn} does not divide the {len(devices)} devices.")
        per_group = len(devices) // dcn
        order = {id(d): i // per_group for i, d in enumerate(devices)}
        key = lambda d: order[id(d)]  # noqa: E731
    groups: dict[int, list] = {}
    for device in devices:
        groups.setdefault(key(device), []).append(device)
    return [groups[k] for k in sorted(groups)]


def logical_shardings(boxed_tree, mesh: Mesh, rules):
    """NamedShardings for a tree of ``nn.LogicallyPartitioned`` (from ``jax.eval_shape``)."""
    specs = nn.get_partition_spec(boxed_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


def check_divisible(abstract_params, shardings) -> None:
    """A user's error, before anything compiles, where the mesh splits a parameter's
    dimension into parts that do not divide it (JAX's ``IndivisibleError`` later, deep in a
    traceback): one line naming the parameter, its shape and the mesh axes."""
    leaves = jax.tree_util.tree_flatten_with_path(abstract_params)[0]
    for (path, leaf), sharding in zip(leaves, jax.tree.leaves(shardings), strict=True):
        for dim, axes in enumerate(sharding.spec):
            names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
            parts = math.prod(sharding.mesh.shape[a] for a in names)
            if leaf.shape[dim] % parts:
                name = "/".join(str(getattr(k, "key", k)) for k in path)
                over = " x ".join(f"mesh.{a}={sharding.mesh.shape[a]}" for a in names)
                raise UserError(
                    f"params/{name} {tuple(leaf.shape)}: its dimension {dim} "
                    f"({leaf.shape[dim]}) does not split over {over}; make "
                    f"{' x '.join(f'mesh.{a}' for a in names)} divide {leaf.shape[dim]}, or "
                    "choose partitioning.rules that leave that dimension whole.")


def batch_sharding(mesh: Mesh, rules=None) -> NamedSharding:
    """Batch dimension over the data-parallel axes (``rules``' ``batch``), everything
    else replicated."""
    return NamedSharding(mesh, PartitionSpec(batch_axes(rules) if rules else BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh, rules=None
                 ) -> dict[str, jax.Array]:
    """Process-local numpy rows -> global ``jax.Array``s sharded over the batch axes."""
    sharding = batch_sharding(mesh, rules)
    return {key: jax.make_array_from_process_local_data(sharding, value)
            for key, value in local_batch.items()}


# -- multi-host initialisation -------------------------------------------------

ENV_COORDINATOR = "T5X_LIKE_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "T5X_LIKE_NUM_PROCESSES"
ENV_PROCESS_ID = "T5X_LIKE_PROCESS_ID"


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
    """How this process joins a multi-process run. ``coordinator_address`` None means
    "let JAX read the cluster" (Cloud TPU VM metadata, SLURM, Open MPI, Kubernetes)."""
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    detected: str = "flags"


def distributed_settings(coordinator_address: str | None = None,
                         num_processes: int | None = None, process_id: int | None = None,
                         environ: Mapping[str, str] | None = None,
                         detect_cluster: Callable[[], str | None] | None = None
                         ) -> DistributedSettings | None:
    """Decides whether and how to call ``jax.distributed.initialize``.

    Flags win, then ``T5X_LIKE_*`` environment variables (GPU clusters, launch_local);
    without either, a cluster JAX knows how to read (Cloud TPU VM, SLURM, MPI) is
    detected. ``None`` means a single-process run.
    """
    environ = os.environ if environ is None else environ
    explicit = {
        "coordinator_address": coordinator_address or environ.get(ENV_COORDINATOR),
        "num_processes": num_processes if num_processes is not None
        else environ.get(ENV_NUM_PROCESSES),
        "process_id": process_id if process_id is not None else environ.get(ENV_PROCESS_ID),
    }
    given = {k: v for k, v in explicit.items() if v not in (None, "")}
    if given:
        missing = sorted(set(explicit) - set(given))
        if missing:
            raise UserError(
                f"Multi-process settings are incomplete: got {sorted(given)}, missing {missing}. "
                f"Pass all of --coordinator_address=HOST:PORT --num_processes=N --process_id=I "
                f"(or {ENV_COORDINATOR}, {ENV_NUM_PROCESSES}, {ENV_PROCESS_ID}).")
        try:
            count, index = int(given["num_processes"]), int(given["process_id"])
        except ValueError:
            raise UserError(f"num_processes={given['num_processes']!r} and process_id="
                             f"{given['process_id']!r} must be integers.") from None
        if count < 1 or not 0 <= index < count:
            raise UserError(f"process_id={index} must be in [0, num_processes={count}).")
        if ":" not in str(given["coordinator_address"]):
            raise UserError(f"coordinator_address={given['coordinator_address']!r} needs a port, "
                             "e.g. 10.0.0.1:8476 (process 0's host).")
        return DistributedSettings(str(given["coordinator_address"]), count, index)
    cluster = (detect_cluster or detected_cluster)()
    return DistributedSettings(detected=cluster) if cluster else None


def detected_cluster() -> str | None:
    """The name of the cluster environment JAX would auto-configure from, if any.

    Opt-in clusters are skipped, as JAX skips them: ``Mpi4pyCluster`` is "present"
    wherever mpi4py is installed (GPU images often have it), single-process included.
    """
    try:
        from jax._src import clusters
        for cluster in clusters.ClusterEnv._cluster_types:
            if not getattr(cluster, "opt_in_only_method", False) and cluster.is_env_present():
                return cluster.__name__
    except Exception:  # private API moved: fall back to flags and environment only
        return None
    return None


def initialize_distributed(settings: DistributedSettings | None,
                           timeout_s: float | None = None) -> None:
    """Joins the run (once, before any device is touched); a no-op for one process.
    ``timeout_s``: JAX's own start-up timeout (it aborts the process when it passes)."""
    if settings is None:
        return
    # CPU processes (launch_local, tests) exchange collectives over gloo on loopback.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeout = {} if timeout_s is None else {"initialization_timeout": int(timeout_s)}
    if settings.coordinator_address is None:
        jax.distributed.initialize(**timeout)
    else:
        jax.distributed.initialize(settings.coordinator_address, settings.num_processes,
                                   settings.process_id, **timeout)


def _from_every_process(values: np.ndarray) -> np.ndarray:
    """``values`` (one shape on every process) stacked in process order, on every process."""
    if jax.process_count() == 1:
        return values[None]
    return np.asarray(multihost_utils.process_allgather(values))


def gather_json(value) -> list:
    """A JSON-able ``value`` from every process, in process order (every process gets all).

    Sent as UTF-8 bytes padded to the longest, after their lengths: all-gathers move
    arrays of one shape.
    """
    if jax.process_count() == 1:
        return [value]
    data = np.frombuffer(json.dumps(value).encode("utf-8"), np.uint8)
    lengths = _from_every_process(np.array([data.size], np.int32)).reshape(-1)
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[:data.size] = data
    gathered = _from_every_process(padded)
    return [json.loads(gathered[i, :int(n)].tobytes().decode("utf-8"))
            for i, n in enumerate(lengths)]


def max_over_processes(value: int) -> int:
    """The largest ``value`` any process has; the same on every process."""
    return int(np.max(_from_every_process(np.array([value], np.int32))))


def any_process(flag: bool) -> bool:
    """True on every process when ``flag`` is true on any; keeps multi-process loops in step."""
    return bool(np.any(_from_every_process(np.array([flag]))))
