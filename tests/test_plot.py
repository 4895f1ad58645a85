"""``python -m t5x_like.plot``: curves from metrics.jsonl, and its error messages.
The rendering test needs matplotlib (the ``plot`` extra) and skips without it."""

import json
import sys

from t5x_like import plot

RECORDS = [{"step": s, "loss": 5.0 / s, "accuracy": 0.1 * s} for s in range(1, 6)]
RECORDS[-1].update(eval_loss=1.5, eval_accuracy=0.4)


def write_run(tmp_path, records=RECORDS):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path


def test_renders_a_png(tmp_path):
    import matplotlib  # noqa: F401  (installed by the dev extra: a missing one must fail, not skip) is not installed")
    assert plot.main([f"--workdir={write_run(tmp_path)}"]) == 0
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_series_keeps_the_last_record_of_a_rewritten_step():
    records = RECORDS + [{"step": 3, "loss": 9.0}, {"step": 6, "loss": float("nan")}]
    assert plot.series(records, "loss") == ([1, 2, 3, 4, 5], [5.0, 2.5, 9.0, 1.25, 1.0])


def test_missing_metrics_name_the_file_and_the_fix(tmp_path, capsys):
    assert plot.main([f"--workdir={tmp_path}"]) == 2
    assert "metrics.jsonl does not exist; pass the --workdir of a training run" in \
        capsys.readouterr().err


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    assert plot.main([f"--workdir={write_run(tmp_path)}"]) == 2
    assert 'pip install -c constraints.txt -e ".[plot]"' in capsys.readouterr().err
