"""Paths that may live in object storage: ``gs://bucket/...`` and ``s3://bucket/...``.

Workdirs, checkpoints, metrics, pretrained folders, eval outputs and text sources go
through ``etils.epath``: local paths keep using the OS, object-store paths use
fsspec (``gcsfs``, ``s3fs``; the ``cloud`` extra). Array data in checkpoints goes
through orbax's tensorstore, which reads the same URLs itself.

Object stores differ from disks in three ways this module hides: there is no append
(``AppendLog`` rewrites the whole object, which stays small), there is no atomic
rename (an object write is already whole-or-absent, so ``write_atomic`` writes
directly), and "folders" are only prefixes (``move_tree`` copies then deletes).

When TensorFlow is installed, epath would route ``gs://`` to ``tf.io.gfile``; that
imports TensorFlow for every path operation and cannot be pointed at an emulator.
If ``gcsfs`` is installed we prefer fsspec (set ``EPATH_USE_TF=true`` to keep gfile).
"""

from __future__ import annotations

import glob as glob_lib
import gzip
import importlib.util
import itertools
import os
import shutil
import sys
import tempfile
import zlib

from etils import epath

from t5x_like.errors import UserError, install_hint

# Imports inside functions: tensorboardX loads only when TensorBoard events are written.

REMOTE_SCHEMES = ("gs://", "s3://")
_FSSPEC_PACKAGE = {"gs://": "gcsfs", "s3://": "s3fs"}

if importlib.util.find_spec("gcsfs") is not None:
    os.environ.setdefault("EPATH_USE_TF", "false")


# Numbers the summary writers this process opens (their files' names differ).
_WRITERS_OPENED = itertools.count()


def summary_writer(logdir, **kwargs):
    """tensorboardX's ``SummaryWriter`` at ``logdir`` (a folder here, on gs:// or s3://).

    tensorboardX's writer module imports torch, when it is installed, only to accept torch
    tensors, which nothing here passes: 1.9 s of every command's start on 2 cores (the
    test suite starts hundreds). The first import of tensorboardX in a process skips it;
    torch imports normally afterwards.

    Each writer gets a file of its own: tensorboardX names event files by the second they
    open in and the host, so a resume (or an evaluation) opening a writer in the folder
    within the second the last one opened would replace its file, and the steps it held
    would vanish from TensorBoard. A ``filename_suffix`` of the process and a counter keeps
    them apart (TensorBoard reads every file in the folder)."""
    if "tensorboardX.writer" not in sys.modules and "torch" not in sys.modules:
        sys.modules["torch"] = None  # `import torch` raises ImportError
        try:
            import tensorboardX  # noqa: F401
        finally:
            del sys.modules["torch"]
    from tensorboardX import SummaryWriter
    kwargs.setdefault("filename_suffix", f".{os.getpid()}.{next(_WRITERS_OPENED)}")
    return SummaryWriter(logdir=os.fspath(logdir), **kwargs)


def is_remote(path) -> bool:
    return str(path).startswith(REMOTE_SCHEMES)


def path(value) -> epath.Path:
    """An epath for ``value``: local paths expanded and made absolute, URLs as given.

    A URL whose fsspec package is missing is refused here, in one line, rather than deep
    inside the first write."""
    text = os.fspath(value) if not isinstance(value, str) else value
    if is_remote(text):
        scheme = text[:5]
        package = _FSSPEC_PACKAGE[scheme]
        if importlib.util.find_spec(package) is None:
            raise ValueError(f"{text}: {scheme} paths need the {package} package: "
                             f"{install_hint('cloud')}")
        return epath.Path(text)
    return epath.Path(os.path.abspath(os.path.expanduser(text)))


def display(value) -> str:
    """The path as a user typed it back: URLs stay URLs."""
    return os.fspath(value)


