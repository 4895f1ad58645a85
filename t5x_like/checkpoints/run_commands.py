"""The commands that launched a run, kept in its workdir (``COMMANDS_FILE``, a JSON line
per launch: the command as typed, the step it started from, when): a resumed run's
history, and what ``convert export``'s model card prints under "how it was trained"."""

from __future__ import annotations

import datetime
import json

COMMANDS_FILE = "commands.jsonl"


def record(workdir, command: str, step: int) -> None:
    """Adds a launch of ``command`` from ``step``; ``workdir`` a path of any store."""
    entry = {"command": command, "from_step": int(step),
             "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    path = workdir / COMMANDS_FILE  # read and rewritten: object stores do not append
    before = path.read_text() if path.exists() else ""
    path.write_text(before + json.dumps(entry) + "\n")


def launches(workdir) -> list[dict]:
    """Every launch recorded in ``workdir``, oldest first (none for runs from before)."""
    path = workdir / COMMANDS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
