"""Optimizer and loss options: weight-decay mask, microbatches, label smoothing,
loss normalisation, non-finite updates, and the config checks that guard them."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from conftest import drawn_params, structure_loss, tiny_config

from t5x_like import config_lib, errors, objectives, structures
from t5x_like.engine import optim, partitioning
from t5x_like.engine import trainer as trainer_lib
from t5x_like.models import decoder


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


@pytest.mark.parametrize("fsdp_over_dcn", [False, True])
def test_two_slices_over_dcn_train_like_one_slice(fsdp_over_dcn):
    """Two slices (dcn 2 x fsdp 4) train as one slice of 8; with ``fsdp_over_dcn`` the
    parameters and optimizer state are sharded over the slices as well: each device
    holds an eighth of an embed-sharded kernel, not a quarter."""
    batch = _random_batch()
    config = tiny_config(**{"optimizer.name": "adamw", "optimizer.learning_rate": 1e-3})
    one_params, one = _two_steps(config, batch)
    sliced = tiny_config(**{"optimizer.name": "adamw", "optimizer.learning_rate": 1e-3,
                            "partitioning.fsdp_over_dcn": fsdp_over_dcn})
    two_mesh = {"dcn": 2, "data": 1, "fsdp": 4, "tensor": 1}
    state = trainer_lib.build_trainer(sliced, partitioning.make_mesh(two_mesh)).abstract_state
    kernel = state.params["decoder"]["layers_0"]["mlp"]["wo"]["kernel"]  # [mlp 64, embed 32]
    mu = state.opt_state[0].mu["decoder"]["layers_0"]["mlp"]["wo"]["kernel"]
    for array in (kernel, mu):
        assert array.sharding.shard_shape(array.shape) == (64, 4 if fsdp_over_dcn else 8)
    two_params, two = _two_steps(sliced, batch, two_mesh)
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
    ({"loss.logit_chunks": 0}, "'loss.logit_chunks' must be a finite number >= 1"),
    ({"partitioning.fsdp_over_dcn": True, "partitioning.pipeline_over_dcn": True},
     "partitioning.fsdp_over_dcn and partitioning.pipeline_over_dcn both claim the slices; "
     "choose one."),
    ({"partitioning.fsdp_over_dcn": True, "partitioning.rules": "data_parallel"},
     r"and partitioning.rules='data_parallel' shards none; set "
     r"--config.partitioning.rules=fsdp.$"),
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


def _chunked_decoder(**overrides):
    settings = dict(vocab_size=512, d_model=32, num_heads=2, head_dim=16, d_ff=48, num_layers=1,
                    max_length=64, mlp_activations=("silu", "linear"), use_bias=False,
                    norm="rmsnorm", position_embedding="rotary", tie_embeddings=False)
    settings.update(overrides)
    return decoder.DecoderOnly(config_lib.model_spec_of(dict(**settings, family="decoder")))


def _decoder_loss(model, chunks: int, length: int, label_smoothing=0.1):
    rng = np.random.default_rng(3)
    batch = {"decoder_input_tokens": rng.integers(1, 512, (4, length)).astype(np.int32),
             "decoder_target_tokens": rng.integers(1, 512, (4, length)).astype(np.int32),
             "decoder_loss_weights": (rng.random((4, length)) < 0.7).astype(np.float32)}
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    loss_fn = structures.structure_class("decoder")(model).loss_fn(ml_collections.ConfigDict(
        {"z_loss": 1e-3, "label_smoothing": label_smoothing, "logit_chunks": chunks}))
    params = drawn_params(model, batch["decoder_input_tokens"])
    grad = jax.jit(jax.value_and_grad(lambda p: loss_fn(model, p, batch, None, normalizer=50.0),
                                      has_aux=True))
    return grad, params


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": True, "final_logit_softcap": 3.0}])
def test_logit_chunks_give_the_whole_logits_loss_and_gradient(overrides):
    """Slices of positions (3 of 10 positions: the last padded) through the output layer,
    each recomputed in the backward pass, sum to the loss, metrics and gradient of the
    logits computed at once: untied, and tied with Gemma 2's soft-cap."""
    model = _chunked_decoder(**overrides)
    whole, params = _decoder_loss(model, 1, 10)
    chunked, _ = _decoder_loss(model, 3, 10)
    (loss, metrics), grads = whole(params)
    (chunked_loss, chunked_metrics), chunked_grads = chunked(params)
    np.testing.assert_allclose(chunked_loss, loss, rtol=1e-5)
    for key in ("loss", "z_loss", "accuracy", "num_target_tokens"):
        np.testing.assert_allclose(chunked_metrics[key], metrics[key], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(chunked_grads), jax.tree.leaves(grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_logit_chunks_hold_one_slice_of_logits_not_the_batchs():
    """The point of the slices: the compiled loss-and-gradient keeps about a slice's float32
    logits (4 rows x 64 positions x 4,096 vocabulary: 4 MiB whole) in temporaries; with 8
    slices it needs under a third of the whole program's (measured: 2.0 of 9.3 MB)."""
    model = _chunked_decoder(vocab_size=4096)

    def temporaries(chunks):
        grad, params = _decoder_loss(model, chunks, 64)
        return grad.lower(params).compile().memory_analysis().temp_size_in_bytes
    whole, chunked = temporaries(1), temporaries(8)
    assert whole > 4 * 64 * 4096 * 4
    assert chunked < whole / 3, (chunked, whole)


def test_logit_chunks_are_refused_where_the_loss_reads_logits_whole():
    config = tiny_config(**{"loss.logit_chunks": 4})
    with pytest.raises(errors.UserError, match=r"^loss.logit_chunks=4: the encoder_decoder "
                       r"structure's loss reads its logits whole; set "
                       r"--config.loss.logit_chunks=1.$"):
        trainer_lib.build_trainer(config, partitioning.make_mesh({"data": 8}))

    class PlugIn(nn.Module):  # a plug-in decoder module with no project_hidden
        @nn.compact
        def __call__(self, decoder_input_tokens, **kwargs):
            return nn.Dense(8)(decoder_input_tokens)
    with pytest.raises(errors.UserError, match="PlugIn.__call__ takes no project_hidden"):
        structures.structure_class("decoder")(PlugIn()).check_logit_chunks(2)
