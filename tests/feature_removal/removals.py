"""The feature-removal suite's machinery: a feature is proved by a check that holds with
it and fails without it.

A ``Removal`` names a headline feature, a monkeypatch that takes it out while leaving
the program runnable (tests only: the package has no switch for it), and the
discriminating check it must break. ``proving_tests(REMOVALS)`` gives a module its two
parametrised tests: the check holds as the code is, and the check fails (one of its
assertions, an ``AssertionError`` or pytest's failure; not a crash) with the removal
applied. Every removal is listed
in docs/testing.md's table (``test_removal_docs.py`` holds the two together).

JAX caches traces by function: a check that jits a function traced before the
removal would run the feature's program again. Every run starts from empty caches
(``jax.clear_caches``) and the structures' own caches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterator

import jax
import pytest


@dataclasses.dataclass(frozen=True)
class Removal:
    """``feature``: what is proved; ``removal``: one line on what the monkeypatch does;
    ``check``: one line on what catches it; ``remove(monkeypatch)`` applies it;
    ``verify(request)`` is the check (its fixtures through ``request.getfixturevalue``).

    ``holds_in``: where the check is a test of the suite itself (``module::function``),
    that test is what shows it holds with the feature (it runs in every CI run); the
    suite then runs it only with the removal."""

    feature: str
    removal: str
    check: str
    remove: Callable[[pytest.MonkeyPatch], None]
    verify: Callable[[pytest.FixtureRequest], None]
    holds_in: str = ""

    @property
    def id(self) -> str:
        return self.feature.replace(" ", "_").replace("/", "_")


#: every module's removals, by module, as collected (the docs test reads them)
REGISTRY: dict[str, list[Removal]] = {}


def fresh_caches() -> None:
    """No trace or structure from before: a removal must be traced into the program (and
    orbax's array handler is registered again, as the checkpoint store sets it now)."""
    from t5x_like import structures
    from t5x_like.checkpoints import checkpoint_store
    jax.clear_caches()
    for value in vars(structures).values():
        if hasattr(value, "cache_clear"):
            value.cache_clear()
    checkpoint_store._split_only_large_replicated_writes.cache_clear()


def proving_tests(removals: list[Removal]) -> dict[str, Callable]:
    """A module's tests of its ``removals`` (``globals().update(...)`` them): each check
    holds with the feature (those whose check is not a test of the suite already), and
    each check fails with its removal."""
    module = inspect.stack()[1].frame.f_globals["__name__"]
    REGISTRY[module] = list(removals)
    own = [r for r in removals if not r.holds_in]

    @pytest.mark.parametrize("removal", own, ids=[r.id for r in own])
    def test_the_check_holds_with_the_feature(removal: Removal, request):
        fresh_caches()
        removal.verify(request)

    @pytest.mark.parametrize("removal", removals, ids=[r.id for r in removals])
    def test_the_check_fails_without_the_feature(removal: Removal, request, monkeypatch):
        fresh_caches()
        removal.remove(monkeypatch)
        try:
            with pytest.raises((AssertionError, pytest.fail.Exception)):
                removal.verify(request)
        finally:
            monkeypatch.undo()
            fresh_caches()

    tests = {"test_the_check_fails_without_the_feature": test_the_check_fails_without_the_feature}
    if own:  # an empty parametrisation would be reported as skipped
        tests["test_the_check_holds_with_the_feature"] = test_the_check_holds_with_the_feature
    return tests


# -- what checks read ---------------------------------------------------------------


@contextlib.contextmanager
def compiled_programs() -> Iterator[list[str]]:
    """The optimized HLO of every program compiled (or read from the persistent cache)
    inside the block, in order: what a command ran, without reaching into it."""
    from jax._src import compiler
    found: list[str] = []
    original = compiler.compile_or_get_cached

    def recording(*args, **kwargs):
        executable = original(*args, **kwargs)
        found.extend(module.to_string() for module in executable.hlo_modules())
        return executable
    compiler.compile_or_get_cached = recording
    try:
        yield found
    finally:
        compiler.compile_or_get_cached = original


def called_from(filename: str) -> bool:
    """Whether a frame of the current call stack runs ``filename`` (a path's tail): a
    removal that takes a feature out of one command only."""
    return any(frame.filename.endswith(filename) for frame in inspect.stack()[2:])


def existing(test: str, **parameters) -> tuple[str, Callable]:
    """``(holds_in, check)`` of a test of the suite used as a check: ``test`` is
    ``module::function``, ``parameters`` its parametrised arguments; its fixtures come
    from the removal test's ``request`` (a module's own fixtures must be imported into
    the removal module, as pytest finds fixtures by module)."""
    import importlib
    module_name, _, name = test.partition("::")
    function = getattr(importlib.import_module(module_name.removesuffix(".py")), name)
    fixtures = [p for p in inspect.signature(function).parameters if p not in parameters]

    def check(request):
        function(**parameters, **{f: request.getfixturevalue(f) for f in fixtures})
    shown = "-".join(str(v) for v in parameters.values())
    return f"tests/{test}" + (f"[{shown}]" if shown else ""), check


def all_removals() -> list[Removal]:
    """Every module's removals, in file order (the modules are imported to register)."""
    import importlib
    import pathlib
    for path in sorted(pathlib.Path(__file__).parent.glob("test_removal_*.py")):
        importlib.import_module(path.stem)
    return [r for module in sorted(REGISTRY) for r in REGISTRY[module]]


def table() -> str:
    """docs/testing.md's table of removals, as the suite defines them."""
    rows = ["| feature | removal (a monkeypatch in the test) | the check that catches it | "
            "check holds in |", "| --- | --- | --- | --- |"]
    for module in sorted(REGISTRY):
        for r in REGISTRY[module]:
            where = f"`{r.holds_in}`" if r.holds_in else f"`tests/feature_removal/{module}.py`"
            rows.append(f"| {r.feature} | {r.removal} | {r.check} | {where} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python tests/feature_removal/removals.py: the docs table
    import pathlib
    import sys
    sys.path[:0] = [str(pathlib.Path(__file__).parents[1])]  # tests/, for conftest and helpers
    import removals  # the module the suite's modules register in (not this __main__)
    removals.all_removals()
    print(removals.table())
