"""Orbax checkpoints of the train state, the data-iterator state and the config, made
to survive damage.

Saves are asynchronous and atomic (orbax writes to a temporary directory and renames
it), so a crash mid-save never replaces the last complete checkpoint. Damage that
happens later (a bad disk block, a half-copied folder, a stray ``rm``) is found by a
manifest: once a save has finished, the file sizes and CRC32s of its step folder are
written to ``manifest.t5x_like.json`` in it. A restore checks the manifest first, and
on any failure moves the step folder aside (into ``damaged_checkpoints/`` beside
``param_sources/``: renamed, never deleted) and falls back to the next older step.
Rotation is ours, not orbax's, so that it never deletes the newest step that was
verified.

A local tier (``local_dir``: a fast local disk, as on TPU VMs): saves land in
``local_dir/<workdir name>-<hash>/checkpoints`` (``.../process_<i>/checkpoints`` when
several processes each write their own shards: ``checkpoint_per_host``) and, once
sealed, are copied to the
workdir (a bucket) by a background thread, the top-level ``commit_success.txt`` and the
manifest last (so a half-copied step is not finalized for orbax, nor sealed for us).
A restore takes each step from the local copy when it matches its manifest, else from
the workdir's copy (copied down first; a damaged local copy is moved aside), so a host
with an empty local dir restores from the bucket; sealed local steps the bucket lacks
(the run died before uploading them) are uploaded after the restore. ``close`` waits
for the uploads.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable

import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import type_handlers

from t5x_like.checkpoints import checkpoint_per_host
from t5x_like.engine import partitioning
from t5x_like.errors import UserError
from t5x_like.system import storage

MANIFEST = "manifest.t5x_like.json"
ITEMS = ("state", "data", "config")
COMMIT_SUCCESS = "commit_success.txt"  # orbax's mark of a finished step in a bucket
# A replicated array's write is split over its replicas (orbax's replica-parallel saving)
# only where each replica's slice is at least this big. Each split costs an on-device
# slice program per shape, compiled the first time it is seen: for a norm scale or a bias
# that compile outlasts the write (64 such programs, 3.3 s of compiling, for each save of
# a tiny model on 8 devices); the large replicated arrays, where splitting pays, still split.
MIN_REPLICA_SLICE_BYTES = 1 << 20


@functools.cache
def _split_only_large_replicated_writes() -> None:
    """Registers orbax's array handler for ``jax.Array`` with ``MIN_REPLICA_SLICE_BYTES``
    (once a process: the handler registry is orbax's own, global)."""
    absl = logging.getLogger("absl")
    quiet = _Without("Type handler registry type")  # orbax warns of any override
    absl.addFilter(quiet)
    try:
        type_handlers.register_type_handler(
            jax.Array, type_handlers.ArrayHandler(
                min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES), override=True)
    finally:
        absl.removeFilter(quiet)


class _Without(logging.Filter):
    """Drops log records whose message starts with one of ``prefixes``."""

    def __init__(self, *prefixes: str):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def local_tier(local_dir, directory, process: int | None = None) -> epath.Path:
    """Where ``directory``'s checkpoints live on the local disk: one folder per workdir
    (``<name>-<hash of its full path>``), so runs sharing a local disk never mix, and in
    it one per process of a multi-process run (``process``), each host's own shards."""
    directory = storage.path(directory)
    workdir = directory.parent
    digest = hashlib.sha256(str(workdir).encode()).hexdigest()[:10]
    base = storage.path(local_dir) / f"{workdir.name or 'workdir'}-{digest}"
    return (base if process is None else base / f"process_{process}") / directory.name


class CheckpointsUnreadable(UserError):
    """Every step of a run failed to restore; nothing was moved, the message lists why."""


class IntactButIncompatible(UserError):
    """A step whose files match their manifest does not restore onto this model: not
    damage (it is not moved aside) but a changed model or code."""


@dataclasses.dataclass(frozen=True)
class Restored:
    step: int
    value: object                      # what the caller's restore function returned
    moved_aside: tuple[tuple[int, str, epath.Path], ...]  # (step, reason, new folder)


def one_line(error: BaseException, limit: int = 240) -> str:
    """An exception as one line: orbax/tensorstore errors span hundreds of lines."""
    text = " ".join(str(error).split())
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _step_files(folder: epath.Path) -> list[epath.Path]:
    return [p for p in storage.files_under(folder)
            if p.name != MANIFEST and p.name != MANIFEST + ".tmp"]


def write_manifest(folder: epath.Path, layout: str | None = None) -> None:
    """Sizes and CRC32s of every file in a finished step folder, written next to them;
    ``layout``: what a host's own local copy restores onto
    (``checkpoint_per_host.layout_digest``)."""
    files = {storage.relative_name(p, folder): {"size": storage.file_size(p), "crc32": storage.file_crc32(p)}
             for p in _step_files(folder)}
    manifest = {"format": 1, "files": files, **({"layout": layout} if layout else {})}
    # Whole or absent (a renamed temporary file on disk, one object write in a bucket).
    storage.write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))


