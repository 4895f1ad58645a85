"""The local checkpoint tier of a multi-process run: each host writes its own shards to
its own disk, and the workdir's copy is the union of the hosts' shares, sealed once all
have landed.

Orbax saves a multi-process checkpoint into one folder every host can see. A host's
local disk is seen by that host alone, so each host saves as its own primary
(``MultiprocessingOptions(primary_host=None)``, as orbax's emergency checkpoints do)
into ``local_dir/<workdir>-<hash>/process_<i>/checkpoints``: every array shard this
host holds, replicas included (so it restores alone, onto the same layout), in the
zarr layout of one file per chunk (``use_ocdbt=False``), so the hosts' files never
collide. Their union is an ordinary checkpoint of the whole state, which any mesh and
process count restores:

- host 0 uploads its whole step folder but the seal (``MANIFEST``, ``commit_success``);
- every other host uploads its array chunks only (``host_share``), then writes
  ``<step>.landed/process_<i>`` beside the step in the workdir;
- host 0 waits for every host's mark, then writes ``commit_success`` and, last, the
  manifest of the union (``seal_when_landed``): until then the workdir's copy is not a
  checkpoint for anyone.

A host restores its local copy only when every host's copy matches its manifest and
was written for the layout being restored (``layout_digest``: each array's shape,
dtype, sharding and devices); otherwise every host reads the workdir's sealed copy.
A zarr chunk that is not there reads as zeros, so the layout check is what keeps a
host from restoring shards it never wrote.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

from t5x_like.system import storage

# Imports inside functions: keep JAX out of the commands' start-up: this module is imported
# before the config is read, and what needs JAX loads after it (orbax loads JAX).

#: how long host 0 waits for the other hosts' shares before leaving a step unsealed
LANDING_TIMEOUT_S = 900.0
_POLL_S = 0.2


def local_checkpoint_handlers() -> dict:
    """Item handlers of a host's own local copy: the state as every shard it holds, in
    zarr's file-per-chunk layout; the JSON items written by every host."""
    import jax
    import orbax.checkpoint as ocp
    from orbax.checkpoint import type_handlers

    options = host_options()
    registry = type_handlers.create_type_handler_registry(
        (jax.Array, type_handlers.ArrayHandler(primary_host=None, replica_id=None,
                                               use_replica_parallel=False)))
    return {"state": ocp.PyTreeCheckpointHandler(use_ocdbt=False, multiprocessing_options=options,
                                                 type_handler_registry=registry),
            "data": ocp.JsonCheckpointHandler(multiprocessing_options=options),
            "config": ocp.JsonCheckpointHandler(multiprocessing_options=options)}


def host_options():
    """Every host the primary of its own folder; barriers keyed apart from the workdir's."""
    import orbax.checkpoint as ocp
    return ocp.options.MultiprocessingOptions(primary_host=None,
                                              barrier_sync_key_prefix="local_tier")


def async_options():
    """Saves stay asynchronous, but each host makes its step folders before the save
    goes on: orbax signals "folders made" to every host by one global key, so with
    every host a primary, a host could read another's signal and write into a folder
    not yet made (seen here: a ``FileNotFoundError`` in about one run in three)."""
    import orbax.checkpoint as ocp
    return ocp.AsyncOptions(create_directories_asynchronously=False)


def restore_args(abstract_state):
    """``PyTreeRestore`` arguments restoring onto ``abstract_state``'s shardings."""
    import orbax.checkpoint as ocp
    return ocp.args.PyTreeRestore(
        item=abstract_state,
        restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_state))


def layout_digest(state) -> str:
    """What a host's local copy can restore onto: every array's shape, dtype, partition
    spec and mesh (axis sizes and device ids), hashed. The same digest means this host
    holds the same shards it wrote."""
    import jax
    parts = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        sharding = getattr(leaf, "sharding", None)
        mesh = getattr(sharding, "mesh", None)
        devices = [] if mesh is None else [int(d.id) for d in mesh.devices.flat]
        shape = {} if mesh is None else dict(mesh.shape)
        parts.append(f"{jax.tree_util.keystr(path)}:{tuple(leaf.shape)}:{leaf.dtype}:"
                     f"{getattr(sharding, 'spec', None)}:{shape}:{devices}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def host_share(relative: str) -> bool:
    """Whether a file of a non-zero host's step folder is its own to upload: an array
    chunk (``state/<array>/<chunk>``), not the metadata host 0 writes the same."""
    parts = relative.split("/")
    return parts[0] == "state" and len(parts) >= 3 and parts[-1] not in (".zarray", ".zattrs")


def landed_folder(directory, step: int):
    return storage.path(directory) / f"{step}.landed"


def mark_landed(directory, step: int, process: int) -> None:
    folder = landed_folder(directory, step)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"process_{process}").write_text("landed\n")


def wait_until_landed(directory, step: int, processes: int,
                      timeout_s: float = LANDING_TIMEOUT_S) -> list[int]:
    """The processes whose share of ``step`` has not landed after ``timeout_s`` (empty:
    every host's has)."""
    folder = landed_folder(directory, step)
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [p for p in range(processes) if not (folder / f"process_{p}").exists()]
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(_POLL_S)


def seal_when_landed(directory, step: int, processes: int,
                     write_manifest: Callable, commit_source, log: Callable[[str], None],
                     timeout_s: float = LANDING_TIMEOUT_S) -> bool:
    """Host 0, once its own share is uploaded: waits for every host's, then writes
    orbax's ``commit_success`` and, last, the manifest of the union (the seal). False
    (and one line logged) when a host's share did not land: the step stays unsealed,
    and the next run's uploads try again."""
    folder = storage.path(directory) / str(step)
    missing = wait_until_landed(directory, step, processes, timeout_s)
    if missing:
        log(f"Checkpoint step {step} in {directory} is not sealed: the shares of processes "
            f"{missing} did not land within {timeout_s:g} s; their local copies are kept and "
            "the next run uploads them again.")
        return False
    if commit_source is not None and commit_source.exists():
        commit_source.copy(folder / "commit_success.txt", overwrite=True)
    write_manifest(folder)  # the seal, last
    landed_folder(directory, step).rmtree()
    return True
