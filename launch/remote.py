"""The shell scripts the launcher runs on each TPU VM worker over ssh.

Layout on a worker (paths under its ``$HOME``):

    t5x_like/                the repository, checked out at the launched commit
    t5x_like/.venv/          Python 3.11 with the project and the ``tpu`` extra
    t5x_like_logs/train.log  the training process's output (appended, one header per run)
    t5x_like_logs/train.pid  its process id: a run is live while this process is

Logs stay on the worker's disk, not in the workdir, because the workdir is usually a
gs:// bucket that a shell redirection cannot append to; ``launch tpu logs`` reads them
over ssh. Each script is one line, so ``--dry_run`` prints one command per line.
"""

from __future__ import annotations

import dataclasses
import re
import shlex

CHECKOUT = "t5x_like"
LOG_DIR = "t5x_like_logs"
LIVE_MARKER = "t5x_like-run:"
READY_MARKER = "t5x_like-ready:"
LAST_LOG_MARKER = "t5x_like-log:"
ALREADY_LIVE_EXIT = 17

_PATHS = f'd="$HOME"/{CHECKOUT}; logs="$HOME"/{LOG_DIR}'
_READ_PID = 'pid=$(cat "$logs"/train.pid 2>/dev/null || true)'
_IS_LIVE = '[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null'


def _join(*statements: str) -> str:
    return "; ".join(statements)


def setup(repo: str, commit: str, python_version: str, extra: str = "tpu") -> str:
    """Clone (once), check out ``commit``, install with constraints.txt and the extra.
    Idempotent: run it again after a failure or to move to another commit. Refuses
    while a run is live, since an editable install would change its code under it."""
    q = shlex.quote
    return _join(
        "set -eu", _PATHS, f"repo={q(repo)}; commit={q(commit)}", _READ_PID,
        f'if {_IS_LIVE}; then echo "a run is live on $(hostname) (pid $pid): stop it before '
        'setup changes its code" >&2; exit 3; fi',
        'if [ ! -d "$d"/.git ]; then git clone --quiet "$repo" "$d"; fi',
        'cd "$d"',
        'git remote set-url origin "$repo"',
        "git fetch --quiet origin",
        'if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then echo "commit $commit is not '
        'in $repo: push it, or pass --commit" >&2; exit 3; fi',
        'git checkout --quiet --force --detach "$commit"',
        # uv brings the Python the project needs (3.11+) whatever the VM image ships.
        'export PATH="$HOME/.local/bin:$PATH"',
        "command -v uv >/dev/null || python3 -m pip install --quiet --user uv",
        f"[ -x .venv/bin/python ] || uv venv --quiet --python {q(python_version)} .venv",
        f'uv pip install --quiet --python .venv/bin/python -c constraints.txt -e ".[{extra}]"',
        'echo "ready: $(git rev-parse --short HEAD) on $(hostname)"',
    )


def start(env_assignments: list[str], train_argv: list[str]) -> str:
    """Starts training detached (nohup, output to the log), unless a run is live."""
    command = shlex.join(["nohup", "env", *env_assignments, *train_argv])
    return _join(
        "set -eu", _PATHS, 'mkdir -p "$logs"', _READ_PID,
        f'if {_IS_LIVE}; then echo "a run is already live on $(hostname) (pid $pid)" >&2; '
        f"exit {ALREADY_LIVE_EXIT}; fi",
        'cd "$d"',
        'echo "=== started $(date -u +%Y-%m-%dT%H:%M:%SZ) ===" >> "$logs"/train.log',
        f'{command} >> "$logs"/train.log 2>&1 < /dev/null & echo $! > "$logs"/train.pid',
        'echo "started on $(hostname), pid $!"',
    )


def check() -> str:
    """Prints, in lines ``parse_check`` reads: is a run live, is the project installed,
    and the log's last line."""
    return _join(
        _PATHS, _READ_PID,
        f'if {_IS_LIVE}; then echo "{LIVE_MARKER} live $pid"; else echo "{LIVE_MARKER} none"; fi',
        f'if [ -x "$d"/.venv/bin/python ]; then echo "{READY_MARKER} yes"; '
        f'else echo "{READY_MARKER} no"; fi',
        f'echo "{LAST_LOG_MARKER} $(tail -n 1 "$logs"/train.log 2>/dev/null || true)"',
    )


def stop() -> str:
    """SIGTERM: the trainer saves a checkpoint and exits 0 (its preemption path)."""
    return _join(
        _PATHS, _READ_PID,
        f'if {_IS_LIVE}; then kill -TERM "$pid"; echo "$(hostname): sent SIGTERM to pid $pid; '
        'it checkpoints and exits"; else echo "$(hostname): no live run"; fi',
    )


def tail(lines: int, follow: bool) -> str:
    return shlex.join(["tail", "-n", str(lines), *(["-F"] if follow else [])]) + \
        f' "$HOME"/{LOG_DIR}/train.log'


@dataclasses.dataclass(frozen=True)
class WorkerState:
    live_pid: str | None   # the live run's process id, if any
    ready: bool            # setup has installed the project
    last_log_line: str


def parse_check(stdout: str) -> WorkerState:
    def line(marker: str) -> str | None:
        found = re.search(rf"^{re.escape(marker)} ?(.*)$", stdout, re.MULTILINE)
        return found.group(1).strip() if found else None
    live = re.fullmatch(r"live (\d+)", line(LIVE_MARKER) or "")
    return WorkerState(live.group(1) if live else None, line(READY_MARKER) == "yes",
                       line(LAST_LOG_MARKER) or "")
