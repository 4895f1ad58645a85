"""The one place commands are quoted and run.

A launcher builds ``Command`` values (argv lists) and hands them to a ``Runner``. A dry
run prints them with every value quoted by ``shlex``, so ``shlex.split`` of the printed
line is the exact argv and the line pastes into a shell; a real run executes the same
argv without a shell in between, so no value is ever re-parsed.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from typing import TextIO

from t5x_like.errors import UserError
from t5x_like.system import platforms


class LaunchFailed(Exception):
    """Something outside this machine failed (a queued resource, ssh to a worker): the
    message says what and what to do; the command line exits with status 1."""


@dataclasses.dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    label: str = ""  # whose command this is, e.g. "worker 2"; for messages only

    def render(self) -> str:
        """Shell-quoted so that ``shlex.split(render()) == argv``."""
        return " ".join(quote(token) for token in self.argv)


@dataclasses.dataclass(frozen=True)
class Result:
    command: Command
    returncode: int | None  # None: it did not finish in time
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def output_tail(self, lines: int = 15) -> list[str]:
        return (self.stdout + self.stderr).rstrip().splitlines()[-lines:]


def quote(token: str) -> str:
    """``shlex.quote``, but ``--flag=value`` keeps the flag outside the quotes
    (``--command='a b'`` rather than ``'--command=a b'``): the same word to a shell."""
    flag = re.fullmatch(r"(--[A-Za-z0-9][-A-Za-z0-9_.]*=)(.*)", token, re.DOTALL)
    if flag:
        return flag.group(1) + shlex.quote(flag.group(2))
    return shlex.quote(token)


def command(*argv: str, label: str = "") -> Command:
    return Command(tuple(str(a) for a in argv), label)


def _missing_program(argv: Sequence[str]) -> UserError:
    hints = {"gcloud": "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install)",
             "xpk": "install xpk (pip install xpk)",
             "sbatch": "run this on a SLURM login node"}
    hint = hints.get(argv[0], f"install {argv[0]}")
    return UserError(f"{argv[0]} is not on PATH: {hint}, or pass --dry_run to print the "
                     "commands instead.")


class Runner:
    """Prints commands (dry run) or runs them; one object so every step of a launcher goes
    through the same quoting and the same error handling."""

    def __init__(self, dry_run: bool, out: TextIO | None = None, parallel: int = 16):
        self.dry_run = dry_run
        self.out = out or sys.stdout
        self.parallel = max(1, parallel)

    def say(self, text: str) -> None:
        """A line for the reader: a shell comment in a dry run (so the output stays a
        runnable script), progress on stderr otherwise."""
        if self.dry_run:
            print(f"# {text}", file=self.out)
        else:
            print(text, file=sys.stderr, flush=True)

    def show(self, commands: Sequence[Command]) -> None:
        for c in commands:
            print(c.render(), file=self.out)

    def run_attached(self, c: Command) -> int:
        """Runs with the terminal attached (gcloud's own prompts and progress show)."""
        print(f"+ {c.render()}", file=sys.stderr, flush=True)
        try:
            return subprocess.run(c.argv, check=False, env=_environment()).returncode
        except FileNotFoundError:
            raise _missing_program(c.argv) from None

    def capture(self, c: Command, timeout_s: float | None = None) -> Result:
        try:
            done = subprocess.run(c.argv, capture_output=True, text=True, check=False,
                                  stdin=subprocess.DEVNULL, timeout=timeout_s,
                                  env=_environment())
        except FileNotFoundError:
            raise _missing_program(c.argv) from None
        except subprocess.TimeoutExpired as e:
            return Result(c, None, _text(e.stdout),
                          _text(e.stderr) + f"\n(no answer after {timeout_s:g} s)")
        return Result(c, done.returncode, done.stdout, done.stderr)

    def capture_all(self, commands: Sequence[Command],
                    timeout_s: float | None = None) -> list[Result]:
        """Runs the commands side by side (``parallel`` at a time), results in order: one
        ssh per worker, so a failure has a worker's name on it."""
        if not commands:
            return []
        with concurrent.futures.ThreadPoolExecutor(min(self.parallel, len(commands))) as pool:
            return list(pool.map(lambda c: self.capture(c, timeout_s), commands))


def _environment() -> dict[str, str]:
    """This process's environment minus the backend choice importing t5x_like made for
    this machine: ``sbatch`` copies the environment into the job, and a login node
    without GPUs would otherwise tell the GPU nodes to run on the CPU."""
    return platforms.environment_for_other_machines(os.environ)


def _text(value) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def report_failures(results: Sequence[Result], what: str, advice: str = "",
                    show_ok: bool = True, out: TextIO | None = None) -> None:
    """One line per command, with the output's tail under each failure; raises
    ``LaunchFailed`` naming every failed one."""
    out = out or sys.stderr
    failed = [r for r in results if not r.ok]
    for r in results:
        if r.ok:
            if show_ok:
                print(f"{r.command.label}: ok", file=out)
            continue
        status = "no answer in time" if r.returncode is None else f"exit {r.returncode}"
        print(f"{r.command.label}: FAILED ({status})", file=out)
        for line in r.output_tail():
            print(f"  | {line}", file=out)
    if failed:
        names = ", ".join(r.command.label for r in failed)
        raise LaunchFailed(f"{what} failed on {names} ({len(failed)} of {len(results)}); "
                           f"its output is above.{' ' + advice if advice else ''}")
