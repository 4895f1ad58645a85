"""What a plan's ``--topology`` names, and libtpu's environment: the part of the planner a
command needs before its config is read, so that it imports no JAX.

``plan`` and ``scaling plan`` check ``--topology`` and set libtpu's environment (which
libtpu reads when it loads) first; ``aot_planner`` compiles after the config is read.
"""

from __future__ import annotations

import os

from t5x_like.errors import UserError

GiB = 1024**3


class PlanError(UserError):
    """A bad topology or a missing compiler, with the fix in the message."""


def prepare_compiler_environment() -> None:
    """Environment libtpu needs to compile on a machine that is no TPU VM; call it before
    JAX starts its backends."""
    # libtpu asks a metadata server about TPU workers unless told this is no TPU VM.
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # Several planners (or a planner beside a test) may load libtpu at once.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def parse_topology(text: str) -> tuple[str, str | int]:
    """``cpu:8`` -> ("cpu", 8); ``v5p:4x4x4`` -> ("tpu", "v5p:4x4x4")."""
    kind, _, shape = text.partition(":")
    if not shape:
        raise PlanError(f"--topology={text!r}: expected NAME:SHAPE, e.g. v5p:4x4x4, v5e:4x4 "
                        "or cpu:8.")
    if kind == "cpu":
        if not shape.isdigit() or int(shape) < 1:
            raise PlanError(f"--topology={text!r}: cpu needs a device count, e.g. cpu:8.")
        return "cpu", int(shape)
    dims = shape.split("x")
    if not all(d.isdigit() and int(d) > 0 for d in dims) or len(dims) not in (2, 3):
        raise PlanError(f"--topology={text!r}: the chip grid must be 2 or 3 positive sizes "
                        "joined by x, e.g. v5e:4x4 or v5p:4x4x4.")
    return "tpu", text


def chip_grid(text: str) -> list[int]:
    """A TPU topology's physical axes (``parse_topology`` checked it): ``v5p:4x4x4`` ->
    [4, 4, 4]."""
    return [int(d) for d in text.partition(":")[2].split("x")]
