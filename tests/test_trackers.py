"""``config.trackers``: TensorBoard, W&B (offline) and MLflow (a local store) receive the
same scalars at the same steps and the resolved config as the run's parameters; a
resumed run continues the same tracker runs; a missing library is refused first. Nothing
here reaches a network: W&B writes its offline run files, which the test reads back."""

import json
import struct

import pytest

from t5x_like import config_lib, errors
from t5x_like.config.run import TrackingSpec
from t5x_like.telemetry import metrics_writer, trackers


def wandb_records(workdir):
    """Every record of the W&B offline runs under ``workdir`` (LevelDB-log files of
    protobuf records: 7-byte header, 32 KiB blocks of checksum, length, type, payload)."""
    from wandb.proto import wandb_internal_pb2 as pb
    out = []
    for path in sorted((workdir / "wandb").glob("offline-run-*/run-*.wandb")):
        data, pending = path.read_bytes(), b""
        assert data[:4] == b":W&B"
        pos, block = 7, 32768
        while pos + 7 <= len(data):
            left = block - pos % block
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
            if left < 7 or (kind == 0 and length == 0):
                pos += left
                continue
            payload, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
            pending = payload if kind in (1, 2) else pending + payload
            if kind in (1, 4):
                record = pb.Record()
                record.ParseFromString(pending)
                out.append(record)
    return out


def wandb_history(workdir) -> dict[int, dict]:
    rows = {}
    for record in wandb_records(workdir):
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in record.history.item}
            rows[items["_step"]] = {k: v for k, v in items.items() if not k.startswith("_")}
    return rows


def wandb_runs(workdir) -> list:
    return [r.run for r in wandb_records(workdir) if r.WhichOneof("record_type") == "run"]


def wandb_config(workdir) -> dict:
    """The run's config as its updates left it."""
    config = {}
    for record in wandb_records(workdir):
        if record.WhichOneof("record_type") == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
    return config


def mlflow_metrics(uri, run_id) -> dict[int, dict]:
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=uri)
    rows = {}
    for key in client.get_run(run_id).data.metrics:
        for m in client.get_metric_history(run_id, key):
            rows.setdefault(m.step, {})[key] = m.value
    return rows


def tensorboard_scalars(workdir) -> dict[int, dict]:
    from tensorboard.backend.event_processing import event_accumulator
    rows = {}
    for events in sorted((workdir / "tensorboard").glob("events.out.tfevents.*")):
        acc = event_accumulator.EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            for e in acc.Scalars(tag):
                rows.setdefault(e.step, {})[tag] = e.value
    return rows


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's file store, as asked
    return TrackingSpec(project="tests", name="tiny", wandb_mode="offline",
                        mlflow_uri=(tmp_path / "mlruns").as_uri())


def test_each_tracker_gets_the_same_scalars_and_the_config_and_a_resume_continues(tmp_path,
                                                                                   tracking):
    workdir, names = tmp_path / "run", ("tensorboard", "wandb", "mlflow")
    config = {"optimizer": {"learning_rate": 0.01, "name": "adamw"}, "task": "t",
              "trackers": ["tensorboard", "wandb", "mlflow"]}
    first = {1: {"loss": 2.5, "eval/acc": 0.25}, 2: {"loss": 2.0}}
    writer = metrics_writer.MetricsWriter(workdir, tracker_names=names, tracking=tracking,
                                          run_config=config)
    for step, scalars in first.items():
        writer.write(step, scalars)
    writer.close()
    ids = json.loads((workdir / "trackers.json").read_text())
    wandb_id = trackers.saved_run_id(workdir, "wandb", tracking)
    mlflow_id = trackers.saved_run_id(workdir, "mlflow", tracking)
    assert wandb_id and mlflow_id and len(ids) == 2

    # A resume in the same workdir logs on into the same runs.
    resumed = metrics_writer.MetricsWriter(workdir, tracker_names=names, tracking=tracking,
                                           run_config=dict(config, task="t2"))
    resumed.write(3, {"loss": 1.5})
    resumed.close()
    assert json.loads((workdir / "trackers.json").read_text()) == ids
    expected = {**first, 3: {"loss": 1.5}}
    assert wandb_history(workdir) == expected
    assert mlflow_metrics(tracking.mlflow_uri, mlflow_id) == expected
    assert tensorboard_scalars(workdir) == expected
    assert {(r.run_id, r.project, r.display_name) for r in wandb_runs(workdir)} == {
        (wandb_id, "tests", "tiny")}
    from mlflow.tracking import MlflowClient
    run = MlflowClient(tracking_uri=tracking.mlflow_uri).get_run(mlflow_id)
    assert run.data.params == {"optimizer.learning_rate": "0.01", "optimizer.name": "adamw",
                               "task": "t", "trackers": '["tensorboard", "wandb", "mlflow"]'}
    assert run.info.status == "FINISHED" and run.info.run_name == "tiny"
    assert wandb_config(workdir) == dict(config, task="t2")  # the resumed run's config


