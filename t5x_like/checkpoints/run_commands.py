"""The commands that launched a run, kept in its workdir (``COMMANDS_FILE``, a JSON line
per launch: the command as typed, the step it started from, when): a resumed run's
history, and what ``convert export``'s model card prints under "how it was trained"."""

from __future__ import annotations

import datetime
import json

from t5x_like.system import storage

COMMANDS_FILE = "commands.jsonl"


def record(workdir, command: str, step: int) -> None:
    """Adds a launch of ``command`` from ``step``; ``workdir`` a path of any store."""
    entry = {"command": command, "from_step": int(step),
             "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    log = storage.AppendLog(workdir / COMMANDS_FILE)
    try:
        log.append(json.dumps(entry) + "\n")
    finally:
        log.close()


def launches(workdir) -> list[dict]:
    """Every launch recorded in ``workdir``, oldest first (none for runs from before)."""
    return json_lines(workdir / COMMANDS_FILE)


def json_lines(path) -> list[dict]:
    """The records of a JSON-lines file of a run's workdir (``commands.jsonl``,
    ``metrics.jsonl``); none where it does not exist."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