def manifest_layout(folder: epath.Path) -> str | None:
    try:
        return json.loads((folder / MANIFEST).read_text()).get("layout")
    except (OSError, ValueError, AttributeError):
        return None


def _manifest_files(folder: epath.Path) -> dict | None:
    """The manifest's ``{relative path: {size, crc32}}``, or None where the folder has no
    readable manifest (older checkpoints, an interrupted finish, a damaged manifest)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    return files if isinstance(files, dict) else None


def has_manifest(folder: epath.Path) -> bool:
    return _manifest_files(folder) is not None


def sealed_and_intact(folder: epath.Path) -> bool:
    """A step folder with a manifest its files match."""
    return folder.is_dir() and has_manifest(folder) and manifest_problem(folder) is None


def manifest_problem(folder: epath.Path) -> str | None:
    """Why the folder does not match its manifest (None: it matches, or it has no
    readable manifest)."""
    files = _manifest_files(folder)
    if files is None:
        return None
    for name, expected in sorted(files.items()):
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = storage.file_size(path)
        if size != expected["size"]:
            return f"{name} is {size} bytes, the manifest says {expected['size']}"
        if storage.file_crc32(path) != expected["crc32"]:
            return f"{name} does not match its checksum (its bytes changed after the save)"
    extra = [name for name in (storage.relative_name(p, folder) for p in _step_files(folder))
             if name not in files]
    if extra:
        return f"{extra[0]} was not part of the save"
    return None


def _silence_late_callbacks_of_failed_reads() -> None:
    """After a failed restore, tensorstore completes the other pending reads on a thread
    whose asyncio loop orbax has already closed; each reports "Event loop is closed"
    as an unraisable exception (hundreds of tracebacks for one damaged file). Drops
    exactly those; any other unraisable exception still reaches the previous hook."""
    previous = sys.unraisablehook
    if getattr(previous, "_t5x_like_filter", False):
        return

    def hook(unraisable):
        error = unraisable.exc_value
        if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
            return
        previous(unraisable)

    hook._t5x_like_filter = True
    sys.unraisablehook = hook


# Orbax warns twice per read-only manager ("read_only=True, setting save_interval_steps=0",
# "Given directory is read only"): that is what evaluation asks for, so those two lines
# are dropped; every other warning still shows.
READ_ONLY_NOTICES = ("CheckpointManagerOptions.read_only=True", "Given directory is read only")


def _drop_read_only_notices() -> None:
    logger = logging.getLogger("absl")
    if not any(getattr(f, "prefixes", None) == READ_ONLY_NOTICES for f in logger.filters):
        logger.addFilter(_Without(*READ_ONLY_NOTICES))


class Checkpointer:
    def __init__(self, directory: str | epath.Path, keep: int, async_save: bool = True,
                 keep_every: int = 0, read_only: bool = False, log: Callable[[str], None] = None,
                 local_dir: str | epath.Path | None = None):
        """Keeps the newest ``keep`` checkpoints, plus every step divisible by ``keep_every``
        (when positive) for good, e.g. to evaluate or fine-tune from later, plus the
        newest verified step. ``read_only`` (evaluation) creates, cleans, moves and
        deletes nothing. ``log`` receives one line per step moved aside or failing to
        verify. ``local_dir``: the local tier (see the module's docstring)."""

        _split_only_large_replicated_writes()
        self.directory = storage.path(directory)
        self._is_primary = jax.process_index() == 0
        self._multi_process = jax.process_count() > 1
        # Where orbax saves and restores: the local tier when there is one.
        self.managed = (local_tier(local_dir, self.directory,
                                   jax.process_index() if self._multi_process else None)
                        if local_dir and not read_only else self.directory)
        # Several hosts, each saving its own shards on its own disk (checkpoint_per_host).
        self._per_host = self._multi_process and self.managed != self.directory
        self._uploads = _Uploader(self) if self.managed != self.directory else None
        self.keep, self.keep_every, self.read_only = keep, keep_every, read_only
        self._log = log or (lambda line: None)
        self._verified: set[int] = set()
        self._layouts: dict[int, str] = {}   # per host: each step's layout_digest
        self._restored_from: dict[int, epath.Path] = {}
        self._durable_reader = None
        if read_only:
            _drop_read_only_notices()
        options = ocp.CheckpointManagerOptions(max_to_keep=None,  # rotation: see _rotate
                                               create=not read_only,
                                               # A save cut off by kill -9 leaves a
                                               # temporary directory; drop it on restart.
                                               cleanup_tmp_directories=not read_only,
                                               read_only=read_only,
                                               enable_async_checkpointing=async_save)
        if self._per_host:
            options = dataclasses.replace(
                options, multiprocessing_options=checkpoint_per_host.host_options(),
                save_root_metadata=False, async_options=checkpoint_per_host.async_options())
            self._manager = ocp.CheckpointManager(
                self.managed, options=options, item_names=ITEMS,
                item_handlers=checkpoint_per_host.local_checkpoint_handlers())
        else:
            self._manager = ocp.CheckpointManager(self.managed, options=options,
                                                  item_names=ITEMS)

    @property
    def damaged_directory(self) -> epath.Path:
        return self.managed.parent / "damaged_checkpoints"

    def step_folder(self, step: int) -> epath.Path:
        return self.managed / str(step)

    def durable_folder(self, step: int) -> epath.Path:
        """The step in the workdir (with a local tier: the uploaded copy)."""
        return self.directory / str(step)

    def durable_steps(self) -> list[int]:
        """Steps the workdir holds sealed (uploaded whole), oldest first."""
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name) for p in self.directory.iterdir()
                      if p.name.isdigit() and (p / MANIFEST).exists())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Complete checkpoints, oldest first (a save still in flight is not listed)."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    # -- saving -----------------------------------------------------------------
    def save(self, step: int, state, data_state: dict, config: dict, force: bool = False) -> bool:
        # Orbax finishes the previous save before starting this one; seal it first so
        # its manifest is written and rotation sees it verified.
        self._manager.wait_until_finished()
        self._seal_and_rotate()
        if self._per_host:
            self._layouts[step] = checkpoint_per_host.layout_digest(state)
        return self._manager.save(step, args=ocp.args.Composite(
            state=(ocp.args.PyTreeSave(state) if self._per_host
                   else ocp.args.StandardSave(state)),
            data=ocp.args.JsonSave(data_state),
            config=ocp.args.JsonSave(config)), force=force)

    def _seal_and_rotate(self) -> None:
        if self.read_only:
            return
        steps = self.all_steps()
        if self._is_primary or self._per_host:  # per host: each seals its own copy
            for step in steps:
                folder = self.step_folder(step)
                if not folder.is_dir() or has_manifest(folder):
                    if folder.is_dir():
                        self._verified.add(step)  # sealed before (this run or an earlier one)
                    continue
                try:
                    if step not in self._verified:  # a restored step needs no re-check
                        self._check_readable(step)
                    write_manifest(folder, self._layouts.get(step))
                except Exception as e:  # noqa: BLE001 - a step that does not verify stays unverified
                    self._log(f"Checkpoint {folder} did not verify after saving ({one_line(e)}); "
                              "older checkpoints are kept until a newer one verifies.")
                    continue
                self._verified.add(step)
        if self._uploads is not None:
            self._uploads.add([s for s in steps if s in self._verified])
        if self._multi_process:  # every process must delete the same steps
            self._verified = set(partitioning.gather_json(sorted(self._verified))[0])
        self._rotate(steps)

    def _check_readable(self, step: int) -> None:
        """Cheap proof that a finished save reads back: its JSON items and the state's
        metadata parse (the array bytes are covered by the manifest's checksums). Read
        directly, not through orbax, so only this process takes part."""
        folder = self.step_folder(step)
        for name in ("config/metadata", "data/metadata", "state/_METADATA"):
            if not isinstance(json.loads((folder / name).read_text()), dict):
                raise ValueError(f"{name} is not a JSON object")

    def steps_to_delete(self, steps: list[int]) -> list[int]:
        """The newest ``keep``, the ``keep_every`` multiples and the newest verified step
        stay; an unverified newer save never pushes out the last verified one."""
        keep = set(steps[-self.keep:]) if self.keep else set(steps)
        if self.keep_every:
            keep |= {s for s in steps if s % self.keep_every == 0}
        verified = [s for s in steps if s in self._verified]
        if verified:
            keep.add(verified[-1])
        return [s for s in steps if s not in keep]

    def _rotate(self, steps: list[int]) -> None:
        doomed = self.steps_to_delete(steps)
        for step in doomed:
            if self._per_host:
                # A host's own folder, which no other host reads: orbax's delete waits for
                # every host at a barrier, and hosts may hold different steps (one that lost
                # its disk holds none of the older ones).
                self.step_folder(step).rmtree()
            else:
                self._manager.delete(step)
            self._verified.discard(step)
        if self._per_host and doomed:
            self._manager.reload()

    # -- restoring --------------------------------------------------------------
    def restore_config(self, step: int) -> dict:
        """Only the saved config: cheap, and checked before any array is read. Per host
        the file is read directly (no collective: hosts may hold different copies)."""
        if self._per_host:
            local = self.step_folder(step) / "config" / "metadata"
            source = local if local.exists() else self.durable_folder(step) / "config" / "metadata"
            return json.loads(source.read_text())
        return self._manager.restore(step, args=ocp.args.Composite(
            config=ocp.args.JsonRestore())).config

    def restore(self, step: int, abstract_state):
        """Restores onto the shardings carried by ``abstract_state``'s leaves. Per host:
        from every host's own copy when all of them fit this layout, else from the
        workdir's sealed copy (``checkpoint_per_host``)."""
        items = {"data": ocp.args.JsonRestore(), "config": ocp.args.JsonRestore()}
        if self._per_host and all(partitioning.gather_json(self._local_fits(step,
                                                                            abstract_state))):
            manager, items["state"] = self._manager, checkpoint_per_host.restore_args(
                abstract_state)
            self._restored_from[step] = self.step_folder(step)
        elif self._per_host:
            manager, items["state"] = self._durable(), ocp.args.StandardRestore(abstract_state)
            self._restored_from[step] = self.durable_folder(step)
        else:
            manager, items["state"] = self._manager, ocp.args.StandardRestore(abstract_state)
            self._restored_from[step] = self.step_folder(step)
        restored = self._restore_in_step(manager, step, ocp.args.Composite(**items))
        return restored.state, restored.data, restored.config

    def _restore_in_step(self, manager, step: int, args):
        """``manager.restore``, with every process making the same collectives when only
        some of them fail (each reads only its own shards, so damage to one process's
        files fails that process alone). Orbax's Checkpointer ends a restore at a barrier
        of all processes (``Checkpointer:restore``, a collective on CPU); a process whose
        read raised never reached it, and its next collective (the vote on the step,
        ``_agreed``) would meet the others' barrier: gloo aborts every process. The failed
        process joins that barrier here (the one collective left in a restore after the
        reads), then raises."""
        try:
            return manager.restore(step, args=args)
        except Exception:
            if self._multi_process:
                # The barrier's name as that checkpointer makes it (an asynchronous one
                # turns a prefix of None into ""): a barrier checks every process names it
                # alike.
                checkpointer = manager._checkpointer  # noqa: SLF001 (orbax's own, pinned)
                ocp.multihost.sync_global_processes(
                    ocp.multihost.unique_barrier_key(
                        "Checkpointer:restore",
                        prefix=checkpointer._barrier_sync_key_prefix),  # noqa: SLF001
                    processes=checkpointer._active_processes)  # noqa: SLF001
            raise

    def restored_folder(self, step: int) -> epath.Path:
        """Where ``step`` was last restored from (the local or the workdir's copy)."""
        return self._restored_from.get(step, self.step_folder(step))

    def _local_fits(self, step: int, abstract_state) -> bool:
        """This host's own copy of ``step`` is sealed, intact, and written for this
        layout (so it holds every shard this host restores)."""
        folder = self.step_folder(step)
        return (sealed_and_intact(folder)
                and manifest_layout(folder) == checkpoint_per_host.layout_digest(abstract_state))

    def _durable(self):
        """A read-only manager of the workdir's copies (per host: what every host can read)."""
        if self._durable_reader is None:
            _drop_read_only_notices()
            self._durable_reader = ocp.CheckpointManager(
                self.directory, options=ocp.CheckpointManagerOptions(read_only=True, create=False),
                item_names=ITEMS)
        return self._durable_reader

    def restore_newest(self, restore_step: Callable[[int], object]) -> Restored | None:
        """``restore_step(step)`` for the newest step that restores, newest first.

        A step whose files do not match its manifest, or whose restore raises anything
        but a ``UserError`` (a refused resume, which is not damage), is damaged: once
        an older step restores, each damaged folder is moved into
        ``damaged_checkpoints/`` and named in one line. If none restores, nothing is
        moved and ``CheckpointsUnreadable`` lists every step and why. ``None``: the run
        has no checkpoints.
        """
        steps = self.all_steps()
        if self._per_host:  # every host tries the same steps: any host's, or the workdir's
            steps = sorted({s for host in partitioning.gather_json(steps) for s in host}
                           | set(self.durable_steps()))
        elif self._uploads is not None:  # the local tier: the workdir's steps are candidates
            steps = sorted(set(steps) | set(self.durable_steps()))
        damaged: list[tuple[int, str]] = []
        for step in reversed(steps):
            folder = self.step_folder(step)
            if self._per_host:
                reason = self._agreed(self._per_host_problem(step))
            else:
                if self._uploads is not None:
                    self._ready_locally(step)
                reason = self._agreed(manifest_problem(folder))
            if reason is None:
                try:
                    value, failure = restore_step(step), None
                except UserError:
                    raise
                except Exception as e:  # noqa: BLE001 - any failure to read is damage
                    _silence_late_callbacks_of_failed_reads()
                    if has_manifest(folder):
                        raise IntactButIncompatible(
                            f"Checkpoint {folder} matches its manifest (its files are intact) "
                            f"but does not restore onto this model: {one_line(e)} Resume with "
                            "the code and config that wrote it, or use a new --workdir.") from e
                    failure = one_line(e)
                reason = self._agreed(failure)
                if reason is None:
                    self._verified.add(step)
                    moved = tuple((s, why, self._move_aside(
                        s, f"damaged ({why}); resuming from step {step}")) for s, why in damaged)
                    if self._uploads is not None:  # sealed here, never uploaded: now
                        self._uploads.add([s for s in self.all_steps()
                                           if has_manifest(self.step_folder(s))])
                    return Restored(step, value, moved)
            damaged.append((step, reason))
        if damaged:
            listing = "; ".join(f"{self.step_folder(s)}: {why}" for s, why in damaged)
            raise CheckpointsUnreadable(
                f"No checkpoint in {self.directory} restores ({listing}). Nothing was moved or "
                "deleted. Restore the folders from a copy, move them aside to start over in "
                "this workdir, or use a new --workdir.")
        return None

    def _per_host_problem(self, step: int) -> str | None:
        """Per host: why neither this host's copy nor the workdir's can be read (None: one
        can; which one, the restore decides with every host)."""
        durable = self.durable_folder(step)
        if sealed_and_intact(self.step_folder(step)):
            return None
        if has_manifest(durable):
            return manifest_problem(durable)
        return ("this host's copy is missing, unsealed or damaged and the workdir's copy is "
                "not sealed")

    def _agreed(self, problem: str | None) -> str | None:
        """One verdict for every process: a step is damaged if any process found it so
        (each reads only its own shards), so all fall back to the same step."""
        if not self._multi_process:
            return problem
        return next((p for p in partitioning.gather_json(problem) if p is not None), None)

    def move_aside_from(self, first_step: int, reason: str) -> list[epath.Path]:
        """Moves every step from ``first_step`` on aside (a diverged run's checkpoints)."""
        self._manager.wait_until_finished()
        moved = [self._move_aside(step, reason) for step in self.all_steps() if step >= first_step]
        self._verified = {s for s in self._verified if s < first_step}
        return moved

    def _move_aside(self, step: int, reason: str) -> epath.Path:
        """Renames a damaged step folder out of the way (never deletes it), with the
        reason written beside it."""
        if self.read_only:
            return self.step_folder(step)
        target = self.damaged_directory / str(step)
        if self._is_primary or self._per_host:  # per host: each its own copy
            if self.step_folder(step).is_dir() or not self._per_host:
                target = _move_into(self.damaged_directory, self.step_folder(step), step, reason)
        if self._per_host and self._is_primary and self.durable_folder(step).is_dir():
            target = _move_into(self.directory.parent / "damaged_checkpoints",
                                self.durable_folder(step), step, reason)
        if self._multi_process:
            partitioning.gather_json(step)  # every process waits for the move
        self._manager.reload()
        self._log(f"Moved checkpoint {self.step_folder(step)} aside to {target}: {reason}")
        return target

    def _ready_locally(self, step: int) -> None:
        """Before step ``step`` is checked and restored from the local tier: if the local
        copy is missing, unsealed or damaged and the workdir has it sealed, the local copy
        is moved aside (damaged) and the workdir's copied down."""
        local, durable = self.step_folder(step), self.durable_folder(step)
        if sealed_and_intact(local):
            return
        if not (durable / MANIFEST).exists():
            return  # nothing better in the workdir: the local copy is judged as it is
        if local.is_dir():
            why = manifest_problem(local) or "no manifest: its save was never sealed"
            self._move_aside(step, f"local copy damaged ({why}); restoring step {step} from "
                                   f"{durable}")
        storage.copy_tree(durable, local)
        self._manager.reload()
        self._log(f"Copied checkpoint {durable} to the local tier {local} to restore it.")

    # -- lifecycle --------------------------------------------------------------
    def wait_until_finished(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._seal_and_rotate()
        if self._uploads is not None:
            self._uploads.finish()
        self._manager.close()


def _move_into(damaged: epath.Path, folder: epath.Path, step: int, reason: str) -> epath.Path:
    """``folder`` renamed into ``damaged`` (``<step>``, or ``<step>.<n>`` beside an earlier
    one), with the reason written beside it."""
    damaged.mkdir(parents=True, exist_ok=True)
    target, suffix = damaged / str(step), 1
    while target.exists():
        target = damaged / f"{step}.{suffix}"
        suffix += 1
    storage.move_tree(folder, target)
    (damaged / f"{target.name}.reason.txt").write_text(
        f"{time.strftime('%Y-%m-%d %H:%M:%S')} moved from {folder}: {reason}\n")
    return target


class _Uploader:
    """Copies sealed local steps to the workdir, oldest first, on one background thread;
    then applies the rotation to the workdir's copies (never deleting the newest)."""

    def __init__(self, checkpointer: Checkpointer):
        self.checkpointer = checkpointer
        self.queued: set[int] = set()
        self.failed: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def add(self, steps: list[int]) -> None:
        c = self.checkpointer
        if not (c._is_primary or c._per_host):
            return
        durable = set(c.durable_steps())
        for step in sorted(steps):
            if step not in durable and step not in self.queued:
                self.queued.add(step)
                self._queue.put(step)
        if self._thread is None and self.queued:
            self._thread = threading.Thread(target=self._run, name="checkpoint-upload",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while (step := self._queue.get()) is not None:
            try:
                self.upload(step)
            except Exception as e:  # noqa: BLE001  (the local copy stays; retried next run)
                self.failed.append(f"step {step}: {one_line(e)}")
                self.checkpointer._log(f"Could not copy checkpoint step {step} to "
                                       f"{self.checkpointer.directory} ({one_line(e)}); the "
                                       "local copy is kept and the next run retries.")

    def upload(self, step: int) -> None:
        c = self.checkpointer
        source = c.step_folder(step)
        if not source.is_dir():
            return  # rotated away locally before its turn
        if c._per_host:
            if not self._upload_share(step):
                return
        else:
            storage.copy_tree(source, c.durable_folder(step), last=(COMMIT_SUCCESS, MANIFEST))
        durable = c.durable_steps()
        for old in c.steps_to_delete(durable):
            if old < durable[-1]:
                c.durable_folder(old).rmtree()

    def _upload_share(self, step: int) -> bool:
        """Per host: this host's share of the step into the workdir, then its mark; host
        0 seals the union once every host's has landed. True where this host is to apply
        the rotation to the workdir's copies (host 0, once sealed)."""
        c = self.checkpointer
        source, target = c.step_folder(step), c.durable_folder(step)
        include = ((lambda name: name not in (COMMIT_SUCCESS, MANIFEST)) if c._is_primary
                   else checkpoint_per_host.host_share)
        storage.copy_tree(source, target, include=include)
        checkpoint_per_host.mark_landed(c.directory, step, jax.process_index())
        return c._is_primary and checkpoint_per_host.seal_when_landed(
            c.directory, step, jax.process_count(), write_manifest, source / COMMIT_SUCCESS,
            c._log)

    def finish(self) -> None:
        """Waits for every queued upload (a run ends only once its steps are durable)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
