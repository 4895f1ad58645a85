"""Decoder-only generation over the cache: beam search, scanned stacks, learned and rotary
positions."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like import config_lib
from t5x_like.models import decoder, decoding, stacking

GPT = dict(vocab_size=40, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_layers=2,
           max_length=24)
MODERN = dict(GPT, norm="rmsnorm", position_embedding="rotary", num_kv_heads=1, use_bias=False,
              mlp_activations=("silu", "linear"), tie_embeddings=False)


def model_and_params(settings):
    model = decoder.DecoderOnly(config_lib.model_spec_of(dict(**settings, family="decoder")))
    prompt = jnp.asarray(np.random.default_rng(1).integers(3, 40, size=(2, 5)), jnp.int32)
    return model, nn.unbox(model.init(jax.random.key(2), prompt)["params"]), prompt


def sequence_log_prob(model, params, prompt, continuation):
    full = jnp.concatenate([prompt, continuation], axis=1)
    logp = jax.nn.log_softmax(model.apply({"params": params}, full[:, :-1]))
    picked = jnp.take_along_axis(logp, full[:, 1:, None], axis=-1)[..., 0]
    return picked[:, prompt.shape[1] - 1:].sum(axis=1)


# The beam search sees only the cache slots on a beam's path, within the window.
WINDOWED = dict(MODERN, sliding_window=3)


@pytest.mark.parametrize("settings", [GPT, MODERN, WINDOWED], ids=["gpt2", "modern", "window"])
def test_beam_of_one_is_greedy_and_scores_are_log_probabilities(settings):
    model, params, prompt = model_and_params(settings)
    greedy = decoding.generate(model, params, prompt, max_new_tokens=6)
    beams, _ = decoding.beam_generate(model, params, prompt, max_new_tokens=6, num_beams=1,
                                      alpha=0.0, eos_id=-1)
    np.testing.assert_array_equal(beams[:, 0], greedy)

    beams, scores = jax.jit(functools.partial(decoding.beam_generate, model, max_new_tokens=6,
                                              num_beams=3, alpha=0.0, eos_id=-1))(params, prompt)
    for beam in range(3):
        np.testing.assert_allclose(scores[:, beam],
                                   sequence_log_prob(model, params, prompt, beams[:, beam]),
                                   rtol=1e-4, atol=1e-4)
    assert bool(jnp.all(scores[:, 0] >= sequence_log_prob(model, params, prompt, greedy) - 1e-4))


def test_scanned_decoder_generates_what_the_loop_generates():
    model, params, prompt = model_and_params(MODERN)
    scanned = decoder.DecoderOnly(config_lib.model_spec_of(dict(**MODERN, scan_layers=True, family="decoder")))
    scanned_params = stacking.stack_layer_params(params)
    np.testing.assert_array_equal(
        decoding.generate(scanned, scanned_params, prompt, max_new_tokens=6),
        decoding.generate(model, params, prompt, max_new_tokens=6))
    # Beam search: a scanned cache holds its rows on axis 1, under the layers axis, and
    # they must follow their beams as the loop's do.
    loop, stacked = (decoding.beam_generate(m, p, prompt, max_new_tokens=6, num_beams=3,
                                            alpha=0.0, eos_id=-1)
                     for m, p in ((model, params), (scanned, scanned_params)))
    np.testing.assert_array_equal(stacked[0], loop[0])
    np.testing.assert_allclose(stacked[1], loop[1], rtol=1e-5, atol=1e-5)


def test_beam_generation_past_max_length_is_refused():
    model, params, prompt = model_and_params(GPT)
    with pytest.raises(ValueError, match="exceeds the model's max_length 24"):
        decoding.beam_generate(model, params, prompt, max_new_tokens=20)
