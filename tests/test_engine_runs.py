"""Whole runs through ``train.run``: divergence handling, checkpoint retention,
restoring onto another mesh, and initialising from a pretrained folder."""

import json
import pathlib

import jax
import numpy as np
import pytest
from conftest import tiny_config

from t5x_like import errors, train
from t5x_like.checkpoints import checkpoint_store
from t5x_like.engine import partitioning
from t5x_like.engine import trainer as trainer_lib

# Adam at lr 1e30 makes every weight ~1e30 after one step, so step 2's loss is NaN.
DIVERGING = {"optimizer.name": "adamw", "optimizer.learning_rate": 1e30,
             "optimizer.schedule": "constant", "optimizer.warmup_steps": 0,
             "num_train_steps": 4, "log_every_steps": 1, "checkpoint_every_steps": 1,
             "eval_every_steps": 4}


def metrics(workdir) -> list[dict]:
    return [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").open()]


def saved_steps(workdir) -> list[int]:
    return sorted(int(p.name) for p in (pathlib.Path(workdir) / "checkpoints").iterdir()
                  if p.name.isdigit())


def restore_params(config, workdir, step, mesh_shape=None):
    mesh = partitioning.make_mesh(mesh_shape or {"data": 8, "fsdp": 1, "tensor": 1})
    trainer = trainer_lib.build_trainer(config, mesh)
    checkpointer = checkpoint_store.Checkpointer(pathlib.Path(workdir) / "checkpoints", keep=10)
    try:
        state, _, _ = checkpointer.restore(step, trainer.abstract_state)
    finally:
        checkpointer.close()
    return jax.device_get(state.params)


def test_nan_loss_stops_with_a_message_and_the_last_good_checkpoint_loads(tmp_path):
    config = tiny_config(**DIVERGING)
    with pytest.raises(FloatingPointError, match=r"NaN/Inf at step 2; stopping without saving\. "
                                                 r"The last good checkpoint \(step 1\)"):
        train.run(config, str(tmp_path), quiet=True)
    assert saved_steps(tmp_path) == [1]
    params = restore_params(config, tmp_path, 1)
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(params))


def test_skip_update_mode_trains_through_non_finite_steps(tmp_path):
    config = tiny_config(**DIVERGING, on_nonfinite_loss="skip_update")
    result = train.run(config, str(tmp_path), quiet=True)
    assert result["step"] == 4 and saved_steps(tmp_path)[-1] == 4
    records = metrics(tmp_path)
    assert records[0]["skipped_updates"] == 0.0
    assert sum(r["skipped_updates"] for r in records) >= 1
    params = restore_params(config, tmp_path, 4)
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(params))


@pytest.mark.slow
def test_keeps_the_newest_k_plus_every_mth_checkpoint(tmp_path):
    config = tiny_config(num_train_steps=8, checkpoint_every_steps=1, eval_every_steps=8,
                         keep_checkpoints=2, keep_checkpoints_every_steps=3)
    train.run(config, str(tmp_path), quiet=True)
    assert saved_steps(tmp_path) == [3, 6, 7, 8]


@pytest.mark.slow
def test_restore_onto_a_different_mesh_continues_the_same_run(tmp_path):
    settings = {"num_train_steps": 6, "log_every_steps": 1, "checkpoint_every_steps": 3,
                "eval_every_steps": 6, "mesh.data": 2, "mesh.fsdp": 4}
    train.run(tiny_config(**settings), str(tmp_path / "straight"), quiet=True)
    moved = tmp_path / "moved"
    train.run(tiny_config(**dict(settings, num_train_steps=3)), str(moved), quiet=True)
    # Resume on 4 devices, pure data parallel, with tensor-parallel rules.
    train.run(tiny_config(**dict(settings, **{"mesh.data": 2, "mesh.fsdp": 1, "mesh.tensor": 2,
                                              "partitioning.rules": "fsdp_tensor"})),
              str(moved), quiet=True, devices=jax.devices()[:4])
    straight = {r["step"]: r["loss"] for r in metrics(tmp_path / "straight")}
    resumed = {r["step"]: r["loss"] for r in metrics(moved)}
    assert sorted(resumed) == list(range(1, 7))
    np.testing.assert_allclose([resumed[s] for s in range(1, 7)],
                               [straight[s] for s in range(1, 7)], rtol=1e-4)


def _save_pretrained_from_a_fresh_model(config, folder, seed):
    from t5x_like.checkpoints import pretrained
    mesh = partitioning.make_mesh({"data": 8, "fsdp": 1, "tensor": 1})
    params = jax.device_get(trainer_lib.build_trainer(config, mesh).init_state(seed).params)
    pretrained.save_pretrained(folder, config.model.to_dict(), params)
    return params


def test_init_from_a_pretrained_folder_starts_from_its_params(tmp_path):
    # Warmup from 0 makes step 1's update zero: the step-1 checkpoint holds the loaded params.
    config = tiny_config(num_train_steps=1, checkpoint_every_steps=1, eval_every_steps=1)
    given = _save_pretrained_from_a_fresh_model(config, tmp_path / "pretrained", seed=7)
    config.init_from = str(tmp_path / "pretrained")
    train.run(config, str(tmp_path / "run"), quiet=True)
    loaded = restore_params(config, tmp_path / "run", 1)
    for a, b in zip(jax.tree.leaves(given), jax.tree.leaves(loaded), strict=False):
        np.testing.assert_array_equal(a, b)


def test_init_from_a_different_model_or_a_wrong_folder_is_refused(tmp_path):
    config = tiny_config(num_train_steps=1)
    _save_pretrained_from_a_fresh_model(config, tmp_path / "pretrained", seed=0)
    bigger = tiny_config(num_train_steps=1, **{"model.d_ff": 128},
                         init_from=str(tmp_path / "pretrained"))
    with pytest.raises(errors.ConfigError, match=r"init_from=.* holds a different model "
                                                     r"\(model.d_ff: checkpoint 64 vs config 128"):
        train.run(bigger, str(tmp_path / "a"), quiet=True)
    with pytest.raises(errors.ConfigError, match="is not a pretrained folder"):
        train.run(tiny_config(init_from=str(tmp_path)), str(tmp_path / "b"), quiet=True)


def test_mfu_is_logged_with_a_configured_peak(tmp_path):
    config = tiny_config(num_train_steps=2, log_every_steps=1, checkpoint_every_steps=2,
                         eval_every_steps=2, peak_flops_per_device=1e9)
    train.run(config, str(tmp_path), quiet=True)
    records = metrics(tmp_path)
    assert all(0 < r["mfu"] for r in records)
    from t5x_like.engine import flops
    expected = flops.mfu(flops.train_flops_per_step(config.model, config.task_feature_lengths, 16),
                         records[-1]["steps_per_sec"], 8, 1e9)
    assert records[-1]["mfu"] == pytest.approx(expected)