def file_crc32(file) -> int:
    file = path(file)
    crc = 0
    with file.open("rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def file_size(file) -> int:
    stat = path(file).stat()  # epath: os.stat_result on disk, its own StatResult in a bucket
    return int(stat.length if hasattr(stat, "length") else stat.st_size)


def files_under(folder) -> list[epath.Path]:
    """Every file below ``folder``, sorted (object stores have no empty folders).

    fsspec walks a bucket with roots like ``bucket/dir`` (no ``gs://``), so each root is
    taken relative to the folder and joined back onto it."""
    folder = path(folder)
    text = str(folder).rstrip("/")
    bare = text.split("://", 1)[1] if is_remote(text) else text
    found = []
    for root, _, names in folder.walk():
        root = str(root).rstrip("/")
        for prefix in (text, bare):
            if root == prefix or root.startswith(prefix + "/"):
                relative = root[len(prefix):].strip("/")
                break
        else:
            raise ValueError(f"walking {text} gave {root}, which is not inside it")
        below = folder / relative if relative else folder
        found += [below / name for name in names]
    return sorted(found, key=str)


def write_atomic(file, text: str) -> None:
    """Whole or absent: a temporary file renamed on disks; one object write in a bucket."""
    file = path(file)
    if is_remote(file):
        file.write_text(text)
        return
    tmp = file.parent / (file.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, file)


def move_tree(source, target) -> None:
    """A folder renamed (disk) or copied then deleted (bucket: prefixes cannot be
    renamed). The copy finishes before anything is deleted, so nothing is lost midway."""
    source, target = path(source), path(target)
    if not is_remote(source):
        shutil.move(os.fspath(source), os.fspath(target))
        return
    copy_tree(source, target)
    source.rmtree()


def relative_name(file, folder) -> str:
    """``file``'s path below ``folder`` (``state/d/x``), the same on disk and in a bucket."""
    return str(file)[len(str(folder)):].lstrip("/")


def copy_tree(source, target, last: tuple[str, ...] = (), include=None) -> None:
    """A local or remote folder copied file by file into ``target``; the files named in
    ``last`` (relative names) go after all others, so a reader that waits for them sees
    a complete folder. ``include(relative name)``: which files to copy (default all)."""
    source, target = path(source), path(target)
    target.mkdir(parents=True, exist_ok=True)
    files = [(relative_name(file, source), file) for file in files_under(source)]
    files = [(name, file) for name, file in files if include is None or include(name)]
    files.sort(key=lambda item: (item[0] in last, item[0]))
    for relative, file in files:
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        file.copy(destination, overwrite=True)


def glob(pattern: str) -> list[str]:
    """Sorted matches of a file pattern, on disk or in a bucket (``gs://b/data/*.txt``)."""
    if not is_remote(pattern):
        return sorted(glob_lib.glob(os.path.expanduser(pattern)))
    scheme, rest = pattern.split("://", 1)
    parts = rest.split("/")
    fixed = next((i for i, part in enumerate(parts) if glob_lib.has_magic(part)), len(parts))
    base = path(f"{scheme}://" + "/".join(parts[:fixed]))
    if fixed == len(parts):
        return [pattern] if base.is_file() else []
    return sorted(str(p) for p in base.glob("/".join(parts[fixed:])) if p.is_file())


def read_text_lines(file: str) -> list[str]:
    """Lines of a UTF-8 text file, gzip when it ends in ``.gz``, on disk or in a bucket;
    a stray non-UTF-8 byte becomes U+FFFD instead of a crash."""
    with path(file).open("rb") as raw:
        data = raw.read()
    if file.endswith(".gz"):
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace").splitlines()


_LOCAL_COPIES: dict[str, str] = {}


def local_copy(value) -> str:
    """A local path for ``value``: itself on disk; a bucket file or folder downloaded
    once per process (for libraries that read only local files, like ``tokenizers``)."""
    text = os.fspath(value)
    if not is_remote(text):
        return text
    if text not in _LOCAL_COPIES:
        source = path(text)
        folder = tempfile.mkdtemp(prefix="t5x_like_download_")
        local = os.path.join(folder, source.name)
        if source.is_dir():
            copy_tree(source, epath.Path(local))
        else:
            source.copy(epath.Path(local))
        _LOCAL_COPIES[text] = local
    return _LOCAL_COPIES[text]


class AppendLog:
    """A text file that grows by lines (``metrics.jsonl``).

    On disk it is opened for append. In a bucket objects cannot be appended to, so the
    whole text (read once, then kept) is written again on each ``append``: logs stay
    small, and each write leaves a complete object, never a torn line.
    """

    def __init__(self, file):
        self.file = file = path(file)
        self._remote = is_remote(file)
        self._text = None
        self._handle = None
        if self._remote:
            self._text = file.read_text() if file.exists() else ""
        else:
            self._handle = open(file, "a", encoding="utf-8")

    def append(self, text: str) -> None:
        if self._remote:
            self._text += text
            self.file.write_text(self._text)
        else:
            self._handle.write(text)
            self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def check_checkpoint_location(value, flag: str) -> None:
    """Orbax (0.12) writes checkpoint arrays to local paths and ``gs://`` only: an
    ``s3://`` path would fail at the first save with "Checkpoint path should be
    absolute". Refused up front instead."""
    if str(value).startswith("s3://"):
        raise UserError(
            f"{flag}={value}: orbax writes checkpoints to gs:// and local (or FUSE-mounted) "
            "paths, not s3://. Use a gs:// bucket, or mount the S3 bucket (e.g. mountpoint-s3) "
            "and pass its local path; s3:// works for data files and eval outputs.")
