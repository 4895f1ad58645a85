"""The one error path: what the user caused is a :class:`UserError` with the fix in its
message; every command line prints it as one line and exits with status 2. Anything
else escaping a command is a bug in t5x_like and keeps its traceback.

A leaf module (standard library only), so that every layer may raise these, and so
that ``launch/`` runs without the project's dependencies installed.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence

from t5x_like import resources


class UserError(ValueError):
    """A problem with what the user asked for (flags, files, tasks, checkpoints), with the
    fix in the message; every command line prints it as one message and exits with
    status 2."""


class ConfigError(UserError):
    """A config problem, with the key and the fix in the message."""


class MissingFile(UserError, FileNotFoundError):
    """A file or folder the user named (a config, a data file, a vocabulary, a checkpoint)
    does not exist. Still a ``FileNotFoundError`` for code that catches that."""


def install_hint(extra: str = "") -> str:
    """The one way every message spells an install. From a clone: the README's line, from
    the repository root, with the tested versions of ``constraints.txt``; from an
    installed wheel: the package's extra."""
    if resources.installed_package():
        return f'pip install "t5x_like[{extra}]"' if extra else "pip install t5x_like"
    target = f'".[{extra}]"' if extra else "."
    return f"pip install -c constraints.txt -e {target}"


def command_line(prog: str) -> Callable:
    """Wraps a ``main(argv) -> int``: a ``UserError`` escaping it prints ``prog: message``
    and returns 2. Every command is wrapped once, here; none prints its own error."""
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
