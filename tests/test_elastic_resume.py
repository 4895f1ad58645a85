"""Resuming on another mesh, as docs/parallelism.md promises: a run saved by 2 processes
of 4 devices, each a slice of its own (``mesh.dcn=2``), resumes on 1 process of 4
devices and on 1 process of 8 devices with another axis split, and every later batch is
the uninterrupted run's, row for row (``logging.batch_checksum``); the losses agree to
float rounding. Both new meshes would put twice the rows on each device: the run says
so and trains in 2 microbatches of the rows each device held, the same global batch."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from t5x_like.engine import trainer as trainer_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
SETTINGS = ["--config=configs/quickstart.py", "--config.model.d_model=32",
            "--config.model.d_ff=64", "--config.model.num_heads=2", "--config.model.head_dim=16",
            "--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
            "--config.batch_size=16", "--config.task_feature_lengths.inputs=32",
            "--config.task_feature_lengths.targets=8", "--config.logging.every_steps=1",
            "--config.checkpoint.every_steps=3", "--config.evals.held_out.every_steps=0",
            "--config.logging.batch_checksum=true"]
TWO_SLICES = ["--config.mesh.dcn=2", "--config.mesh.data=1", "--config.mesh.fsdp=4"]
# Measured on this machine: the resumed runs' losses differ from the uninterrupted
# run's by at most 9.9e-8 relative, their gradient norms by 1.1e-7 (other shardings and
# the microbatches sum in another order); the bound leaves room for other CPUs' kernels.
LOSS_RTOL = 1e-5


def _env(devices: int) -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO),
                XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")


def _two_processes(workdir, steps):
    done = subprocess.run(
        [sys.executable, "-m", "t5x_like.launch_local", "--num_processes=2",
         "--devices_per_process=4", "--timeout_s=240", "--", *SETTINGS, *TWO_SLICES,
         f"--workdir={workdir}", f"--config.num_train_steps={steps}"],
        cwd=REPO, env=_env(4), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _one_process(workdir, devices, mesh, steps=6):
    done = subprocess.run(
        [sys.executable, "-m", "t5x_like.train", *SETTINGS, *mesh, f"--workdir={workdir}",
         f"--config.num_train_steps={steps}"],
        cwd=REPO, env=_env(devices), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Resumed from" in done.stderr, done.stderr[-2000:]
    return done.stderr


def _saved_at_step_3(straight, saved):
    """The uninterrupted run as it stood at its step-3 checkpoint: its folder without the
    later checkpoint and metrics (one 2-process run fewer than training a second run to 3)."""
    shutil.copytree(straight, saved)
    shutil.rmtree(saved / "checkpoints" / "6")
    assert sorted(p.name for p in (saved / "checkpoints").iterdir() if p.name.isdigit()) == ["3"]
    lines = (saved / "metrics.jsonl").read_text().splitlines(keepends=True)
    (saved / "metrics.jsonl").write_text("".join(line for line in lines
                                                 if json.loads(line)["step"] <= 3))


def _records(workdir) -> dict[int, dict]:
    lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines)}


@pytest.mark.slow
def test_a_two_process_run_resumes_on_other_meshes_with_the_same_batches(tmp_path):
    _two_processes(tmp_path / "straight", 6)
    _saved_at_step_3(tmp_path / "straight", tmp_path / "saved")
    meshes = {
        "one_process_4_devices": (4, ["--config.mesh.data=2", "--config.mesh.fsdp=2"]),
        "one_process_8_devices_tensor": (8, ["--config.mesh.data=1", "--config.mesh.fsdp=4",
                                             "--config.mesh.tensor=2",
                                             "--config.partitioning.rules=fsdp_tensor"]),
    }
    straight = _records(tmp_path / "straight")
    for name, (devices, mesh) in meshes.items():
        shutil.copytree(tmp_path / "saved", tmp_path / name)
        said = _one_process(tmp_path / name, devices, mesh)
        assert ("into 4 shards of 4 rows; the checkpoint's mesh held 2 rows a device at a "
                "time: training in optimizer.microbatches=2 of 2 rows, the same global batch"
                ) in " ".join(said.split()), said[-2000:]
        resumed = _records(tmp_path / name)
        assert sorted(resumed) == list(range(1, 7)), name
        for step in range(4, 7):
            assert resumed[step]["batch_checksum"] == straight[step]["batch_checksum"], (name,
                                                                                        step)
            np.testing.assert_allclose(resumed[step]["loss"], straight[step]["loss"],
                                       rtol=LOSS_RTOL, err_msg=f"{name} step {step}")
    # The checksums follow the data: every step's batch is another.
    assert len({straight[s]["batch_checksum"] for s in range(1, 7)}) == 6


def test_the_batch_checksum_sees_every_value_and_its_place():
    rng = np.random.default_rng(0)
    batch = {"decoder_input_tokens": rng.integers(0, 8192, (8, 16)).astype(np.int32),
             "decoder_loss_weights": np.ones((8, 16), np.float32)}
    reference = int(trainer_lib.batch_checksum(batch))
    changed = {**batch, "decoder_input_tokens": batch["decoder_input_tokens"].copy()}
    changed["decoder_input_tokens"][5, 9] += 1
    swapped = {**batch, "decoder_input_tokens": batch["decoder_input_tokens"][[1, 0, *range(2, 8)]]}
    shifted = {**batch, "decoder_input_tokens": np.roll(batch["decoder_input_tokens"], 1, axis=1)}
    floats = {**batch, "decoder_loss_weights": np.zeros((8, 16), np.float32)}
    assert int(trainer_lib.batch_checksum(changed)) != reference
    assert int(trainer_lib.batch_checksum(swapped)) != reference
    assert int(trainer_lib.batch_checksum(shifted)) != reference
    assert int(trainer_lib.batch_checksum(floats)) == reference  # only integer features
    # The same rows split over 8 devices sum to the same number.
    mesh = jax.make_mesh((8,), ("data",))
    split = jax.device_put(batch["decoder_input_tokens"],
                           jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
    assert int(jax.jit(trainer_lib.batch_checksum)({"decoder_input_tokens": split})) == reference
    assert 0 <= reference < trainer_lib.CHECKSUM_MODULUS


def _saved_on_8_devices(workdir, **overrides):
    """A workdir whose newest step's config item is what a run on 8 devices saves (no
    arrays: resolving reads only the config)."""
    from conftest import set_keys

    from t5x_like import config_lib
    from t5x_like.training import preflight
    config = set_keys(config_lib.load_config_file("configs/pretrain/gpt2_tiny.py"),
                      {"batch_size": 16, **overrides})
    resolved = preflight.resolve_training(config, str(workdir))
    step = pathlib.Path(workdir) / "checkpoints" / "3" / "config"
    step.mkdir(parents=True)
    (step / "metadata").write_text(json.dumps(resolved.run_config))
    return config


@pytest.mark.parametrize("devices,mesh,chosen,expected", [
    (4, {"data": 4}, None, 2),          # 4 rows a device where 2 were held: 2 microbatches
    (2, {"data": 2}, None, 4),
    (8, {"data": 8}, None, 1),          # the same mesh: unchanged, nothing said
    (4, {"data": 4}, 4, 4),             # the user's microbatches stand
    (4, {"data": 2, "tensor": 2}, None, 4),
])
def test_a_resume_keeps_the_rows_each_device_held(tmp_path, devices, mesh, chosen, expected):
    from conftest import set_keys

    from t5x_like.training import preflight
    config = _saved_on_8_devices(tmp_path, **{"mesh.data": 8})
    set_keys(config, {f"mesh.{axis}": size for axis, size in mesh.items()})
    if chosen:
        set_keys(config, {"optimizer.microbatches": chosen})
    resolved = preflight.resolve_training(config, str(tmp_path), jax.devices()[:devices])
    assert resolved.spec.optimizer.microbatches == expected
    assert resolved.spec.batch_size == 16
    assert resolved.trainer.microbatches == expected
    said = " ".join(resolved.notices)
    assert ("optimizer.microbatches=" in said) == (chosen is None and expected > 1), said
    # The rows each device holds in a microbatch: 16 rows over the data-parallel devices,
    # cut into the microbatches (2 where 8 devices held them; 1 where the user asked for 4).
    data_parallel = mesh.get("data", 1)
    assert resolved.run_config["rows_per_device"] == 16 // data_parallel // expected
    assert resolved.run_config["microbatches_asked"] == (chosen or 1)


def test_microbatches_grown_once_keep_growing_on_the_next_resume(tmp_path):
    """A run resumed on 4 devices trains in 2 microbatches; its checkpoint says the config
    asked for 1, so resuming it again (still asking for 1) keeps the 2 rows a device."""
    from conftest import set_keys

    from t5x_like.training import preflight
    config = _saved_on_8_devices(tmp_path, **{"mesh.data": 8})
    set_keys(config, {"mesh.data": 4})
    resumed = preflight.resolve_training(config, str(tmp_path), jax.devices()[:4])
    step = tmp_path / "checkpoints" / "6" / "config"
    step.mkdir(parents=True)
    (step / "metadata").write_text(json.dumps(resumed.run_config))
    again = preflight.resolve_training(config, str(tmp_path), jax.devices()[:4])
    assert again.spec.optimizer.microbatches == 2 and again.notices
