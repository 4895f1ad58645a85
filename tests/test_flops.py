"""The documented FLOPs formulas against XLA's own count, and the chip table."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from t5x_like import config_lib, models, structures
from t5x_like.engine import flops
from t5x_like.system import hardware

CASES = [
    ("decoder", dict(num_layers=2, max_length=128), {"targets": 128}),
    ("encoder", dict(num_layers=2, max_length=128), {"inputs": 128}),
    ("encoder_decoder", dict(num_encoder_layers=2, num_decoder_layers=2),
     {"inputs": 128, "targets": 64}),
]


@pytest.mark.parametrize("family, extra, lengths", CASES)
def test_formula_is_within_5_percent_of_the_compiled_gradient(family, extra, lengths):
    cfg = config_lib.model_defaults(family)
    cfg.update(dict(vocab_size=512, d_model=256, num_heads=4, head_dim=64, d_ff=1024, **extra))
    model = structures.build_model(cfg)
    structure = structures.structure_class(family)(model)
    feature_lengths = structure.model_feature_lengths(lengths)
    params = nn.unbox(model.init(jax.random.key(0),
                                 *models.example_inputs(model, feature_lengths))["params"])
    batch = {k: jnp.ones((2, n), jnp.int32) for k, n in feature_lengths.items()}
    weights = "encoder_loss_weights" if family == "encoder" else "decoder_loss_weights"
    batch[weights] = jnp.ones(batch[next(k for k in batch if k.endswith("target_tokens"))].shape)
    loss = structure.loss_fn(config_lib.default_config().loss)
    grad = jax.jit(jax.grad(lambda p: loss(model, p, batch, None)[0]))
    cost = grad.lower(params).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    ours = flops.train_flops_per_step(cfg, lengths, batch_size=2)
    assert ours == pytest.approx(cost["flops"], rel=0.05)


def test_mfu_is_achieved_over_peak():
    assert flops.mfu(1e12, steps_per_sec=2.0, num_devices=4, peak_flops_per_device=1e12) == 0.5


@pytest.mark.parametrize("kind, peak", [
    ("TPU v5 lite", 197e12), ("TPU v5", 459e12), ("TPU v4", 275e12),
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("cpu", None),
])
def test_peak_flops_by_device_kind(kind, peak):
    assert hardware.peak_flops(kind) == peak


def test_configured_peak_overrides_the_table():
    assert hardware.peak_flops("cpu", override=1e11) == 1e11
    assert hardware.peak_flops("TPU v4", override=1.0) == 1.0
