"""Muon, schedule-free AdamW and the warmup-stable-decay schedule (``optim``): which
parameters Muon orthogonalises, that its updates are orthogonal, that schedule-free is
evaluated and read back on its averaged weights, PEFT masks, FSDP and exact resume."""

import os
import signal

import jax
import numpy as np
import pytest
from conftest import tiny_config
from optax.contrib import MuonDimensionNumbers
from test_peft import random_batch, tiny_decoder

from t5x_like import config_lib, errors, train
from t5x_like.builtin_tasks import pretraining
from t5x_like.checkpoints.param_sources import source as checkpoint_source
from t5x_like.engine import optim, partitioning
from t5x_like.engine import trainer as trainer_lib
from t5x_like.resilience import resume_fingerprint


def decoder_config(optimizer: str, scan: bool = False, **peft):
    config = tiny_decoder(**peft)
    config.optimizer.update(name=optimizer, schedule="constant", learning_rate=1e-2)
    config.model.scan_layers = scan
    config_lib.validate(config)
    return config


def build(config, devices=None):
    devices = devices or jax.devices()[:1]
    mesh = partitioning.make_mesh(config_lib.resolve_mesh_shape(dict(config.mesh), len(devices)),
                                  devices)
    return trainer_lib.build_trainer(config, mesh)


def flat_numbers(trainer):
    axes = trainer_lib.logical_axes(trainer_lib.abstract_boxed_params(
        trainer.model, trainer.model_feature_lengths))
    numbers = optim.muon_dimension_numbers(axes)
    leaves = jax.tree_util.tree_flatten_with_path(
        numbers, is_leaf=lambda x: x is None or isinstance(x, MuonDimensionNumbers))[0]
    return {"/".join(str(k.key) for k in path): n for path, n in leaves}


def test_muon_orthogonalises_projections_and_leaves_the_rest_to_adamw():
    numbers = flat_numbers(build(decoder_config("muon")))
    query = numbers["layers_0/attention/query/kernel"]   # embed x heads x kv
    out = numbers["layers_0/attention/out/kernel"]       # heads x kv x embed
    assert (query.reduction_axis, query.output_axis) == ((0,), (1, 2))
    assert (out.reduction_axis, out.output_axis) == ((0, 1), (2,))
    assert numbers["layers_0/mlp/wo/kernel"].output_axis == (1,)
    for adamw in ("token_embedder/embedding", "position_embedder/embedding",
                  "layers_0/attention/query/bias", "layers_0/pre_mlp_norm/scale"):
        assert numbers[adamw] is None, adamw


def test_a_scanned_stack_orthogonalises_each_layer_apart():
    numbers = flat_numbers(build(decoder_config("muon", scan=True)))
    query = [n for path, n in numbers.items() if path.endswith("attention/query/kernel")]
    assert len(query) == 1  # layers x embed x heads x kv: the layer axis is a batch axis
    assert (query[0].reduction_axis, query[0].output_axis) == ((1,), (2, 3))


def test_t5s_relative_position_bias_and_untied_logits_go_to_adamw():
    numbers = flat_numbers(build(tiny_config(**{"optimizer.name": "muon"})))
    assert all(n is None for path, n in numbers.items() if "relpos" in path or "logits" in path)
    assert numbers["encoder/layers_0/attention/key/kernel"] is not None


def newton_schulz(matrix, steps=5, coefficients=(3.4445, -4.775, 2.0315)):
    """Muon's quintic iteration (Jordan et al.), in numpy, for comparison."""
    a, b, c = coefficients
    x = matrix / np.linalg.norm(matrix)
    wide = x.shape[0] <= x.shape[1]
    x = x if wide else x.T
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x if wide else x.T


def test_a_muon_update_of_a_projection_is_orthogonal():
    """The first update of each Muon matrix has (nearly) equal singular values whatever the
    gradient's spread, a query's taken over all heads at once; the embedding's is AdamW's
    first step, a constant times -sign(grad)."""
    config = decoder_config("muon")
    config.optimizer.weight_decay = 0.0
    trainer = build(config)
    params = jax.device_get(trainer.init_state(0).params)
    rng = np.random.default_rng(0)
    grads = jax.tree.map(lambda p: rng.standard_normal(p.shape).astype(np.float32)
                         * np.geomspace(1e-2, 10.0, p.shape[-1], dtype=np.float32), params)
    updates, _ = trainer.optimizer.update(grads, trainer.optimizer.init(params), params)
    wi = np.asarray(updates["layers_0"]["mlp"]["wi"]["kernel"])  # 32 x 64
    singular = np.linalg.svd(wi, compute_uv=False)
    assert singular.max() / singular.min() < 2  # 5 quintic steps: roughly [0.7, 1.2]
    raw = np.linalg.svd(grads["layers_0"]["mlp"]["wi"]["kernel"], compute_uv=False)
    assert raw.max() / raw.min() > 50
    query = np.asarray(updates["layers_0"]["attention"]["query"]["kernel"])  # embed x heads x kv
    expected = newton_schulz(grads["layers_0"]["attention"]["query"]["kernel"].reshape(32, -1))
    np.testing.assert_allclose(query.reshape(32, -1) / np.linalg.norm(query),
                               -expected / np.linalg.norm(expected), atol=2e-4)
    # Adam's first step is the same size on every entry (Nesterov's makes it 1.47 lr).
    embedding = np.asarray(updates["token_embedder"]["embedding"])
    size = np.abs(embedding).mean()
    np.testing.assert_allclose(embedding, -size * np.sign(grads["token_embedder"]["embedding"]),
                               rtol=0.05)  # Adam's epsilon shrinks the tiniest gradients' steps
    assert 1e-2 <= size < 2e-2


