import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from conftest import structure_loss

from t5x_like import config_lib, models, objectives, structures


def tiny(family, **extra):
    cfg = config_lib.model_defaults(family)
    cfg.update(dict(vocab_size=50, d_model=16, num_heads=2, head_dim=8, d_ff=32, **extra))
    model = structures.build_model(cfg)
    inputs = models.example_inputs(model, {}, batch_size=2)
    return model, nn.unbox(model.init(jax.random.key(0), *inputs)["params"])


def test_cross_entropy_matches_a_direct_computation():
    logits = jnp.array([[[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]]])
    targets = jnp.array([[0, 2]])
    weights = jnp.array([[1.0, 0.0]])
    ce, z, correct = objectives.cross_entropy_with_z_loss(logits, targets, weights, z_loss=0.1)
    log_z = np.log(np.exp([2.0, 0.0, -1.0]).sum())
    np.testing.assert_allclose(ce, log_z - 2.0, rtol=1e-6)
    np.testing.assert_allclose(z, 0.1 * log_z**2, rtol=1e-6)
    assert correct == 1.0


def test_causal_lm_loss_is_near_log_vocab_at_init_and_ignores_weightless_positions():
    model, params = tiny("decoder", num_layers=1, max_length=16)
    tokens = np.random.default_rng(0).integers(1, 50, size=(2, 8)).astype(np.int32)
    batch = {"decoder_input_tokens": tokens[:, :-1], "decoder_target_tokens": tokens[:, 1:],
             "decoder_loss_weights": np.ones((2, 7), np.float32)}
    _, metrics = structure_loss("decoder", model)(params, batch)
    assert abs(float(metrics["loss"]) - np.log(50)) < 1.0
    batch["decoder_loss_weights"][:, 3:] = 0
    changed = dict(batch, decoder_target_tokens=np.where(np.arange(7) >= 3, 0, tokens[:, 1:]))
    _, a = structure_loss("decoder", model)(params, batch)
    _, b = structure_loss("decoder", model)(params, changed)
    np.testing.assert_allclose(a["loss"], b["loss"])
    assert float(a["num_target_tokens"]) == 6


def test_masked_lm_loss_adds_next_sentence_loss():
    model, params = tiny("encoder", num_layers=1, max_length=16)
    tokens = np.random.default_rng(0).integers(5, 50, size=(2, 8)).astype(np.int32)
    batch = {"encoder_input_tokens": tokens, "encoder_target_tokens": tokens,
             "encoder_loss_weights": (np.arange(8) % 4 == 0).astype(np.float32)[None].repeat(2, 0)}
    _, without = structure_loss("encoder", model)(params, batch)
    loss, with_nsp = structure_loss("encoder", model)(
        params, dict(batch, next_sentence_labels=np.array([0, 1])))
    np.testing.assert_allclose(loss, with_nsp["mlm_loss"] + with_nsp["nsp_loss"], rtol=1e-6)
    np.testing.assert_allclose(with_nsp["mlm_loss"], without["loss"], rtol=1e-6)
    assert float(with_nsp["nsp_loss"]) > 0
