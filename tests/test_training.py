import json
import os
import pathlib
import shlex
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import tiny_config

from t5x_like import errors, train

REPO = pathlib.Path(__file__).resolve().parents[1]


def read_metrics(workdir) -> list[dict]:
    with open(pathlib.Path(workdir) / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def tiny_cli_command(workdir, *overrides: str) -> list[str]:
    """``python -m t5x_like.train`` on the quickstart config shrunk to a tiny model."""
    return [sys.executable, "-m", "t5x_like.train", "--config=configs/quickstart.py",
            f"--workdir={workdir}", "--config.model.d_model=32", "--config.model.d_ff=64",
            "--config.model.num_heads=2", "--config.model.head_dim=16",
            "--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
            "--config.batch_size=8", "--config.task_feature_lengths.inputs=32",
            "--config.task_feature_lengths.targets=8", "--config.eval_batches=1", *overrides]


# A bare environment (what resumes is the printed command, not this shell's settings),
# plus the run's shared compilation cache (tests/conftest.py): the rounds below compile
# the same tiny program again and again.
CLI_ENV = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu",
           **{k: v for k, v in os.environ.items() if k.startswith(("JAX_COMPILATION_CACHE",
                                                                   "JAX_PERSISTENT_CACHE"))}}


def losses_by_step(workdir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(workdir)}


