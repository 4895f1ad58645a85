import io
import json
import math

from t5x_like.telemetry import metrics_writer


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_plain_lines_when_not_a_terminal():
    stream = io.StringIO()
    progress = metrics_writer.Progress(100, stream=stream)
    progress.update(10, {"loss": 3.25, "tokens_per_sec": 1234.0})
    line = stream.getvalue()
    assert line.endswith("\n") and "\r" not in line
    assert "step 10/100" in line and "loss 3.250" in line and "1,234 tok/s" in line and "ETA" in line


def test_bar_redraws_in_place_on_a_terminal():
    stream = FakeTerminal()
    progress = metrics_writer.Progress(100, stream=stream, width=10)
    progress.update(50, {"loss": 2.0, "tokens_per_sec": 10.0})
    progress.update(100, {"loss": 1.0, "tokens_per_sec": 10.0})
    out = stream.getvalue()
    assert out.count("\r") == 2 and "\n" not in out
    assert "[#####.....] step 50/100" in out and "[##########] step 100/100" in out


def test_eta_extrapolates_from_steps_after_the_first_update(monkeypatch):
    clock = iter([100.0, 110.0])
    monkeypatch.setattr(metrics_writer.time, "monotonic", lambda: next(clock))
    progress = metrics_writer.Progress(total_steps=30, stream=io.StringIO())
    assert math.isnan(progress.eta_seconds(10))  # the first call sets the baseline
    assert progress.eta_seconds(20) == 10.0  # 10 steps took 10 s, 10 remain


def test_jsonl_and_tensorboard_files(tmp_path):
    writer = metrics_writer.MetricsWriter(tmp_path)
    writer.write(5, {"loss": 1.5, "learning_rate": 0.01})
    writer.write(10, {"loss": 1.25, "learning_rate": 0.01, "eval_loss": 1.3})
    writer.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records == [{"step": 5, "loss": 1.5, "learning_rate": 0.01},
                       {"step": 10, "loss": 1.25, "learning_rate": 0.01, "eval_loss": 1.3}]
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_a_writer_opened_in_the_same_second_keeps_the_earlier_steps(tmp_path, monkeypatch):
    """tensorboardX names an event file by the second it opens in: a resume within that
    second would replace the earlier file (its steps gone) without a file of its own."""
    import time

    from tensorboard.backend.event_processing import event_accumulator
    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.0)  # every file in one second
    for step, loss in ((1, 2.5), (2, 2.0)):
        writer = metrics_writer.MetricsWriter(tmp_path)
        writer.write(step, {"loss": loss})
        writer.close()
    losses = {}
    for events in (tmp_path / "tensorboard").glob("events.out.tfevents.*"):
        acc = event_accumulator.EventAccumulator(str(events))
        acc.Reload()
        losses.update({e.step: e.value for e in acc.Scalars("loss")})
    assert losses == {1: 2.5, 2: 2.0}


def test_disabled_writer_writes_nothing(tmp_path):
    writer = metrics_writer.MetricsWriter(tmp_path / "other", enabled=False)
    writer.write(1, {"loss": 1.0})
    writer.close()
    assert not (tmp_path / "other").exists()


def test_progress_shows_accuracy_and_mfu_when_known():
    stream = io.StringIO()
    progress = metrics_writer.Progress(100, stream=stream)
    progress.update(10, {"loss": 3.25, "accuracy": 0.125, "tokens_per_sec": 1.0, "mfu": 0.4321})
    assert "acc 0.125" in stream.getvalue() and "MFU 43.2%" in stream.getvalue()


def test_the_tensorboard_line_train_prints_serves_its_events(tmp_path, monkeypatch):
    import shlex
    import subprocess

    from t5x_like import train
    writer = metrics_writer.MetricsWriter(tmp_path)
    writer.write(1, {"loss": 2.5})
    writer.close()
    line = train.tensorboard_command(tmp_path / "tensorboard")
    assert "-m tensorboard.main --logdir" in line
    # --inspect reads the events and lists their tags without starting a server.
    out = subprocess.run(shlex.split(line) + ["--inspect"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "scalars" in out.stdout and "   loss" in out.stdout
    # Without the tensorboard package the line starts with the install that brings it.
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert train.tensorboard_command(tmp_path).split(" && ")[0].endswith(
        'pip install -c constraints.txt -e ".[tensorboard]"')
