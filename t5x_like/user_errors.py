"""One error path for every command line: what the user caused (a ``UserError``:
flags, files, tasks, checkpoints) is one message and exit status 2; a traceback
means a bug in t5x_like.
"""

from __future__ import annotations

import functools
import importlib
import os
import pathlib
import sys
import tempfile
from typing import Callable, Sequence

from t5x_like.config_lib import UserError


def command_line(prog: str) -> Callable:
    """Wraps a ``main(argv) -> int``: a ``UserError`` escaping it prints ``prog: message``
    and returns 2."""
    def wrap(main: Callable) -> Callable:
        @functools.wraps(main)
        def wrapped(argv: Sequence[str] | None = None) -> int:
            try:
                return main(argv) or 0
            except UserError as e:
                print(f"{prog}: {e}", file=sys.stderr)
                return 2
        return wrapped
    return wrap


def add_module_flag(parser) -> None:
    """``--module=PKG.MOD`` (repeatable), read by :func:`import_modules`."""
    parser.add_argument("--module", action="append", default=[], metavar="PKG.MOD",
                        help="Import this module first (repeatable): your tasks and mixtures.")


def import_modules(names: Sequence[str]) -> None:
    """``--module=PKG.MOD`` (repeatable): the user's modules that register tasks and
    mixtures, imported before any task is looked up (seqio's and T5X's
    ``MIXTURE_OR_TASK_MODULE``). The current directory is importable, as with
    ``python -m``."""
    if names and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise UserError(f"--module={name}: cannot import it ({e}). Pass a module path "
                            "importable from here (e.g. my_tasks for ./my_tasks.py, or set "
                            "PYTHONPATH).") from None


def check_writable_folder(path: str, flag: str = "--workdir") -> None:
    """Refuses a folder that is a file or that cannot be written, before any work: the
    first checkpoint is the wrong moment to find out. A bucket path is tried with a small
    object written and deleted (a missing bucket or missing credentials show here)."""
    from t5x_like import storage
    if storage.is_remote(path):
        _check_writable_bucket_folder(path, flag)
        return
    folder = pathlib.Path(path).expanduser().absolute()
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{flag}={path} is a file, not a folder; pass a folder path (it is "
                        "created if missing).")
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{flag}={path}: {existing} is a file, so the folder cannot be created "
                        "there; pass another path.")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".t5x_like_write_test_"):
            pass
    except OSError as e:
        raise UserError(f"{flag}={path}: cannot write in {existing} ({e.strerror or e}); pass a "
                        "folder you can write to.") from None


def _check_writable_bucket_folder(path: str, flag: str) -> None:
    from t5x_like import storage
    try:
        probe = storage.path(path) / ".t5x_like_write_test"
        probe.write_text("")
        probe.unlink()
    except ValueError as e:  # the fsspec package for the scheme is missing
        raise UserError(f"{flag}={e}") from None
    except Exception as e:  # noqa: BLE001 - every client library raises its own types
        reason = " ".join(str(e).split())[:300] or type(e).__name__
        raise UserError(f"{flag}={path}: cannot write there ({type(e).__name__}: {reason}). Check "
                        "that the bucket exists and that this machine has credentials for it "
                        "(gcloud auth application-default login; AWS_* variables or "
                        "~/.aws for s3://).") from None


def this_python() -> str:
    """The interpreter running now, as a user would type it from the current folder."""
    executable = pathlib.Path(sys.executable)
    try:
        relative = executable.relative_to(pathlib.Path.cwd())
        return str(relative) if str(relative).startswith(".") else f"./{relative}"
    except ValueError:
        return str(executable)