def test_loss_falls_on_8_fake_devices(tmp_path):
    assert jax.device_count() == 8
    config = tiny_config(**{"mesh.data": 2, "mesh.fsdp": 4})
    result = train.run(config, str(tmp_path), quiet=True)
    records = read_metrics(tmp_path)
    assert records[0]["step"] == 1 and records[-1]["step"] == 30
    for key in ("loss", "learning_rate", "tokens_per_sec"):
        assert all(key in r for r in records)
    assert records[-1]["loss"] < records[0]["loss"] - 1.0
    assert "eval_loss" in records[-1] and np.isfinite(records[-1]["eval_loss"])
    assert result["eval"]["eval_loss"] == records[-1]["eval_loss"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["15", "30"]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert json.loads((tmp_path / "config.json").read_text())["mesh"]["fsdp"] == 4


@pytest.mark.slow
def test_resume_gives_the_same_losses_as_an_uninterrupted_run(tmp_path):
    # With a mixture of experts sharded over the expert axis: its routers' losses and
    # each expert's load resume bit for bit too.
    settings = {"num_train_steps": 8, "log_every_steps": 1, "checkpoint_every_steps": 4,
                "eval_every_steps": 0, "mesh.data": 2, "mesh.expert": 4,
                "model.num_experts": 4, "model.num_experts_per_token": 2,
                "model.router_z_loss_weight": 1e-3}
    train.run(tiny_config(**settings), str(tmp_path / "straight"), quiet=True)
    interrupted = tmp_path / "interrupted"
    train.run(tiny_config(**dict(settings, num_train_steps=4)), str(interrupted), quiet=True)
    result = train.run(tiny_config(**settings), str(interrupted), quiet=True)
    assert result["step"] == 8
    straight, resumed = losses_by_step(tmp_path / "straight"), losses_by_step(interrupted)
    assert sorted(resumed) == list(range(1, 9))
    assert [resumed[s] for s in range(1, 9)] == [straight[s] for s in range(1, 9)]  # bit for bit
    routed = {r["step"]: r["moe_expert_fraction_3"] for r in read_metrics(interrupted)}
    assert routed == {r["step"]: r["moe_expert_fraction_3"]
                      for r in read_metrics(tmp_path / "straight")}


@pytest.mark.slow
def test_single_device_and_sharded_runs_agree(tmp_path):
    settings = {"num_train_steps": 4, "log_every_steps": 1, "checkpoint_every_steps": 4,
                "eval_every_steps": 4}
    train.run(tiny_config(**settings, **{"mesh.data": 1}), str(tmp_path / "one"), quiet=True,
              devices=jax.devices()[:1])
    train.run(tiny_config(**settings, **{"mesh.data": 2, "mesh.fsdp": 4}), str(tmp_path / "eight"),
              quiet=True)
    one, eight = losses_by_step(tmp_path / "one"), losses_by_step(tmp_path / "eight")
    np.testing.assert_allclose([one[s] for s in range(1, 5)], [eight[s] for s in range(1, 5)],
                               rtol=2e-5)


def test_a_different_model_in_the_workdir_is_refused(tmp_path):
    settings = {"num_train_steps": 2, "checkpoint_every_steps": 2, "eval_every_steps": 2}
    train.run(tiny_config(**settings), str(tmp_path), quiet=True)
    with pytest.raises(errors.ConfigError, match="model.d_ff"):
        train.run(tiny_config(**dict(settings, num_train_steps=4), **{"model.d_ff": 128}),
                  str(tmp_path), quiet=True)
    # The input-stream count is part of the data order: a different one is refused too.
    saved = json.loads((tmp_path / "config.json").read_text())["data"]["streams"]
    assert saved == 8  # the default for a batch of 16, resolved and saved
    with pytest.raises(errors.ConfigError, match="saved with 8 input streams.*"
                                                     "--config.data.streams=8"):
        train.run(tiny_config(**dict(settings, num_train_steps=4), data_streams=2),
                  str(tmp_path), quiet=True)


@pytest.mark.slow
def test_cli_resumes_from_the_latest_checkpoint(tmp_path):
    common = tiny_cli_command(tmp_path, "--config.checkpoint_every_steps=10")
    first = subprocess.run(common + ["--config.num_train_steps=20"], cwd=REPO, env=CLI_ENV,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "checkpoint" in first.stdout and "continue training" in first.stdout
    # The printed command, overrides included, is what resumes (with 30 steps, not 40).
    line = first.stdout.split("continue training (resumes from the checkpoint):")[1]
    printed = shlex.split(line.strip().splitlines()[0])
    assert printed[1:3] == ["-m", "t5x_like.train"] and printed[-1].endswith("steps=40")
    # The interpreter that ran, as typed from the folder the run started in.
    assert (REPO / printed[0]).absolute() == pathlib.Path(sys.executable).absolute()
    resume = printed[:-1] + ["--config.num_train_steps=30"]
    assert all(arg in resume for arg in common[3:])
    second = subprocess.run(resume, cwd=REPO, env=CLI_ENV, capture_output=True, text=True,
                            timeout=300)
    assert second.returncode == 0, second.stderr
    assert "Resumed from" in second.stderr and "at step 20" in second.stderr
    steps = [r["step"] for r in read_metrics(tmp_path)]
    assert steps[-1] == 30 and 21 in steps
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir())[-1] == 30


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_0(tmp_path):
    import signal
    import time

    command = tiny_cli_command(tmp_path, "--config.num_train_steps=100000",
                               "--config.checkpoint_every_steps=100000",
                               "--config.log_every_steps=1")
    process = subprocess.Popen(command, cwd=REPO, env=CLI_ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        metrics = tmp_path / "metrics.jsonl"
        while time.monotonic() < deadline and not (metrics.exists() and
                                                   len(metrics.read_text().splitlines()) >= 3):
            time.sleep(0.2)
        assert metrics.exists(), "training never logged a step"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert "SIGTERM received" in stderr
    last_logged = read_metrics(tmp_path)[-1]["step"]
    saved = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert saved and saved[-1] == last_logged >= 3


def test_model_vocabulary_smaller_than_the_task_is_refused_before_compiling(tmp_path):
    with pytest.raises(errors.ConfigError, match="--config.model.vocab_size=8192 or larger"):
        train.run(tiny_config(**{"model.vocab_size": 1000}), str(tmp_path), quiet=True)
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_kill_9_at_random_moments_always_resumes_from_the_newest_complete_checkpoint(tmp_path):
    """SIGKILL gives no chance to save: the restart must find the newest checkpoint
    that finished writing (orbax renames a finished save into place) and load it."""
    import random
    import re
    import time

    rng = random.Random(5)
    command = tiny_cli_command(tmp_path, "--config.checkpoint_every_steps=2",
                               "--config.log_every_steps=1", "--config.eval_every_steps=1000")
    checkpoints = tmp_path / "checkpoints"

    def complete_steps() -> list[int]:
        if not checkpoints.exists():
            return []
        return sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())

    for round_index in range(3):
        log = tmp_path / f"round{round_index}.log"
        with open(log, "w") as stderr:
            process = subprocess.Popen(command + ["--config.num_train_steps=100000"], cwd=REPO,
                                       env=CLI_ENV, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            before = complete_steps()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and complete_steps() == before:
                time.sleep(0.05)
            assert complete_steps() != before, log.read_text()
            time.sleep(rng.uniform(0.0, 1.5))  # a random moment: mid-step, mid-save, mid-log
        finally:
            process.kill()
            process.wait(timeout=60)
        newest = complete_steps()[-1]
        if round_index > 0:
            assert re.search(r"Resumed from .* at step (\d+)", log.read_text())
        final = subprocess.run(command + [f"--config.num_train_steps={newest + 1}"], cwd=REPO,
                               env=CLI_ENV, capture_output=True, text=True, timeout=300)
        assert final.returncode == 0, final.stderr
        assert f"at step {newest}." in final.stderr
        assert complete_steps()[-1] == newest + 1