@pytest.mark.parametrize("optimizer", ["muon", "schedule_free_adamw"])
def test_frozen_parameters_stay_and_keep_no_state(optimizer):
    config = decoder_config(optimizer, bitfit=True)
    trainer = build(config)
    state = trainer.init_state(0)
    before = jax.device_get(state.params)
    for step in range(3):
        state, metrics = trainer.train_step(state, random_batch(trainer, config, step))
    after = jax.device_get(trainer.evaluation_params(state))
    changed = jax.tree_util.tree_map_with_path(
        lambda path, a, b: (str(path[-1].key), bool(np.any(a != b))), before, after)
    pairs = jax.tree.leaves(changed, is_leaf=lambda x: isinstance(x, tuple))
    assert all(moved == (name == "bias") for name, moved in pairs)
    frozen_size = sum(x.size for x in jax.tree.leaves(before)) - sum(
        x.size for path, x in trainer_lib.flat_with_paths(before) if path.endswith("bias"))
    state_size = sum(x.size for x in jax.tree.leaves(jax.device_get(state.opt_state)))
    assert state_size < frozen_size  # no moments (or z) for the frozen kernels
    assert np.isfinite(metrics["loss"])


def test_schedule_free_evaluates_its_averaged_weights():
    config = decoder_config("schedule_free_adamw")
    config.optimizer.b1 = 0.9
    trainer = build(config)
    state = trainer.init_state(0)
    for step in range(3):
        state, _ = trainer.train_step(state, random_batch(trainer, config, step))
    y, z = jax.device_get(state.params), None
    for leaf in jax.tree.leaves(jax.device_get(state.opt_state),
                                is_leaf=lambda s: hasattr(s, "z") and hasattr(s, "b1")):
        if hasattr(leaf, "z"):
            z = leaf.z
    x = jax.device_get(trainer.evaluation_params(state))
    kernel = ("layers_0", "mlp", "wi", "kernel")

    def at(tree):
        for key in kernel:
            tree = tree[key]
        return np.asarray(tree)
    np.testing.assert_allclose(at(x), (at(y) - 0.1 * at(z)) / 0.9, rtol=1e-5, atol=1e-6)
    assert not np.allclose(at(x), at(y))
    # Other optimizers evaluate their params as they are (no copy).
    adamw = build(decoder_config("adamw"))
    plain = adamw.abstract_state  # the state's tree is what is asked about: no init compile
    assert adamw.evaluation_params(plain) is plain.params


def test_a_schedule_free_run_is_evaluated_and_read_back_on_its_averaged_weights(
        tmp_path, monkeypatch):
    config = decoder_config("schedule_free_adamw")
    config.update(num_train_steps=6, log_every_steps=6, eval_every_steps=6,
                  checkpoint_every_steps=6, eval_batches=1)
    evaluated = []
    eval_step = trainer_lib.Trainer.eval_step

    def recording_eval_step(self, params, batch):
        evaluated.append(jax.device_get(params))
        return eval_step(self, params, batch)
    monkeypatch.setattr(trainer_lib.Trainer, "eval_step", recording_eval_step)
    train.run(config, str(tmp_path), quiet=True)
    monkeypatch.undo()

    trainer = build(config)
    source = checkpoint_source.resolve(str(tmp_path))
    read = jax.device_get(source.restore_params(6, trainer))
    checkpointer = source.open_checkpointer()
    try:
        state, _ = checkpoint_source.restore_state(
            checkpointer, 6, trainer, source.saved_config(6), config, where="test")
    finally:
        checkpointer.close()
    averaged = jax.device_get(trainer.evaluation_params(state))
    trained = jax.device_get(state.params)
    assert len(evaluated) == 1  # the one held-out evaluation, at step 6
    for got, seen, want in zip(jax.tree.leaves(read), jax.tree.leaves(evaluated[0]),
                               jax.tree.leaves(averaged), strict=True):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(seen, want)
    assert not all(np.array_equal(a, b) for a, b in zip(
        jax.tree.leaves(averaged), jax.tree.leaves(trained), strict=True))


