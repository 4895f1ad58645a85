"""No vacuous passes: under CI (``CI`` set, as ``.ci/run`` sets it) a skipped test, a
module skipped at collection (``pytest.importorskip``, ``pytest.skip(...,
allow_module_level=True)``) and a test reported xfailed or xpassed each fail the run,
unless listed in ``ALLOWED_SKIPS`` / ``ALLOWED_XFAILS`` with the reason it cannot run
on CI's machine. Local runs are left alone.

A pytest plugin that imports nothing but pytest (``tests/test_ci_honesty.py`` runs it in
nested pytest runs). ``tests/conftest.py`` installs it with :func:`register`. Under
pytest-xdist only the controller judges: it receives every worker's test reports
(``pytest_runtest_logreport``) and the skipped or failed collection reports
(``pytest_collectreport``), and it decides the exit status.
"""

from __future__ import annotations

import os

import pytest

# Node ids (or prefixes of them: a module path covers its tests) -> why they may skip in
# CI. Every package the tests need is installed by the README's test command, so nothing
# is listed today.
ALLOWED_SKIPS: dict[str, str] = {}
# Node ids (or prefixes) -> why they may be marked xfail in CI. Nothing is listed today.
ALLOWED_XFAILS: dict[str, str] = {}


def _reason(report) -> str:
    if isinstance(report.longrepr, tuple):  # (path, line, "Skipped: ...")
        return str(report.longrepr[-1])
    return str(report.longrepr) if report.longrepr else ""


class CiGuard:
    """Collects skips and xfails from the reports; fails the session at its end."""

    def __init__(self, allowed_skips: dict[str, str], allowed_xfails: dict[str, str]):
        self.allowed_skips, self.allowed_xfails = allowed_skips, allowed_xfails
        self.refused: list[str] = []

    @staticmethod
    def _listed(nodeid: str, allowed: dict[str, str]) -> bool:
        return any(nodeid == key or nodeid.startswith((key + "::", key + "["))
                   or (key.endswith("/") and nodeid.startswith(key)) for key in allowed)

    def pytest_collectreport(self, report):
        # A module (or class) skipped while being collected: its tests never ran.
        if report.skipped and not self._listed(report.nodeid, self.allowed_skips):
            self.refused.append(f"{report.nodeid or '<session>'}: skipped at collection: "
                                f"{_reason(report)}")

    def pytest_runtest_logreport(self, report):
        if hasattr(report, "wasxfail"):
            if (report.skipped or report.passed) and report.when in ("setup", "call") and (
                    not self._listed(report.nodeid, self.allowed_xfails)):
                outcome = "xfailed" if report.skipped else "xpassed"
                self.refused.append(f"{report.nodeid}: {outcome}: {report.wasxfail}")
        elif report.skipped and not self._listed(report.nodeid, self.allowed_skips):
            self.refused.append(f"{report.nodeid}: {_reason(report)}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        if not self.refused:
            return
        message = ("CI fails on skipped and xfail-marked tests (tests/ci_guard.py "
                   "ALLOWED_SKIPS and ALLOWED_XFAILS list the only accepted ones):\n"
                   + "\n".join(f"  {line}" for line in self.refused))
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(message, red=True)
        else:
            print(message)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def register(config, allowed_skips: dict[str, str] | None = None,
             allowed_xfails: dict[str, str] | None = None) -> CiGuard | None:
    """Install the guard for this session when ``CI`` is set (from ``pytest_configure``).
    In a pytest-xdist worker it stays out: the controller sees the workers' reports."""
    if os.environ.get("CI", "").lower() in ("", "0", "false") or hasattr(config, "workerinput"):
        return None
    guard = CiGuard(ALLOWED_SKIPS if allowed_skips is None else allowed_skips,
                    ALLOWED_XFAILS if allowed_xfails is None else allowed_xfails)
    config.pluginmanager.register(guard, "ci_guard")
    return guard
