"""One writer per workdir: ``train`` holds ``WORKDIR/train.lock`` while it runs.

The lock is a small JSON file naming its owner (host, process id, start time) and a
heartbeat that a background thread rewrites every few seconds. A second ``train`` on the
same workdir is refused (exit 2) with the owner named and how to stop it. A lock whose
owner is gone is taken over, with one line saying so, so that a restart after a
preemption or ``kill -9`` needs no manual step. The owner is gone when

* it ran on this host and its process id is no longer alive (or is this very process:
  a restarted container that reuses the hostname and the pid), or
* its heartbeat is older than ``lock_stale_after_s`` (any host; heartbeats are compared
  with this host's clock, so keep the hosts' clocks roughly in sync).

Every change to the file is a compare-and-swap, so two writers racing for one lock (or to
take over one stale lock) end with exactly one owner:

* on a local (or mounted) disk, under ``flock`` on the workdir folder itself;
* on ``gs://``, with google-cloud-storage preconditions: a create is
  ``if_generation_match=0`` (only if absent), a heartbeat or takeover
  ``if_generation_match=<the generation read>``.

Multi-process runs hold one lock, process 0's (``train`` shares its outcome with the
other processes). Readers (``eval --watch``, ``infer``) never take it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from t5x_like.errors import UserError
from t5x_like.system import storage

# Imports inside functions: the Cloud Storage client loads only for a workdir in a bucket.

LOCK_NAME = "train.lock"
DEFAULT_STALE_AFTER_S = 300.0
_HELD_HERE: set[str] = set()  # tokens of the locks this process holds now


class WorkdirBusy(UserError):
    """Another live ``train`` holds the workdir's lock."""


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    try:  # a killed child not yet reaped by its parent still answers kill(pid, 0)
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@dataclasses.dataclass
class Owner:
    """What the lock file holds."""

    host: str
    pid: int
    started: float      # unix seconds
    heartbeat: float    # unix seconds of the last refresh
    token: str          # unique per holder: tells this holder's lock from a successor's

    @classmethod
    def new(cls) -> Owner:
        now = time.time()
        return cls(socket.gethostname(), os.getpid(), now, now, uuid.uuid4().hex)

    def to_text(self) -> str:
        return json.dumps(dict(dataclasses.asdict(self), started_utc=_utc(self.started),
                               heartbeat_utc=_utc(self.heartbeat)), indent=1)

    @classmethod
    def from_text(cls, text: str) -> Owner | None:
        try:
            data = json.loads(text)
            return cls(str(data["host"]), int(data["pid"]), float(data["started"]),
                       float(data["heartbeat"]), str(data["token"]))
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        return (f"host {self.host}, pid {self.pid}, since {_utc(self.started)}, last "
                f"heartbeat {max(now - self.heartbeat, 0.0):.0f} s ago")

    def gone_because(self, stale_after_s: float, now: float | None = None) -> str | None:
        """Why this owner is gone, or None while it may still be running."""
        now = time.time() if now is None else now
        if self.host == socket.gethostname():
            if self.pid == os.getpid() and self.token not in _HELD_HERE:
                return f"pid {self.pid} is this process, so the lock's owner has exited"
            if not pid_alive(self.pid):
                return f"pid {self.pid} is no longer running on {self.host}"
        if now - self.heartbeat > stale_after_s:
            return (f"no heartbeat for {now - self.heartbeat:.0f} s "
                    f"(lock_stale_after_s={stale_after_s:g})")
        return None


# -- compare-and-swap stores ------------------------------------------------------------

