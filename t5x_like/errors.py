"""The one error path: what the user caused is a :class:`UserError` with the fix in its
message; every command line prints it as one line and exits with status 2. Anything
else escaping a command is a bug in t5x_like and keeps its traceback.

A leaf module (standard library only), so that every layer may raise these, and so
that ``launch/`` runs without the project's dependencies installed.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import re
import sys
from collections.abc import Callable, Iterator, Sequence

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


NO_VALUE = object()  # DataError(value=...) not given (None is a value a record may hold)


class DataError(UserError):
    """A mistake in the user's data (a row, a file, a column, a field, a template, a chat
    role), said as one line: ``[at step N: ][where: ]message``.

    ``where`` is the place: ``file:line`` for line files (JSONL, text, TSV, CSV),
    ``file row N`` for Parquet, datasets folders and TFRecord indices; ``field`` the
    column or field at fault. ``step`` is set when training met the row mid-run
    (:func:`at_step`), so the user knows how far the run got. A step that cannot know
    the place passes ``value=`` (a value the record holds) or ``lacks=`` (fields it
    lacks): the task reading it looks the record up in its source (``located``).

    Crosses process boundaries whole: grain workers pickle it (``__reduce__`` keeps the
    attributes, drops the look-up hints), and :func:`data_error_in` finds it inside a
    wrapping exception or a Beam worker's traceback text."""

    def __init__(self, message: str, *, where: str | None = None, field: str | None = None,
                 value=NO_VALUE, lacks: Sequence[str] = ()):
        self.message, self.where, self.field, self.step = message, where, field, None
        self.lookup = ({"value": value} if value is not NO_VALUE else
                       {"lacks": tuple(lacks)} if lacks else None)
        super().__init__(self._line())

    def _line(self) -> str:
        step = f"at step {self.step}" if self.step is not None else None
        return ": ".join(part for part in (step, self.where, self.message) if part)

    def __str__(self) -> str:  # one line, also for subclasses that are KeyErrors
        return self._line()

    def __reduce__(self):
        state = {**self.__dict__, "lookup": None}  # a looked-up value may not pickle
        return _rebuild_data_error, (type(self), self.args, state)

    def _replace(self, **changes) -> DataError:
        new = copy.copy(self)
        new.__dict__.update(changes)
        new.args = (new._line(),)
        return new

    def located(self, where: str | None) -> DataError:
        """This error at ``where`` (found by the task that read the record), without the
        look-up hints."""
        return self._replace(where=where or self.where, lookup=None)

    def at_step(self, step: int) -> DataError:
        return self._replace(step=int(step))

    def within(self, context: str) -> DataError:
        """This error said within ``context`` (e.g. ``Task 'x'``) when it names no place
        of its own."""
        return self if self.where else self._replace(message=f"{context}: {self.message}")


class MissingField(DataError, KeyError):
    """A record or example lacks a field a step or the model needs. Still a ``KeyError``
    for code that catches that."""


def _rebuild_data_error(cls, args, state) -> DataError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


# The last line of a formatted traceback: ``package.module.Class: message``, as a Beam
# worker sends an exception back (text, not the exception object).
_TRACEBACK_LINE = re.compile(r"^((?:\w+\.)+)(\w+): (.+)$", re.MULTILINE)


def _data_error_class(module: str, name: str) -> type[DataError] | None:
    """The DataError class (or subclass) named ``module.name``, if one is imported."""
    classes = [DataError]
    while classes:
        cls = classes.pop()
        if cls.__module__ == module and cls.__name__ == name:
            return cls
        classes.extend(cls.__subclasses__())
    return None


def data_error_in(error: BaseException) -> DataError | None:
    """The :class:`DataError` an exception stands for, or None: ``error`` itself or the
    first raised of its causes and contexts (Beam re-raises ``type(e)(message + " [while
    running ...]")`` over the original), else one its message names, as a Beam runner
    in other processes reports a worker's traceback (text: rebuilt from its class and
    line). What a boundary that reads data (batches, a Beam pipeline) re-raises, so the
    command line prints the data's one line instead of the wrapper's traceback."""
    found, chain = None, []
    while error is not None and all(error is not seen for seen in chain):
        chain.append(error)
        if isinstance(error, DataError):
            found = error  # keep going: the innermost is the original
        # as a traceback reads: the cause, else the context unless raised "from None"
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    if found is not None:
        return found
    for wrapper in chain:
        for module, name, line in _TRACEBACK_LINE.findall(str(wrapper)):
            cls = _data_error_class(module.rstrip("."), name)
            if cls is not None:
                return cls(line)
    return None


@contextlib.contextmanager
def at_step(step: int) -> Iterator[None]:
    """A data error met inside says at which training ``step`` (once: an inner step
    stays); other errors pass as they are."""
    try:
        yield
    except DataError as e:
        if e.step is not None:
            raise
        raise e.at_step(step).with_traceback(e.__traceback__) from None


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
