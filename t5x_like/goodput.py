"""Goodput of a training workdir across all its restarts: productive training time over
wall time, and the badput by cause (start-up, checkpoint restore, compilation, data input,
checkpoint saves, evaluation, progress lost to restarts, hangs, time between runs),
from the events ``train`` records in ``WORKDIR/goodput.jsonl``.

    python -m t5x_like.goodput /tmp/t5x_like_run [--json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

from t5x_like import errors
from t5x_like.system import storage
from t5x_like.telemetry import goodput_events


def format_report(workdir, result: dict) -> str:
    wall = result["wall_s"]
    lines = [f"goodput of {storage.display(workdir)}: {100 * result['goodput']:.1f}% "
             f"(productive {result['causes']['productive']:.1f} s of {wall:.1f} s wall time, "
             f"{len(result['runs'])} run(s))", "",
             f"{'cause':<20} {'seconds':>10} {'%':>6}"]
    for cause in goodput_events.CAUSES:
        seconds = result["causes"][cause]
        lines.append(f"{cause:<20} {seconds:>10.1f} {100 * seconds / max(wall, 1e-12):>6.1f}")
    lines += ["", "runs:"]
    for i, run in enumerate(result["runs"], 1):
        start = datetime.datetime.fromtimestamp(run["start"], datetime.UTC)
        lines.append(f"  {i}. {start:%Y-%m-%d %H:%M:%S} UTC, {run['end'] - run['start']:.1f} s, "
                     f"steps {run['resumed_from'] or 0} -> {run['last_step']}, "
                     f"ended: {run['ended']}")
    return "\n".join(lines)


@errors.command_line("goodput")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m t5x_like.goodput", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", help="A train --workdir (local or gs://).")
    parser.add_argument("--json", action="store_true", help="The accounting as JSON.")
    args = parser.parse_args(argv)
    workdir = storage.path(args.workdir)
    if not workdir.exists():
        raise errors.MissingFile(f"{args.workdir} does not exist; pass a train --workdir.")
    events = goodput_events.read_events(workdir)
    if not events:
        raise errors.UserError(f"{args.workdir} has no {goodput_events.EVENTS_NAME}: it is "
                               "written by train runs (this workdir has none, or they predate "
                               "goodput events).")
    result = goodput_events.account(events)
    print(json.dumps(result, indent=1) if args.json else format_report(workdir, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
