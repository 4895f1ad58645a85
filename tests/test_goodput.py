"""Goodput: the accounting of recorded events across restarts (causes add up to the wall
time; steps trained again after a restart are lost; a hang's tail is a hang), the
command's report, and the events a real train and its resume write."""

import json
import time

import pytest
from conftest import tiny_config

from t5x_like import goodput, train
from t5x_like.telemetry import goodput_events


def ev(run, kind, t, **fields):
    return {"run": run, "kind": kind, "t": t, **fields}


EVENTS = [
    # run a: new run; steps 1-4 then 5-8 (checkpoint at 4), killed after step 8
    ev("a", "start", 100.0),
    ev("a", "setup", 103.0, restore_s=0.0, resumed_from=0),
    ev("a", "steps", 110.0, step=1, compile_s=6.0, data_s=0.5, checkpoint_save_s=0.0,
       evaluation_s=0.0),
    ev("a", "steps", 118.0, step=4, compile_s=0.0, data_s=1.0, checkpoint_save_s=2.0,
       evaluation_s=1.0),
    ev("a", "steps", 126.0, step=8, compile_s=0.0, data_s=0.0, checkpoint_save_s=0.0,
       evaluation_s=0.0),
    # run b starts 14 s later, resumes from step 4, hangs after step 6
    ev("b", "start", 140.0),
    ev("b", "setup", 145.0, restore_s=2.0, resumed_from=4),
    ev("b", "steps", 150.0, step=6, compile_s=4.0, data_s=0.0, checkpoint_save_s=0.0,
       evaluation_s=0.0),
    ev("b", "hang", 160.0),
]


def test_accounting_of_a_killed_run_and_a_hung_resume():
    result = goodput_events.account(EVENTS)
    causes = result["causes"]
    assert result["wall_s"] == pytest.approx(160.0 - 100.0)
    assert sum(causes.values()) == pytest.approx(result["wall_s"], abs=1e-9)
    expected = {"startup": 3.0 + 3.0, "checkpoint_restore": 2.0, "compile": 6.0 + 4.0,
                "data": 1.5, "rollout": 0.0, "checkpoint_save": 2.0, "evaluation": 1.0,
                # run a's steps 5-8 (8 s) were trained again by run b
                "lost_to_restart": 8.0, "hang": 10.0, "between_runs": 14.0,
                "productive": 0.5 + 4.0 + 1.0, "other": 0.0}
    assert causes == pytest.approx(expected)
    assert result["goodput"] == pytest.approx(5.5 / 60.0)
    assert [r["ended"] for r in result["runs"]] == ["killed", "hang"]
    assert "lost_to_restart 8.0 s" in goodput_events.one_line(result)


def test_command_reports_the_table_and_refuses_a_workdir_without_events(tmp_path, capsys):
    (tmp_path / goodput_events.EVENTS_NAME).write_text(
        "".join(json.dumps(e) + "\n" for e in EVENTS) + '{"torn')
    assert goodput.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "goodput of" in out and "9.2%" in out and "between_runs" in out
    assert "steps 4 -> 6, ended: hang" in out
    assert goodput.main([str(tmp_path / "nothing_here")]) == 2
    (tmp_path / "empty").mkdir()
    assert goodput.main([str(tmp_path / "empty")]) == 2
    assert "has no goodput.jsonl" in capsys.readouterr().err


def test_train_and_its_resume_record_events_that_add_up(tmp_path, capsys):
    workdir = tmp_path / "run"
    began = time.time()
    # Held-out evaluation stays off (a compile less per run); its accounting is above.
    train.run(tiny_config(num_train_steps=4, eval_every_steps=0, checkpoint_every_steps=2,
                          log_every_steps=2), str(workdir))
    train.run(tiny_config(num_train_steps=6, eval_every_steps=0, checkpoint_every_steps=2,
                          log_every_steps=2), str(workdir))
    ended = time.time()
    out = capsys.readouterr().out
    assert "goodput " in out  # the line at the end of train
    print([line for line in out.splitlines() if line.startswith("goodput ")])
    result = goodput_events.account(goodput_events.read_events(workdir))
    causes = result["causes"]
    assert sum(causes.values()) == pytest.approx(result["wall_s"], abs=1e-6)
    assert 0 < result["wall_s"] <= ended - began
    assert result["wall_s"] > 0.9 * (ended - began) - 1.0  # all but train.run's entry
    for cause in ("productive", "startup", "checkpoint_restore", "compile", "checkpoint_save",
                  "between_runs"):
        assert causes[cause] > 0, cause
    assert causes["lost_to_restart"] == 0 and causes["hang"] == 0
    assert [(r["resumed_from"], r["last_step"], r["ended"]) for r in result["runs"]] == \
        [(0, 4, "done"), (4, 6, "done")]
    # A TensorBoard point per run: the goodput of the run so far, at its last step.
    # Every event file (each writer opens its own), read whole.
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util
    points = sorted((event.step, tensor_util.make_ndarray(value.tensor).item())
                    for path in (workdir / "tensorboard").glob("events.out.tfevents.*")
                    for event in EventFileLoader(str(path)).Load()
                    for value in event.summary.value if value.tag == "goodput/fraction")
    assert [step for step, _ in points] == [4, 6]
    assert points[-1][1] == pytest.approx(result["goodput"], rel=1e-5)
