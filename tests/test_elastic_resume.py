"""Resuming on another mesh, as docs/parallelism.md promises: a run saved by 2 processes
of 4 devices resumes on 1 process of 4 devices and on 1 process of 8 devices with
another axis split, and every later batch is the uninterrupted run's, row for row
(``logging.batch_checksum``); the losses agree to float rounding."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from t5x_like import trainer as trainer_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
SETTINGS = ["--config=configs/quickstart.py", "--config.model.d_model=32",
            "--config.model.d_ff=64", "--config.model.num_heads=2", "--config.model.head_dim=16",
            "--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
            "--config.batch_size=16", "--config.task_feature_lengths.inputs=32",
            "--config.task_feature_lengths.targets=8", "--config.logging.every_steps=1",
            "--config.checkpoint.every_steps=3", "--config.evals.held_out.every_steps=0",
            "--config.logging.batch_checksum=true"]
TWO_BY_FOUR = ["--config.mesh.data=2", "--config.mesh.fsdp=4"]
# Measured on this machine: the resumed runs' losses differ from the uninterrupted
# run's by at most 1.0e-7 relative, their gradient norms by 1.1e-7 (other shardings sum
# in another order); the bound leaves room for other CPUs' kernels.
LOSS_RTOL = 1e-5


def _env(devices: int) -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO),
                XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")


def _two_processes(workdir, steps):
    done = subprocess.run(
        [sys.executable, "-m", "t5x_like.launch_local", "--num_processes=2",
         "--devices_per_process=4", "--timeout_s=240", "--", *SETTINGS, *TWO_BY_FOUR,
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


def _records(workdir) -> dict[int, dict]:
    lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines)}


@pytest.mark.slow
def test_a_two_process_run_resumes_on_other_meshes_with_the_same_batches(tmp_path):
    _two_processes(tmp_path / "straight", 6)
    _two_processes(tmp_path / "saved", 3)
    meshes = {
        "one_process_4_devices": (4, ["--config.mesh.data=2", "--config.mesh.fsdp=2"]),
        "one_process_8_devices_tensor": (8, ["--config.mesh.data=1", "--config.mesh.fsdp=4",
                                             "--config.mesh.tensor=2",
                                             "--config.partitioning.rules=fsdp_tensor"]),
    }
    straight = _records(tmp_path / "straight")
    for name, (devices, mesh) in meshes.items():
        shutil.copytree(tmp_path / "saved", tmp_path / name)
        _one_process(tmp_path / name, devices, mesh)
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
