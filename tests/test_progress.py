"""``t5x_like.system.progress``: done of total, a rate that leaves out the first step's compile,
an ETA; redrawn in place on a terminal, one line per interval elsewhere. And the long
commands show it: ``eval``, ``convert import``, ``cache_tasks``, the harness model."""

import io
import json
import time

import numpy as np
import pytest

from t5x_like.system import progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


class Clock:
    """A clock the test sets: ``clock.now = 10``."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_off_a_terminal_one_line_per_interval_with_rate_and_eta():
    stream, clock = io.StringIO(), Clock()
    meter = progress.Meter("task scoring", 100, "rows", stream=stream, interval_s=30,
                           clock=clock)
    # advances at 10 s (the first: compile included), 20, 40, 70; closed at 80
    for clock.now, n in ((10, 10), (20, 10), (40, 20), (70, 30)):
        meter.advance(n)
    clock.now = 80
    meter.close()
    lines = stream.getvalue().splitlines()
    # 40 and 70 are 30 s after the last line; the rate counts from the first advance:
    # (40 - 10) rows in 30 s = 1/s at 40 s, 60 rows left -> ETA 01:00.
    assert lines == ["task scoring: 40/100 rows (40%), 1 rows/s, ETA 01:00",
                     "task scoring: 70/100 rows (70%), 1 rows/s, ETA 00:30",
                     "task scoring: 70 rows in 01:20 (0.88 rows/s)"]
    assert "\r" not in stream.getvalue()


def test_short_work_off_a_terminal_prints_nothing():
    stream, clock = io.StringIO(), Clock()
    with progress.Meter("quick", 4, stream=stream, interval_s=30, clock=clock) as meter:
        for clock.now in (1, 2):
            meter.advance(2)
        clock.now = 3
    assert stream.getvalue() == ""


def test_on_a_terminal_the_line_is_redrawn_in_place_and_ended():
    stream, clock = Terminal(), Clock()
    meter = progress.Meter("reading", 4e9, "B", stream=stream, from_first_advance=False,
                           clock=clock)
    for clock.now in (1, 2):
        meter.advance(1e9)
    clock.now = 3
    meter.close()
    text = stream.getvalue()
    assert text.startswith("\rreading: 1.0G/4.0G B (25%), 1.0G B/s, ETA 00:03\x1b[K")
    assert "\rreading: 2.0G/4.0G B (50%), 1.0G B/s, ETA 00:02\x1b[K" in text
    assert text.endswith("\rreading: 2.0G B in 00:03 (666.7M B/s)\x1b[K\n")


def test_the_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("T5XL_PROGRESS_INTERVAL_S", "0")
    assert progress.Meter("x", 1, stream=io.StringIO()).interval_s == 0.0


def test_amounts_and_durations_read_at_a_glance():
    assert [progress.amount(v) for v in (7, 0.5, 12_300, 4.5e6, 1.25e12)] == [
        "7", "0.50", "12.3k", "4.5M", "1.2T"]
    assert [progress.duration(s) for s in (59, 61, 3723, float("nan"))] == [
        "00:59", "01:01", "1:02:03", "--:--"]


def test_convert_shows_the_bytes_written_and_read_shard_by_shard(tmp_path, monkeypatch, capsys):
    """Export writes shards as save_pretrained does past its shard size (here 100 bytes),
    import reads them back through the index; each shows its bytes as it goes."""
    from safetensors.numpy import load_file

    from t5x_like.checkpoints import hf_io
    monkeypatch.setenv("T5XL_PROGRESS_INTERVAL_S", "0")
    weights = {"a": np.ones((4, 4), np.float32), "b": np.arange(8, dtype=np.float32),
               "c": np.full((10,), 2, np.float32)}
    hf_io.write_folder(tmp_path / "hf", {"model_type": "x"}, weights, max_shard_bytes=100)
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert index == {"metadata": {"total_size": 136},  # 64 + 32 + 40 bytes
                     "weight_map": {"a": "model-00001-of-00002.safetensors",
                                    "b": "model-00001-of-00002.safetensors",
                                    "c": "model-00002-of-00002.safetensors"}}
    assert sorted(load_file(str(tmp_path / "hf" / "model-00002-of-00002.safetensors"))) == ["c"]
    read = hf_io.read_weights(tmp_path / "hf")
    assert all(np.array_equal(read[k], weights[k]) for k in weights) and len(read) == 3
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == [line for line in err if line.startswith("writing hf: ")][:2]
    assert err[0].startswith("writing hf: 96/136 B (71%), ")
    assert err[1].startswith("writing hf: 136/136 B (100%), ")
    sizes = [(tmp_path / "hf" / f"model-0000{i}-of-00002.safetensors").stat().st_size
             for i in (1, 2)]
    assert any(line.startswith(f"reading hf: {sizes[0]}/{sum(sizes)} B (") for line in err)
    assert err[-1].startswith(f"reading hf: {sum(sizes)} B in 00:00")


@pytest.mark.parametrize("on_terminal", [False, True])
def test_cache_tasks_counts_the_shards_as_they_appear(tmp_path, on_terminal, monkeypatch):
    from t5x_like import cache_tasks

    class Unit:
        def __init__(self, task, name):
            self.task, self.shard_name = task, name
    stream = Terminal() if on_terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    monkeypatch.setenv("T5XL_PROGRESS_INTERVAL_S", "0")
    units = [Unit("t", f"train-{i}.array_record") for i in range(3)]
    with cache_tasks.ShardsWritten(str(tmp_path), units, interval_s=0.01) as watch:
        (tmp_path / "t").mkdir()
        for unit in units[:2]:
            (tmp_path / "t" / unit.shard_name).write_text("x")
        (tmp_path / "t" / "train-2.array_record.tmp-1").write_text("partial")
        deadline = time.monotonic() + 10  # a broken watcher fails here, not hangs
        while watch.written() < 2:
            assert time.monotonic() < deadline, f"the watcher counted {watch.written()} of 2"
            time.sleep(0.005)
    text = stream.getvalue()
    if on_terminal:  # redrawn at most every 0.2 s, then ended with the count
        assert "\rcache_tasks: 2 shards in 00:00" in text and text.endswith("\n")
    else:  # every interval (0 here): one line per count seen
        assert "cache_tasks: 2/3 shards (67%)" in text and "\r" not in text