@pytest.mark.parametrize("optimizer", ["muon", "schedule_free_adamw"])
def test_fsdp_over_8_devices_trains_like_one_device(optimizer):
    config = decoder_config(optimizer)
    one = build(config)
    config8 = decoder_config(optimizer)
    config8.mesh.data, config8.mesh.fsdp = 2, 4
    eight = build(config8, jax.devices())
    states = [one.init_state(0), eight.init_state(0)]
    for step in range(2):
        batch = jax.device_get(random_batch(one, config, step))
        states = [t.train_step(s, partitioning.global_batch(batch, t.mesh))[0]
                  for t, s in zip((one, eight), states, strict=True)]
    sharded = dict(trainer_lib.flat_with_paths(jax.device_get(states[1].params)))
    for path, a in trainer_lib.flat_with_paths(jax.device_get(states[0].params)):
        if path.endswith("key/bias"):
            continue  # softmax ignores it: its gradient is rounding noise, different per layout
        b = sharded[path]
        # Sharded reductions sum in another order; Newton-Schulz carries it to every entry.
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3 * float(np.abs(b).max()) + 1e-7,
                                   err_msg=path)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,schedule", [("muon", "wsd"), ("schedule_free_adamw", "constant")])
def test_resume_is_exact(tmp_path, monkeypatch, optimizer, schedule):
    """A run stopped by a SIGTERM at step 4 (a preemption: it saves that step) and resumed
    logs the losses of an uninterrupted run, bit for bit, over an FSDP mesh: the
    optimizer's sharded state (Muon's momentum, schedule-free's z) and the schedule's
    position (WSD, without warmup, decays over the steps after the resume) come back
    exactly. Both legs are the straight run's config: a leg ended by a shorter
    ``num_train_steps`` has another WSD schedule and so compiled another train step."""
    def config():
        config = decoder_config(optimizer)  # one stack: compiles in about half T5's time
        config.update(num_train_steps=8, log_every_steps=1, checkpoint_every_steps=4,
                      eval_every_steps=0)  # nothing here reads an eval
        config.optimizer.schedule = schedule
        config.mesh.data, config.mesh.fsdp = 2, 4
        config_lib.validate(config)
        return config
    train.run(config(), str(tmp_path / "straight"), quiet=True)

    steps = []
    train_step = trainer_lib.Trainer.train_step

    def preempted_at_step_4(self, state, batch):
        out = train_step(self, state, batch)
        steps.append(len(steps) + 1)
        if len(steps) == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return out
    monkeypatch.setattr(trainer_lib.Trainer, "train_step", preempted_at_step_4)
    interrupted = tmp_path / "interrupted"
    assert train.run(config(), str(interrupted), quiet=True)["step"] == 4
    monkeypatch.undo()
    assert steps == [1, 2, 3, 4]
    assert train.run(config(), str(interrupted), quiet=True)["step"] == 8

    def losses(folder):
        import json
        return [json.loads(line)["loss"] for line in (folder / "metrics.jsonl").open()]
    assert len(losses(interrupted)) == 8
    assert losses(interrupted) == losses(tmp_path / "straight")  # bit for bit


def test_the_fingerprint_tells_optimizers_apart():
    fingerprints = []
    for name in ("adamw", "muon", "schedule_free_adamw"):
        config = decoder_config(name)
        trainer = build(config)
        fingerprints.append(resume_fingerprint.fingerprint(config, pretraining.embedded_vocabulary(),
                                                  trainer.abstract_state.opt_state))
    with pytest.raises(errors.ConfigError, match="optimizer.name: checkpoint 'adamw', config 'muon'"):
        resume_fingerprint.check_resume({"fingerprint": fingerprints[0]}, fingerprints[1], ())
    assert fingerprints[1]["optimizer.state"] != fingerprints[2]["optimizer.state"]


def test_wsd_holds_the_peak_then_decays_linearly_over_the_last_fraction():
    cfg = config_lib.default_config().optimizer
    cfg.update(schedule="wsd", learning_rate=1e-3, warmup_steps=10, decay_fraction=0.2,
               final_learning_rate_fraction=0.1)
    lr = optim.learning_rate_schedule(cfg, 110)  # 100 steps after warmup: decay the last 20
    assert float(lr(5)) == pytest.approx(5e-4)
    for step in (10, 60, 90):
        assert float(lr(step)) == pytest.approx(1e-3)
    assert float(lr(100)) == pytest.approx(1e-3 - 0.5 * 0.9e-3)
    assert float(lr(110)) == pytest.approx(1e-4)


@pytest.mark.parametrize("overrides,message", [
    ({"optimizer.name": "schedule_free_adamw", "optimizer.schedule": "cosine"},
     "schedule=constant"),
    ({"optimizer.schedule": "wsd", "optimizer.decay_fraction": 0.0}, r"in \(0, 1\]"),
    ({"optimizer.name": "muon", "optimizer.muon_momentum": 1.0}, r"in \[0, 1\)"),
])
def test_bad_optimizer_settings_are_refused_naming_the_fix(overrides, message):
    with pytest.raises(errors.ConfigError, match=message):
        tiny_config(**overrides)


def test_muon_without_logical_axes_is_a_programming_error():
    cfg = config_lib.default_config().optimizer
    cfg.name = "muon"
    with pytest.raises(ValueError, match="logical axis names"):
        optim.make_optimizer(cfg, 10)
