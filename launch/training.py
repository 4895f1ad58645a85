"""The training command every launcher starts: the same ``python -m t5x_like.train`` on
every host, with the environment spelled out on the command line rather than taken
from whatever a worker's shell profile sets.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from collections.abc import Sequence

from t5x_like.errors import UserError

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent

# Unbuffered so the per-worker log shows progress as it happens, not in 8 KiB chunks.
DEFAULT_ENV = (("PYTHONUNBUFFERED", "1"),)


@dataclasses.dataclass(frozen=True)
class TrainRun:
    config: str                          # relative to the repository root
    workdir: str
    extra_args: tuple[str, ...] = ()     # after `--` on the launcher's command line
    env: tuple[tuple[str, str], ...] = DEFAULT_ENV
    multislice: bool = False

    def argv(self, python: str) -> list[str]:
        # mesh.dcn=0: data parallelism over as many slices as JAX finds, so the DCN
        # axis comes from the slices the cloud gave us, not from the config file.
        dcn = ["--config.mesh.dcn=0"] if self.multislice else []
        return [python, "-m", "t5x_like.train", f"--config={self.config}",
                f"--workdir={self.workdir}", *dcn, *self.extra_args]

    def env_assignments(self) -> list[str]:
        return [f"{key}={value}" for key, value in self.env]


def split_train_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Launcher flags, then everything after the first ``--`` for ``t5x_like.train``."""
    argv = list(argv)
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    return argv, []


def parse_env(assignments: Sequence[str]) -> tuple[tuple[str, str], ...]:
    pairs = dict(DEFAULT_ENV)
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UserError(f"--env={item!r}: expected NAME=VALUE with NAME a shell variable "
                            "name, e.g. --env=XLA_FLAGS=--xla_dump_to=/tmp/xla.")
        pairs[key] = value
    return tuple(pairs.items())


def repo_relative_config(config: str) -> str:
    """The config as a path inside the repository: the workers run it from their own
    clone, so it must exist here, at the launched commit, under the same path."""
    path = pathlib.Path(config)
    if path.is_absolute():
        try:
            path = path.resolve().relative_to(REPO_ROOT)
        except ValueError:
            raise UserError(f"--config={config} is outside this repository; the workers only "
                            "have the repository's files. Put the config under configs/ (and "
                            "commit it), then pass --config=configs/NAME.py.") from None
    if not (REPO_ROOT / path).is_file():
        raise UserError(f"--config={config}: no such file in this repository ({REPO_ROOT.name}/"
                        f"{path}); pass a path like configs/t5_1_1_base.py.")
    return path.as_posix()


def train_run(config: str, workdir: str, extra_args: Sequence[str], env: Sequence[str],
              multislice: bool) -> TrainRun:
    for arg in extra_args:
        if arg.split("=")[0] in ("--dry_run", "--env"):
            raise UserError(f"{arg} comes after `--`, so it would go to t5x_like.train; put it "
                            "before `--`.")
        if arg.split("=")[0] in ("--config", "--workdir"):
            raise UserError(f"{arg} after `--`: pass --config and --workdir to the launcher "
                            "itself; after `--` go only extra train flags, e.g. "
                            "--config.batch_size=256.")
    if not workdir:
        raise UserError("--workdir is empty: pass the run's folder, e.g. "
                        "--workdir=gs://BUCKET/runs/NAME.")
    return TrainRun(repo_relative_config(config), workdir, tuple(extra_args), parse_env(env),
                    multislice)


def shared_workdir_note(workdir: str, hosts: int) -> str | None:
    """Every host of a run writes its part of each checkpoint into the workdir, so a
    multi-host run needs one all hosts share."""
    if hosts > 1 and not workdir.startswith("gs://"):
        return (f"note: --workdir={workdir} is not a gs:// path; with {hosts} hosts it must be "
                "a folder every host shares (a bucket or a shared mount), or checkpoints "
                "will be split across the hosts' disks.")
    return None