def test_a_missing_tracker_library_is_refused_naming_the_extra(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    offline = TrackingSpec(wandb_mode="offline")
    with pytest.raises(errors.UserError, match=r"trackers names 'wandb', which needs wandb; "
                                               r"install it \(pip install .*wandb"):
        trackers.check_ready(("tensorboard", "wandb"), offline)
    trackers.check_ready(("tensorboard", "mlflow"), offline)


def test_wandb_online_without_a_key_is_refused_before_anything_runs(tmp_path, monkeypatch):
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # none there
    with pytest.raises(errors.UserError, match=r"no W&B API key is set; run `wandb login` or "
                                               r"set WANDB_API_KEY, or log offline"):
        trackers.check_ready(("wandb",), TrackingSpec())
    trackers.check_ready(("wandb",), TrackingSpec(wandb_mode="offline"))
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password k3y\n")
    (tmp_path / "netrc").chmod(0o600)
    trackers.check_ready(("wandb",), TrackingSpec())  # what `wandb login` writes
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    monkeypatch.setenv("WANDB_API_KEY", "k3y")
    trackers.check_ready(("wandb",), TrackingSpec())


def test_an_unknown_tracker_is_a_config_error():
    config = config_lib.default_config()
    config.trackers = ("tensorboard", "comet")
    with pytest.raises(errors.ConfigError, match=r"trackers names \['comet'\]; choose any of"):
        config_lib.validate(config)


def test_train_logs_to_every_tracker_and_a_resumed_run_continues_them(tmp_path, tracking, tiny):
    from t5x_like import train
    tracking = TrackingSpec(project="tests", wandb_mode="offline",
                            mlflow_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")  # MLflow's default kind
    config = tiny(**{"num_train_steps": 4, "logging.every_steps": 2,
                     "evals.held_out.every_steps": 4, "checkpoint.every_steps": 4,
                     "trackers": ("wandb", "mlflow"), "tracking.project": tracking.project,
                     "tracking.wandb_mode": "offline", "tracking.mlflow_uri": tracking.mlflow_uri})
    workdir = tmp_path / "run"
    train.run(config, str(workdir), quiet=True)
    config.num_train_steps = 6
    train.run(config, str(workdir), quiet=True)
    logged = {}
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        logged.setdefault(row.pop("step"), {}).update(row)
    steps = sorted(logged)  # the first step of each run, every 2nd, the last
    assert steps[-1] == 6 and any(s < 4 for s in steps) and "eval_loss" in logged[4]
    mlflow_id = trackers.saved_run_id(workdir, "mlflow", tracking)
    assert mlflow_metrics(tracking.mlflow_uri, mlflow_id) == logged
    history = wandb_history(workdir)
    assert sorted(history) == steps
    assert history == logged
    assert len({r.run_id for r in wandb_runs(workdir)}) == 1  # two offline files, one run
    assert not (workdir / "tensorboard").exists()  # not asked for
    from mlflow.tracking import MlflowClient
    params = MlflowClient(tracking_uri=tracking.mlflow_uri).get_run(mlflow_id).data.params
    assert params["optimizer.learning_rate"] == "0.03" and params["num_train_steps"] == "4"


def test_tensorboard_events_are_written_without_importing_torch(tmp_path):
    """tensorboardX imports torch when it is installed (1.9 s of a command's start on 2
    cores, for tensors nothing passes); storage.summary_writer skips that import and the
    scalars are written all the same. In a fresh process: this one may hold both."""
    import subprocess
    import sys
    code = ("import sys\nfrom t5x_like.system import storage\n"
            f"w = storage.summary_writer({str(tmp_path)!r})\n"
            "w.add_scalar('loss', 1.5, global_step=3)\nw.close()\n"
            "print('torch' in sys.modules)\nimport torch\nprint(torch.ones(1).item())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "1.0"]  # skipped, and importable afterwards
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    [scalar] = events.Scalars("loss")
    assert (scalar.step, scalar.value) == (3, 1.5)
