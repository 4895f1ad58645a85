"""Flags and checks the command lines share: ``--module`` (the user's task modules),
a writable output folder checked before any work, and the interpreter as the user
would type it in a printed follow-up command. A library module, so that commands
never import each other for them.
"""

from __future__ import annotations

import importlib
import os
import pathlib
import sys
import tempfile
from collections.abc import Sequence

from t5x_like.errors import UserError
from t5x_like.system import storage

# Imports inside functions: the flags are checked before the built-in tasks and JAX load.


def add_module_flag(parser) -> None:
    """``--module=PKG.MOD`` (repeatable), read by :func:`import_modules`."""
    parser.add_argument("--module", action="append", default=[], metavar="PKG.MOD",
                        help="Import this module first (repeatable): your tasks and mixtures.")


def import_modules(names: Sequence[str]) -> None:
    """``--module=PKG.MOD`` (repeatable): the user's modules that register tasks and
    mixtures, imported before any task is looked up (seqio's and T5X's
    ``MIXTURE_OR_TASK_MODULE``). The built-in tasks register first, so a user's module
    may build on them. The current directory is importable, as with ``python -m``."""
    import t5x_like.builtin_tasks  # noqa: F401  (registers the built-in tasks and mixtures)
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


def add_multi_process_flags(parser) -> None:
    """``--coordinator_address``, ``--num_processes``, ``--process_id``: a multi-process
    run's flags (GPU clusters; Cloud TPU VMs, SLURM and MPI are detected without them)."""
    multi = parser.add_argument_group(
        "multi-process runs (GPU clusters; Cloud TPU VMs, SLURM and MPI are detected)")
    multi.add_argument("--coordinator_address", help="HOST:PORT of process 0.")
    multi.add_argument("--num_processes", type=int, help="Processes in the run.")
    multi.add_argument("--process_id", type=int, help="This process's index, from 0.")


def start_processes(args, timeout_s: float | None = None, marks_dir=None,
                    prog: str = "train") -> None:
    """Joins this process to a multi-process run (``jax.distributed.initialize``) from the
    flags of :func:`add_multi_process_flags`, or from the cluster's own variables; does
    nothing for a single-process run. Called once the config is known to be good.

    With ``timeout_s``, a start-up that has not finished by then ends the process (exit 2)
    with one line naming the processes that never arrived (marks in ``marks_dir``)."""
    from t5x_like.engine import partitioning  # JAX: only after the cheap checks passed
    from t5x_like.resilience import watchdog
    try:
        settings = partitioning.distributed_settings(args.coordinator_address,
                                                     args.num_processes, args.process_id)
    except UserError as e:
        raise UserError(f"Multi-process setup error: {e}") from None
    if settings is None or timeout_s is None:
        partitioning.initialize_distributed(settings)
        return
    # JAX's own deadline comes later, so that the named message comes first.
    watchdog.start_up_guard(
        lambda: partitioning.initialize_distributed(settings, timeout_s + 60), timeout_s,
        marks_dir, settings.process_id, settings.num_processes, settings.coordinator_address,
        prog)


def add_vocabulary_flag(parser) -> None:
    parser.add_argument(
        "--vocabulary", default="",
        help="Re-tokenize every text task: 'checkpoint' (the tokenizer the checkpoint "
             "carries, e.g. an imported GPT-2's) or a tokenizer folder / tokenizer.json / "
             ".model path. Default: each task's own vocabulary, which must be the "
             "checkpoint's.")


def add_decoding_flags(group) -> None:
    """The decoding flags ``eval`` and ``infer`` share (greedy, beam, sampling)."""
    group.add_argument("--max_decode_length", type=int, default=0,
                       help="0: the targets length.")
    group.add_argument("--num_beams", type=int, default=1)
    group.add_argument("--alpha", type=float, default=0.6, help="Beam length penalty.")
    group.add_argument("--temperature", type=float, default=0.0, help="0: greedy.")
    group.add_argument("--top_k", type=int, default=0)
    group.add_argument("--top_p", type=float, default=1.0)
    group.add_argument("--seed", type=int, default=0)
    group.add_argument(
        "--sampler", choices=("static", "engine"), default="static",
        help="static: batches of --batch_size rows decoded together to the longest; engine: "
             "the continuous-batching engine (decoders, one process; greedy or sampled): "
             "--batch_size rows decode at once and a finished row's slot takes the next.")
