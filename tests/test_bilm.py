"""The bilm (ELMo) family: shapes, directions, a training step, the scalar mix,
the original's size and config validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import structure_loss

from t5x_like import config_lib, errors, summary
from t5x_like.engine import trainer as trainer_lib
from t5x_like.models import bilm

TINY = config_lib.model_spec_of(dict(vocab_size=64, char_vocabulary="", max_chars=8, char_embed_dim=4,
                       filter_widths=(1, 2, 3), filter_counts=(4, 4, 8), num_highway=1,
                       projection_dim=8, lstm_dim=16, num_layers=2, dropout_rate=0.0, family="bilm"))


@pytest.fixture(scope="module")
def tiny():
    model = bilm.Bilm(TINY)
    tokens = jnp.asarray(np.random.RandomState(0).randint(2, 64, (2, 7)), jnp.int32)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens)["params"]
    return model, params, tokens


def _apply(model, params, tokens, return_layers=False):
    return _jitted(model, return_layers)({"params": params}, tokens)


_CACHE = {}


def _jitted(model, return_layers):
    key = (id(model), return_layers)
    if key not in _CACHE:
        _CACHE[key] = jax.jit(lambda v, t: model.apply(v, t, return_layers=return_layers))
    return _CACHE[key]


def test_shapes(tiny):
    model, params, tokens = tiny
    out = _apply(model, params, tokens, True)
    assert out["forward_logits"].shape == (2, 7, 64)
    assert out["backward_logits"].shape == (2, 7, 64)
    assert out["layers"].shape == (3, 2, 7, 16)


def test_directions(tiny):
    model, params, tokens = tiny
    base = _apply(model, params, tokens)
    t = 3
    later = _apply(model, params, tokens.at[:, t + 1].set(5))
    assert np.allclose(base["forward_logits"][:, t], later["forward_logits"][:, t])
    assert not np.allclose(base["backward_logits"][:, t], later["backward_logits"][:, t])
    earlier = _apply(model, params, tokens.at[:, t - 1].set(5))
    assert not np.allclose(base["forward_logits"][:, t], earlier["forward_logits"][:, t])
    assert np.allclose(base["backward_logits"][:, t], earlier["backward_logits"][:, t])


def test_padding_does_not_reach_backward(tiny):
    model, params, tokens = tiny
    padded = jnp.pad(tokens, ((0, 0), (0, 3)))
    a = _apply(model, params, tokens)["backward_logits"]
    b = _apply(model, params, padded)["backward_logits"][:, :7]
    assert np.allclose(a, b, atol=1e-5)


def test_loss_falls(tiny):
    import optax
    model, params, tokens = tiny
    batch = {"decoder_target_tokens": tokens}
    opt = optax.adam(1e-2)
    state = opt.init(params)

    @jax.jit
    def step(params, state):
        (loss, metrics), grads = jax.value_and_grad(
            lambda p: structure_loss("bilm", model, z_loss=0.0)(p, batch), has_aux=True)(params)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state, loss, metrics

    losses = []
    for _ in range(15):
        params, state, loss, metrics = step(params, state)
        losses.append(float(loss))
    assert set(metrics) >= {"loss", "forward_loss", "backward_loss"}
    assert losses[-1] < losses[0] - 0.5


def test_scalar_mix():
    layers = jnp.asarray(np.random.RandomState(1).randn(3, 2, 4, 5), jnp.float32)
    mix = bilm.ScalarMix(3)
    params = {"weights": jnp.asarray([-1e9, 0.0, -1e9]), "gamma": jnp.asarray(2.5)}
    out = mix.apply({"params": params}, layers)
    np.testing.assert_allclose(out, 2.5 * layers[1], rtol=1e-6)


def test_elmo_original_size():
    config = config_lib.load_config_file("configs/elmo_original.py")
    shapes = trainer_lib.parameter_shapes(config.model)
    rows = dict(summary.module_rows(shapes, 1))
    body = sum(n for name, n in rows.items() if not name.startswith("softmax"))
    assert abs(body - 93.6e6) / 93.6e6 < 0.02, body


def test_validation_refuses_packing():
    config = config_lib.load_config_file("configs/pretrain/elmo_tiny.py")
    config_lib.validate(config)
    config.pack = True
    with pytest.raises(errors.ConfigError, match="pack=False"):
        config_lib.validate(config)
    config.pack = False
    config.model.filter_counts = (1, 2)
    with pytest.raises(errors.ConfigError, match="equal length"):
        config_lib.validate(config)