class _LocalStore:
    """The lock file on a disk; every read-decide-write runs under ``flock`` on the
    folder, and the file is replaced whole (rename), never seen half written."""

    def __init__(self, folder):
        self.folder = storage.path(folder)
        self.file = self.folder / LOCK_NAME

    @contextlib.contextmanager
    def exclusive(self):
        fd = os.open(os.fspath(self.folder), os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def read(self) -> tuple[str | None, object]:
        try:
            text = self.file.read_text()
        except FileNotFoundError:
            return None, None
        return text, text

    def write(self, text: str, expected):
        """Writes ``text`` if the file still reads ``expected`` (None: absent); returns
        the new version, or None when the file had changed."""
        with self.exclusive():
            if self.read()[1] != expected:
                return None
            storage.write_atomic(self.file, text)
            return text

    def delete(self, expected) -> bool:
        with self.exclusive():
            if expected is None or self.read()[1] != expected:
                return False
            self.file.unlink()
            return True


class _GcsStore:
    """The lock object in a bucket; the object's generation is the version."""

    def __init__(self, folder):
        from google.cloud import storage as gcs
        bucket, _, prefix = str(folder)[len("gs://"):].partition("/")
        self.name = f"{prefix.rstrip('/')}/{LOCK_NAME}" if prefix.strip("/") else LOCK_NAME
        self.bucket = gcs.Client().bucket(bucket)

    def read(self) -> tuple[str | None, object]:
        from google.api_core import exceptions
        blob = self.bucket.get_blob(self.name)
        if blob is None:
            return None, None
        try:
            return blob.download_as_bytes().decode("utf-8"), int(blob.generation)
        except exceptions.NotFound:
            return None, None

    def write(self, text: str, expected):
        from google.api_core import exceptions
        blob = self.bucket.blob(self.name)
        try:
            blob.upload_from_string(text, content_type="application/json",
                                    if_generation_match=0 if expected is None else expected)
        except exceptions.PreconditionFailed:
            return None
        return int(blob.generation)

    def delete(self, expected) -> bool:
        from google.api_core import exceptions
        if expected is None:
            return False
        try:
            self.bucket.blob(self.name).delete(if_generation_match=expected)
            return True
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            return False


def _store(folder):
    if str(folder).startswith("gs://"):
        return _GcsStore(folder)
    if storage.is_remote(folder):
        raise UserError(f"{folder}: the workdir lock works on local disks and gs:// only.")
    return _LocalStore(folder)


# -- the lock -------------------------------------------------------------------------

class WorkdirLock:
    """``acquire`` (refuse or take over), a heartbeat thread, ``release``."""

    def __init__(self, workdir, stale_after_s: float = DEFAULT_STALE_AFTER_S,
                 log: Callable[[str], None] = print, heartbeat_s: float | None = None):
        self.workdir = storage.path(workdir)
        self.stale_after_s = float(stale_after_s)
        self.heartbeat_s = heartbeat_s or max(0.5, min(10.0, self.stale_after_s / 4))
        self.log = log
        self.owner: Owner | None = None
        self.lost: str | None = None  # set when another writer took the lock from us
        self._version = None
        self._store = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    @property
    def file(self):
        return self.workdir / LOCK_NAME

    def acquire(self) -> None:
        """Holds the lock, or raises :class:`WorkdirBusy` naming its live owner."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._store = _store(self.workdir)
        for _ in range(5):  # a lost race re-reads; a live owner ends the loop
            text, version = self._store.read()
            mine = Owner.new()
            if text is None:
                self._version = self._store.write(mine.to_text(), None)
                if self._version is not None:
                    self._hold(mine)
                    return
                continue
            previous = Owner.from_text(text)
            why = ("the lock file is unreadable" if previous is None
                   else previous.gone_because(self.stale_after_s))
            if why is None:
                raise WorkdirBusy(self._busy_message(previous))
            self._version = self._store.write(mine.to_text(), version)
            if self._version is not None:
                self._hold(mine)
                held = f"held by {previous.describe()}" if previous else "unreadable"
                self.log(f"Took over the workdir lock {self.file} ({held}): {why}.")
                return
        raise WorkdirBusy(f"Could not take the workdir lock {self.file}: other writers keep "
                          "changing it; is another train starting on this workdir?")

    def _hold(self, owner: Owner) -> None:
        self.owner = owner
        _HELD_HERE.add(owner.token)

    def _busy_message(self, owner: Owner) -> str:
        here = owner.host == socket.gethostname()
        stop = (f"`kill {owner.pid}`" + ("" if here else f" on {owner.host}"))
        return (f"Another train is writing to {storage.display(self.workdir)} ({owner.describe()}). "
                f"Use another --workdir, wait for it to finish, or stop it with {stop}; if you "
                f"are sure it is gone, delete {storage.display(self.file)} (a lock without a "
                f"heartbeat for lock_stale_after_s={self.stale_after_s:g} s is taken over "
                "by itself).")

    # -- heartbeat

    def start_heartbeat(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="workdir-lock-heartbeat",
                                        daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.refresh()
            except Exception as e:  # noqa: BLE001  (a flaky bucket: try again next beat)
                self.log(f"Workdir lock heartbeat failed ({type(e).__name__}: {e}); retrying.")

    def refresh(self) -> bool:
        """Rewrites the heartbeat; False (and ``lost`` set) when another writer took over."""
        with self._mutex:
            if self.owner is None or self.lost:
                return False
            self.owner.heartbeat = time.time()
            version = self._store.write(self.owner.to_text(), self._version)
            if version is not None:
                self._version = version
                return True
            text, _ = self._store.read()
            successor = Owner.from_text(text) if text else None
            self.lost = (f"held by {successor.describe()}" if successor
                         else "the lock file was deleted")
            self.log(f"The workdir lock {self.file} is no longer this run's ({self.lost}).")
            return False

    def release(self) -> None:
        """Stops the heartbeat and deletes the lock if it is still this run's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        with self._mutex:
            if self.owner is not None and not self.lost:
                self._store.delete(self._version)
            if self.owner is not None:
                _HELD_HERE.discard(self.owner.token)
            self.owner = None

    def __enter__(self) -> WorkdirLock:
        self.acquire()
        self.start_heartbeat()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
