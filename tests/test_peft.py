"""Parameter-efficient tuning: frozen parameters stay bit-for-bit, and carry no
optimizer state (BitFit so far)."""

import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like import config_lib, partitioning, trainer as trainer_lib

from conftest import tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]


def tiny_decoder(bitfit: bool, optimizer: str = "adamw"):
    config = config_lib.default_config()
    config.task = "embedded_en_lm"
    config.task_feature_lengths = {"targets": 16}
    config.batch_size = 8
    config.model = config_lib.model_defaults("decoder")
    config.model.update(dict(vocab_size=8192, d_model=32, num_heads=2, head_dim=16, d_ff=64,
                             num_layers=2, max_length=32))
    config.optimizer.name = optimizer
    config.optimizer.learning_rate = 1e-2
    config.optimizer.warmup_steps = 0
    config.peft.bitfit = bitfit
    config_lib.validate(config)
    return config


def random_batch(trainer, config, seed=0):
    structure_batch = trainer_lib.abstract_batch(config.model.family,
                                                 config.task_feature_lengths, config.batch_size)
    rng = np.random.default_rng(seed)
    batch = {}
    for name, spec in structure_batch.items():
        if spec.dtype == jnp.float32:
            batch[name] = np.ones(spec.shape, np.float32)
        else:
            batch[name] = rng.integers(4, 8192, size=spec.shape).astype(np.int32)
    return jax.device_put(batch, trainer.batch_sharding)


def is_bias(path) -> bool:
    return str(getattr(path[-1], "key", path[-1])) == "bias"


def train_three_steps(config, devices):
    mesh = partitioning.make_mesh(config_lib.resolve_mesh_shape(dict(config.mesh), len(devices)),
                                  devices)
    trainer = trainer_lib.build_trainer(config, mesh)
    state = trainer.init_state(config.seed)
    before = jax.device_get(state.params)
    for step in range(3):
        state, metrics = trainer.train_step(state, random_batch(trainer, config, step))
    return trainer, before, jax.device_get(state), metrics


@pytest.mark.parametrize("optimizer", ["adamw", "adafactor"])
def test_bitfit_trains_biases_only_and_keeps_no_state_for_frozen_params(optimizer):
    config = tiny_decoder(bitfit=True, optimizer=optimizer)
    trainer, before, state, metrics = train_three_steps(config, jax.devices()[:1])
    flat_before = jax.tree_util.tree_flatten_with_path(before)[0]
    after = jax.tree.leaves(state.params)
    biases = 0
    for (path, old), new in zip(flat_before, after):
        if is_bias(path):
            biases += old.size
            assert not np.array_equal(old, new), path  # trained
        else:
            assert np.array_equal(old, new), path  # frozen, bit for bit
    assert biases > 0 and np.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    state_size = sum(int(np.size(x)) for x in jax.tree.leaves(state.opt_state))
    total = sum(int(np.size(x)) for x in jax.tree.leaves(state.params))
    # AdamW: two moments of the biases plus counts; Adafactor: at most one per bias.
    assert state_size <= 2 * biases + 16, (state_size, biases, total)
    full = tiny_decoder(bitfit=False, optimizer=optimizer)
    full_trainer = trainer_lib.build_trainer(full, trainer.mesh)
    full_size = sum(int(np.prod(x.shape)) for x in
                    jax.tree.leaves(full_trainer.abstract_state.opt_state))
    assert state_size * 20 < full_size


def test_bitfit_is_the_same_on_a_2x4_mesh_as_on_one_device():
    one = tiny_decoder(bitfit=True)
    sharded = tiny_decoder(bitfit=True)
    sharded.mesh.data, sharded.mesh.fsdp = 2, 4
    _, _, state_one, _ = train_three_steps(one, jax.devices()[:1])
    _, _, state_mesh, _ = train_three_steps(sharded, jax.devices()[:8])
    # Adam's normalised steps (about lr = 1e-2 each) amplify float reassociation in tiny
    # gradients: agreement to 5e-5 is 0.2% of the 3 steps' movement.
    for a, b in zip(jax.tree.leaves(state_one.params), jax.tree.leaves(state_mesh.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=5e-5)


def test_bitfit_on_a_model_without_biases_is_refused():
    config = tiny_config(**{"peft.bitfit": True})  # T5 v1.1: no biases
    mesh = partitioning.make_mesh({"dcn": 1, "data": 1, "fsdp": 1, "tensor": 1},
                                  jax.devices()[:1])
    with pytest.raises(config_lib.ConfigError, match="has none"):
        trainer_lib.build_trainer(config, mesh)


def test_summary_prints_the_trainable_fraction():
    out = subprocess.run([sys.executable, "-m", "t5x_like.summary", "--config=configs/gpt2_small.py",
                          "--config.peft.bitfit=true"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1].split()
    assert last[0] == "params:" and last[2] == "trainable:"
    total, trainable = int(last[1]), int(last[3])
    assert trainable == 102_144 and last[4] == f"({100 * trainable / total:.2f}%)"
