"""Optimizer and loss options: weight-decay mask, microbatches, label smoothing,
loss normalisation, non-finite updates, and the config checks that guard them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import structure_loss, tiny_config

from t5x_like import config_lib, errors, objectives
from t5x_like.engine import optim, partitioning
from t5x_like.engine import trainer as trainer_lib


def test_weight_decay_skips_norm_scales_and_biases_by_name():
    params = {"attn": {"query": {"kernel": jnp.ones((4, 2, 2)), "bias": jnp.ones((2, 2))}},
              "ln": {"scale": jnp.ones(4), "bias": jnp.ones(4)},
              "token_embedder": {"embedding": jnp.ones((10, 4))}}
    mask = optim.decay_mask(params)
    assert mask == {"attn": {"query": {"kernel": True, "bias": False}},
                    "ln": {"scale": False, "bias": False},
                    "token_embedder": {"embedding": True}}


def test_adamw_decays_kernels_but_leaves_a_zero_gradient_scale_alone():
    config = tiny_config(**{"optimizer.name": "adamw", "optimizer.weight_decay": 0.5,
                            "optimizer.schedule": "constant", "optimizer.warmup_steps": 0,
                            "optimizer.learning_rate": 0.1})
    tx, _ = optim.make_optimizer(config.optimizer, 10)
    params = {"dense": {"kernel": jnp.ones((2, 2))}, "norm": {"scale": jnp.ones(2)}}
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zeros, tx.init(params), params)
    np.testing.assert_allclose(updates["dense"]["kernel"], -0.05 * np.ones((2, 2)), rtol=1e-6)
    np.testing.assert_array_equal(updates["norm"]["scale"], np.zeros(2))


def _random_batch(batch_size=16, inputs=32, targets=8, seed=0):
    rng = np.random.default_rng(seed)
    weights = (rng.random((batch_size, targets)) < 0.8).astype(np.float32)
    weights[:, 0] = 1.0
    return {"encoder_input_tokens": rng.integers(1, 100, (batch_size, inputs)).astype(np.int32),
            "decoder_input_tokens": rng.integers(1, 100, (batch_size, targets)).astype(np.int32),
            "decoder_target_tokens": rng.integers(1, 100, (batch_size, targets)).astype(np.int32),
            "decoder_loss_weights": weights}


def _two_steps(config, batch, mesh_shape=None):
    mesh = partitioning.make_mesh(mesh_shape or {"data": 2, "fsdp": 4, "tensor": 1})
    trainer = trainer_lib.build_trainer(config, mesh)
    state = trainer.init_state(0)
    metrics = []
    for _ in range(2):
        state, m = trainer.train_step(state, partitioning.global_batch(batch, mesh))
        metrics.append(jax.device_get(m))
    return jax.device_get(state.params), metrics


def test_k_microbatches_equal_one_batch_of_k_times_the_size():
    batch = _random_batch()
    settings = {"optimizer.name": "adamw", "optimizer.learning_rate": 1e-3}
    whole_params, whole = _two_steps(tiny_config(**settings), batch)
    micro_params, micro = _two_steps(tiny_config(**settings, **{"optimizer.microbatches": 2}),
                                     batch)
    for a, b in zip(whole, micro, strict=False):
        for key in ("loss", "accuracy", "grad_norm", "num_target_tokens"):
            np.testing.assert_allclose(a[key], b[key], rtol=2e-5, err_msg=key)
    for a, b in zip(jax.tree.leaves(whole_params), jax.tree.leaves(micro_params), strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_two_slices_over_dcn_train_like_one_slice():
    batch = _random_batch()
    config = tiny_config(**{"optimizer.name": "adamw", "optimizer.learning_rate": 1e-3})
    one_params, one = _two_steps(config, batch)
    two_params, two = _two_steps(config, batch, {"dcn": 2, "data": 1, "fsdp": 4, "tensor": 1})
    for a, b in zip(one, two, strict=False):
        for key in ("loss", "accuracy", "grad_norm"):
            np.testing.assert_allclose(a[key], b[key], rtol=2e-5, err_msg=key)
    for a, b in zip(jax.tree.leaves(one_params), jax.tree.leaves(two_params), strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_microbatch_i_takes_every_kth_row():
    batch = {"x": jnp.arange(8)}
    micro = jax.jit(lambda b: optim.split_microbatches(b, 2, None))(batch)
    np.testing.assert_array_equal(micro["x"], [[0, 2, 4, 6], [1, 3, 5, 7]])


def test_label_smoothing_matches_soft_target_cross_entropy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
    targets = rng.integers(0, 5, (2, 3))
    weights = np.ones((2, 3), np.float32)
    smoothing = 0.1
    soft = np.full((2, 3, 5), smoothing / 4)
    np.put_along_axis(soft, targets[..., None], 1 - smoothing, axis=-1)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    entropy = -(soft * np.log(soft)).sum(-1)
    expected = ((-(soft * log_p).sum(-1)) - entropy).sum()
    ce, _, _, optimised = objectives.token._token_losses(
        jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights), 0.0, smoothing)
    np.testing.assert_allclose(optimised, expected, rtol=1e-5)
    np.testing.assert_allclose(ce, -np.take_along_axis(log_p, targets[..., None], -1).sum(),
                               rtol=1e-5)


def test_constant_normalizer_divides_the_summed_loss():
    config = tiny_config()
    model = trainer_lib.structures.build_model(config.model)
    import flax.linen as nn
    batch = {k: jnp.asarray(v) for k, v in _random_batch(4).items()}
    inputs = trainer_lib.models.example_inputs(model, {})
    params = nn.unbox(model.init(jax.random.key(0), *inputs)["params"])
    loss = structure_loss("encoder_decoder", model, z_loss=0.0)
    per_token, metrics = loss(params, batch)
    constant, _ = loss(params, batch, normalizer=1000.0)
    np.testing.assert_allclose(constant * 1000.0, per_token * metrics["num_target_tokens"],
                               rtol=1e-5)


def test_skip_update_keeps_params_when_the_loss_is_not_finite():
    config = tiny_config(on_nonfinite_loss="skip_update")
    mesh = partitioning.make_mesh({"data": 8, "fsdp": 1, "tensor": 1})
    trainer = trainer_lib.build_trainer(config, mesh)
    state = trainer.init_state(0)
    before = jax.device_get(state.params)
    batch = _random_batch()
    batch["decoder_loss_weights"] = batch["decoder_loss_weights"] * np.float32("nan")
    state, metrics = trainer.train_step(state, partitioning.global_batch(batch, mesh))
    assert float(metrics["skipped_updates"]) == 1.0 and int(state.step) == 1
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(jax.device_get(state.params)), strict=False):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("overrides, message", [
    ({"optimizer.microbatches": 0}, "'optimizer.microbatches' must be a finite number >= 1"),
    ({"loss.label_smoothing": 1.0}, r"loss.label_smoothing=1.0 must be in \[0, 1\)"),
    ({"loss.normalization": "constant"}, "needs a positive loss.normalizing_constant"),
    ({"loss.normalization": "sum"}, "'loss.normalization' is 'sum'; choose one of"),
    ({"on_nonfinite_loss": "ignore"}, "'divergence.on_nonfinite_loss' is 'ignore'; choose one of"),
    ({"keep_checkpoints_every_steps": 25}, "not a multiple of checkpoint.every_steps=15"),
    ({"keep_checkpoints_every_steps": -1}, "'checkpoint.keep_every_steps' must be a finite number >= 0"),
    ({"eval_every_steps": -2}, "'evals.held_out.every_steps' must be a finite number >= -1"),
    ({"peak_flops_per_device": -1.0}, "'logging.peak_flops_per_device' must be a finite number >= 0"),
])
def test_bad_engine_options_are_named(overrides, message):
    with pytest.raises(errors.ConfigError, match=message):
        tiny_config(**overrides)


def test_microbatches_must_divide_the_per_device_batch():
    config = tiny_config(**{"optimizer.microbatches": 4})
    with pytest.raises(errors.ConfigError, match="multiple of 32"):
        config_lib.validate_for_devices(config, 8)


@pytest.mark.slow
def test_next_sentence_loss_is_counted_once_over_microbatches():
    """BERT's per-sequence term must be divided by the whole batch's sequences, or k
    microbatches would weigh it k times against the masked-LM tokens."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(5, 100, (16, 16)).astype(np.int32)
    batch = {"encoder_input_tokens": tokens, "encoder_target_tokens": tokens,
             "encoder_token_type_ids": np.zeros_like(tokens),
             "encoder_loss_weights": (rng.random(tokens.shape) < 0.3).astype(np.float32),
             "next_sentence_labels": rng.integers(0, 2, (16,)).astype(np.int32)}

    def bert(**settings):
        config = tiny_config(**{"optimizer.name": "adamw", "optimizer.learning_rate": 1e-2},
                             **settings)
        config.model = config_lib.model_defaults("encoder")
        config.model.update(dict(vocab_size=128, d_model=32, num_heads=2, head_dim=16, d_ff=64,
                                 num_layers=1, max_length=32, next_sentence_head=True))
        config.task_feature_lengths = {"inputs": 16}
        return config

    whole_params, whole = _two_steps(bert(), batch)
    micro_params, micro = _two_steps(bert(**{"optimizer.microbatches": 2}), batch)
    for a, b in zip(whole, micro, strict=False):
        np.testing.assert_allclose(a["grad_norm"], b["grad_norm"], rtol=2e-5)
    for a, b in zip(jax.tree.leaves(whole_params), jax.tree.leaves(micro_params), strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_decay_ends_at_the_final_fraction_of_the_peak(schedule):
    cfg = config_lib.default_config().optimizer
    cfg.update(schedule=schedule, learning_rate=2e-3, warmup_steps=10,
               final_learning_rate_fraction=0.1)
    lr = optim.learning_rate_schedule(cfg, 110)
    assert float(lr(10)) == pytest.approx(2e-3)
    assert float(lr(110)) == pytest.approx(2e-4, rel=1e-5)
    assert float(lr(60)) > 2e-4
    cfg.final_learning_rate_fraction = 0.0  # the default: decay to zero
    assert float(optim.learning_rate_schedule(cfg, 110)(110)) == pytest.approx(0.0, abs=1e-12)


def test_a_final_fraction_outside_0_1_is_refused():
    config = config_lib.default_config()
    config.optimizer.final_learning_rate_fraction = 1.5
    with pytest.raises(errors.ConfigError, match=r"must be in \[0, 1\]"):
        config_lib.validate(config)
