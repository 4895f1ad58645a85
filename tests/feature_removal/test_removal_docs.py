"""The feature-removal suite's bookkeeping: at least 40 features proved, every one listed
in docs/testing.md as the suite defines it, and every check borrowed from another test
pointing at a test that exists (that test is what shows the check holds)."""

import importlib
import pathlib

from removals import all_removals, table

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def test_at_least_40_features_are_proved_each_once():
    removals = all_removals()
    assert len(removals) >= 40, len(removals)
    features = [r.feature for r in removals]
    assert len(set(features)) == len(features), features


def test_the_docs_table_lists_every_removal_as_the_suite_defines_it():
    all_removals()
    assert table() in DOCS.read_text(), (
        "docs/testing.md's removal table is out of date; regenerate it with "
        "`.venv/bin/python tests/feature_removal/removals.py`")


def test_every_borrowed_check_names_a_test_that_runs():
    for removal in all_removals():
        if not removal.holds_in:
            continue
        path, _, name = removal.holds_in.partition("::")
        module = importlib.import_module(pathlib.Path(path).stem)
        function = getattr(module, name.partition("[")[0])
        assert function.__name__.startswith("test_") and (
            pathlib.Path(__file__).parents[2] / path).exists(), removal.holds_in
