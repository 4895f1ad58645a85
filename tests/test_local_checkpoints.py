"""Local-first checkpoints (checkpoint.local_dir) with the workdir in a bucket (GCS
emulator): a run that died after its local saves and before their upload resumes from
the local copy (and uploads it); a fresh local dir resumes from the bucket; a corrupted
local copy falls back to the bucket's copy of the same step."""

import pathlib
import re

import pytest
from conftest import tiny_config
from storage_emulators import gcs_fixture  # noqa: F401  (the module's `gcs` fixture)

from t5x_like import train
from t5x_like.checkpoints import checkpoint_store
from t5x_like.errors import ConfigError
from t5x_like.system import storage
from t5x_like.telemetry import goodput_events


def run(workdir, local_dir, steps: int) -> int:
    config = tiny_config(num_train_steps=steps, eval_every_steps=0, checkpoint_every_steps=2,
                         log_every_steps=2)
    config.checkpoint.local_dir = str(local_dir)
    return train.run(config, workdir)["step"]


def resumed_from(err: str, workdir) -> tuple[str, int]:
    """The folder and step the run just finished resumed from: its printed "Resumed from
    FOLDER at step N." line, which must agree with its goodput ``setup`` event."""
    [(folder, step)] = re.findall(r"^Resumed from (\S+) at step (\d+)\.$", err, re.M)
    setups = [e for e in goodput_events.read_events(workdir) if e["kind"] == "setup"]
    assert setups[-1]["resumed_from"] == int(step), setups
    return folder, int(step)


def durable_steps(workdir) -> list[int]:
    return checkpoint_store.Checkpointer.durable_steps(
        type("C", (), {"directory": storage.path(workdir) / "checkpoints"})())


def local_steps(local_dir, workdir) -> list[int]:
    folder = checkpoint_store.local_tier(local_dir, storage.path(workdir) / "checkpoints")
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


@pytest.mark.slow
def test_local_tier_resumes_from_local_then_bucket_and_survives_a_corrupt_local_copy(
        gcs, tmp_path, capsys, monkeypatch):
    workdir = "gs://t5xl-test/local_tier/run"
    first, fresh = tmp_path / "local_a", tmp_path / "local_b"

    # Killed after the local saves, before any upload: the uploads never run.
    with monkeypatch.context() as patch:
        patch.setattr(checkpoint_store._Uploader, "upload", lambda self, step: None)
        assert run(workdir, first, 4) == 4
    assert local_steps(first, workdir) == [2, 4] and durable_steps(workdir) == []
    assert "Resumed from" not in capsys.readouterr().err
    assert [e["resumed_from"] for e in goodput_events.read_events(workdir)
            if e["kind"] == "setup"] == [0]  # a new run

    # Resumes from the local copy of step 4, and uploads what the bucket lacked.
    assert run(workdir, first, 6) == 6
    err = capsys.readouterr().err
    assert "Copied checkpoint" not in err
    folder, step = resumed_from(err, workdir)
    assert step == 4 and folder.startswith(str(first)), folder  # the local copy, not the bucket
    assert durable_steps(workdir) == [2, 4, 6]
    bucket_step = storage.path(workdir) / "checkpoints" / "6"
    assert (bucket_step / checkpoint_store.COMMIT_SUCCESS).exists()
    assert checkpoint_store.manifest_problem(bucket_step) is None

    # A host with an empty local dir restores from the bucket.
    assert run(workdir, fresh, 8) == 8
    err = capsys.readouterr().err
    assert f"Copied checkpoint {workdir}/checkpoints/6 to the local tier" in err
    assert resumed_from(err, workdir)[1] == 6
    assert 8 in durable_steps(workdir)

    # A corrupted local copy of the newest step: the bucket's copy of the same step.
    local8 = checkpoint_store.local_tier(fresh, storage.path(workdir) / "checkpoints") / "8"
    victim = max((p for p in pathlib.Path(local8).rglob("*") if p.is_file() and "/d/" in str(p)),
                 key=lambda p: p.stat().st_size)
    victim.write_bytes(b"\x00" * 7)
    assert run(workdir, fresh, 10) == 10
    err = capsys.readouterr().err
    assert "local copy damaged" in err and "restoring step 8 from" in err
    assert f"Copied checkpoint {workdir}/checkpoints/8 to the local tier" in err
    assert resumed_from(err, workdir)[1] == 8
    assert 10 in durable_steps(workdir)


def test_local_dir_must_be_local():
    with pytest.raises(ConfigError, match="must be a local folder"):
        config = tiny_config()
        config.checkpoint.local_dir = "gs://b/x"
        from t5x_like import config_lib
        config_lib.validate(config)
