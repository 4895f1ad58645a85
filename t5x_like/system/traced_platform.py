"""The platform a program is traced for, which need not be the machine's.

The planner compiles TPU programs on a CPU machine, so what a traced model picks
(attention kernels, CPU-only layouts such as decoding's transposed kernels) follows
the platform the trainer names from its mesh, not ``jax.default_backend()``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax

_TARGET_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "target_platform", default=None)


@contextlib.contextmanager
def target_platform(platform: str | None) -> Iterator[None]:
    """The platform the traced program runs on (``cpu``, ``gpu``, ``tpu``) while the
    block runs; the trainer sets it from its mesh."""
    token = _TARGET_PLATFORM.set(platform)
    try:
        yield
    finally:
        _TARGET_PLATFORM.reset(token)


def current_platform() -> str:
    """The platform set by :func:`target_platform`, else JAX's default backend."""
    return _TARGET_PLATFORM.get() or jax.default_backend()
