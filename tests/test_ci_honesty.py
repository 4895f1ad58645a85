"""CI means what it says: under ``CI=true`` (which ``.ci/run`` sets itself) a module
skipped at collection, a test skipped at run time and an xfail each fail the run, naming
the test, also under pytest-xdist's ``-n 2 --dist loadscope`` as the suite runs; a clean
run, an allow-listed skip and a local run (no ``CI``) pass. Each case is a nested pytest
run of a small test folder whose conftest.py installs ``tests/ci_guard.py`` (the plugin
``tests/conftest.py`` installs); nothing there imports JAX."""

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

CONFTEST = textwrap.dedent("""
    import ci_guard

    ALLOWED_SKIPS = {}
    ALLOWED_XFAILS = {}


    def pytest_configure(config):
        ci_guard.register(config, ALLOWED_SKIPS, ALLOWED_XFAILS)
""")
PASSING = "def test_one():\n    assert 1 + 1 == 2\n\n\ndef test_two():\n    assert 'a' < 'b'\n"
OFFENDERS = {
    "module_skip": ("test_needs_a_package.py",
                    "import pytest\n\npytest.importorskip('no_such_package_t5xl')\n\n\n"
                    "def test_never_collected():\n    pass\n",
                    "test_needs_a_package.py: skipped at collection:"),
    "runtime_skip": ("test_skips.py",
                     "import pytest\n\n\ndef test_needs_something():\n"
                     "    pytest.skip('not installed')\n",
                     "test_skips.py::test_needs_something: Skipped: not installed"),
    "xfail": ("test_xfails.py",
              "import pytest\n\n\n@pytest.mark.xfail(reason='known broken')\n"
              "def test_known_broken():\n    assert False\n",
              "test_xfails.py::test_known_broken: xfailed: known broken"),
    "xpass": ("test_xpasses.py",
              "import pytest\n\n\n@pytest.mark.xfail(reason='was broken once')\n"
              "def test_fixed_since():\n    assert True\n",
              "test_xpasses.py::test_fixed_since: xpassed: was broken once"),
}


def _folder(tmp_path, offenders: tuple[str, ...] = (), conftest: str = CONFTEST) -> pathlib.Path:
    (tmp_path / "conftest.py").write_text(conftest)
    # Two modules of passing tests beside the offenders: loadscope spreads them over both
    # workers, so the offenders' reports reach the controller from a worker.
    (tmp_path / "test_passing_a.py").write_text(PASSING)
    (tmp_path / "test_passing_b.py").write_text(PASSING)
    for offender in offenders:
        name, text, _ = OFFENDERS[offender]
        (tmp_path / name).write_text(text)
    return tmp_path


def _pytest(folder: pathlib.Path, ci: bool = True) -> subprocess.CompletedProcess:
    """pytest as CI runs it (``-n 2 --dist loadscope``, pyproject.toml's addopts) on
    ``folder``; the environment has no trace of the outer run (xdist's worker id)."""
    env = {k: v for k, v in os.environ.items()
           if k != "CI" and not k.startswith(("PYTEST_", "XLA_", "JAX_"))}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO / "tests"), env.get("PYTHONPATH", "")) if p)
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadscope", "-p", "no:cacheprovider",
         "--rootdir", str(folder), str(folder)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def test_ci_fails_on_each_kind_of_vacuous_pass_naming_the_test(tmp_path):
    """One nested run holds an offender of each kind (one run, not four: each is a pytest
    with two workers): the guard names every one of them, so a kind it let through would be
    missing from the list, and only the guard fails the run."""
    result = _pytest(_folder(tmp_path, tuple(OFFENDERS)))
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert "CI fails on skipped and xfail-marked tests" in output, output
    for offender, (_, _, named) in OFFENDERS.items():
        assert named in output, (offender, output)
    # The four passing tests ran on the workers and passed: only the guard failed the run.
    summary = result.stdout.strip().splitlines()[-1]
    assert "4 passed" in summary and not re.search(r"\d+ failed", summary), output
    assert "created: 2/2 workers" in output, output


def test_a_clean_run_passes_in_ci(tmp_path):
    result = _pytest(_folder(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout and "CI fails" not in result.stdout


def test_allow_listed_skips_and_xfails_pass_in_ci_and_local_runs_are_left_alone(tmp_path):
    conftest = CONFTEST.replace(
        "ALLOWED_SKIPS = {}", "ALLOWED_SKIPS = {'test_needs_a_package.py': 'why',"
                              " 'test_skips.py::test_needs_something': 'why'}").replace(
        "ALLOWED_XFAILS = {}", "ALLOWED_XFAILS = {'test_xfails.py': 'why'}")
    folder = _folder(tmp_path, ("module_skip", "runtime_skip", "xfail"), conftest=conftest)
    listed = _pytest(folder)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    (folder / OFFENDERS["xpass"][0]).write_text(OFFENDERS["xpass"][1])  # not listed
    (folder / "conftest.py").write_text(CONFTEST)  # nothing listed
    local = _pytest(folder, ci=False)
    assert local.returncode == 0, local.stdout + local.stderr
    assert "CI fails" not in local.stdout


def test_ci_run_script_sets_ci_before_pytest():
    """``.ci/run`` by hand judges as the CI runner does: it exports CI=true itself."""
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    pytest_line = next(i for i, line in enumerate(lines) if line.endswith("-m pytest"))
    assert "export CI=true" in lines[:pytest_line], lines


def test_the_suites_conftest_installs_the_guard():
    """tests/conftest.py registers the same plugin these nested runs test, with the
    suite's (empty) allow lists."""
    import ci_guard
    text = (REPO / "tests" / "conftest.py").read_text()
    assert re.search(r"def pytest_configure\(config\):\n\s+ci_guard\.register\(config\)", text)
    assert isinstance(ci_guard.ALLOWED_SKIPS, dict) and isinstance(ci_guard.ALLOWED_XFAILS, dict)
