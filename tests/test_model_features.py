"""Layer options shared by the families: scan and remat, packed segments, prefix LM.

Each model runs as compiled programs (``jax.jit``): op by op, every operation of a model
would compile (and enter the compilation cache) on its own. Parameters are drawn in numpy
in the shapes and dtypes of the model's init (``drawn_params``): the tests compare
computations on the same parameters, and compiling an init costs about as much as the
program tested."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import drawn_params

from t5x_like import config_lib, structures
from t5x_like.models import decoder, stacking


def tiny_decoder(**overrides):
    settings = dict(vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=48, num_layers=3,
                    max_length=32, mlp_activations=("silu", "linear"), use_bias=False,
                    norm="rmsnorm", position_embedding="rotary", num_kv_heads=2,
                    tie_embeddings=False)
    settings.update(overrides)
    return decoder.DecoderOnly(config_lib.model_spec_of(dict(**settings, family="decoder")))


def tokens(shape=(2, 12), seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(1, 64, size=shape), jnp.int32)


@functools.cache
def _decoder_params():
    """``tiny_decoder()``'s parameters, shared by the tests that run it (its shapes do not
    depend on the tokens' length)."""
    return drawn_params(tiny_decoder(), tokens())


def _logits_and_grads(model, params, x):
    """``model``'s logits on ``x`` and the gradient of their mean square, one program."""
    def loss(p):
        out = model.apply({"params": p}, x)
        return jnp.mean(out ** 2), out
    (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return out, grads


@pytest.fixture(scope="module")
def loop_run():
    """The 3-layer loop's parameters, logits and gradients: what every remat policy's
    scanned stack is compared with."""
    params = _decoder_params()
    return (params, *_logits_and_grads(tiny_decoder(), params, tokens()))


@pytest.mark.parametrize("remat_policy", ["none", "full", "dots_no_batch", "offload"])
def test_scanned_layers_compute_what_the_loop_computes(loop_run, remat_policy):
    x = tokens()
    params, loop_out, grad_loop = loop_run
    scanned = tiny_decoder(scan_layers=True, remat_policy=remat_policy)
    stacked = stacking.stack_layer_params(params)
    assert stacked["layers"]["mlp"]["wo"]["kernel"].shape == (3, 48, 32)
    # The scanned model's own init has the same structure.
    own = nn.unbox(jax.eval_shape(lambda: scanned.init(jax.random.key(0), x))["params"])
    assert jax.tree.structure(own) == jax.tree.structure(stacked)

    scan_out, grad_scan = _logits_and_grads(scanned, stacked, x)
    np.testing.assert_allclose(scan_out, loop_out, rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(stacking.stack_layer_params(jax.device_get(grad_loop))),
                    jax.tree.leaves(grad_scan), strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert jax.tree.structure(stacking.unstack_layer_params(stacked)) == jax.tree.structure(params)


def test_an_unknown_remat_policy_names_the_choices():
    with pytest.raises(ValueError, match="'model.numerics.remat_policy' is 'everything'; "
                                         "choose one of"):
        tiny_decoder(remat_policy="everything")


def test_packed_rows_give_the_logits_of_separate_rows():
    model = tiny_decoder()
    a, b = tokens((1, 7), seed=1), tokens((1, 5), seed=2)
    params = _decoder_params()
    packed = jnp.concatenate([a, b, jnp.zeros((1, 3), jnp.int32)], axis=1)
    segments = jnp.asarray([[1] * 7 + [2] * 5 + [0] * 3])
    positions = jnp.asarray([list(range(7)) + list(range(5)) + [0] * 3])

    def run(p, packed, segments, positions, a, b):  # the packed row, then each alone
        apply = functools.partial(model.apply, {"params": p})
        return (apply(packed, decoder_segment_ids=segments, decoder_positions=positions),
                apply(a), apply(b))
    out, alone_a, alone_b = jax.jit(run)(params, packed, segments, positions, a, b)
    np.testing.assert_allclose(out[:, :7], alone_a, atol=1e-5)
    np.testing.assert_allclose(out[:, 7:12], alone_b, atol=1e-5)


def test_learned_positions_also_restart_per_segment():
    model = tiny_decoder(position_embedding="learned", norm="layernorm", use_bias=True)
    a, b = tokens((1, 6), seed=3), tokens((1, 6), seed=4)
    params = drawn_params(model, a)
    packed = jnp.concatenate([a, b], axis=1)

    def run(p, packed, b):
        apply = functools.partial(model.apply, {"params": p})
        return apply(packed, decoder_segment_ids=jnp.asarray([[1] * 6 + [2] * 6]),
                     decoder_positions=jnp.asarray([list(range(6)) * 2])), apply(b)
    out, alone = jax.jit(run)(params, packed, b)
    np.testing.assert_allclose(out[:, 6:], alone, atol=1e-5)


def test_prefix_lm_attends_both_ways_over_the_prefix_only():
    model = tiny_decoder()
    x = tokens((1, 10))
    params = _decoder_params()
    prefix = jnp.asarray([[1] * 4 + [0] * 6])
    apply = jax.jit(lambda p, t, causal_attention: model.apply(
        {"params": p}, t, decoder_causal_attention=causal_attention))

    def logits(t, causal_attention):
        return np.asarray(apply(params, t, causal_attention))

    changed_in_prefix = x.at[0, 3].set((x[0, 3] + 1) % 64)
    # Position 0 sees position 3 under the prefix mask, not under the causal one.
    assert not np.allclose(logits(x, prefix)[0, 0], logits(changed_in_prefix, prefix)[0, 0])
    np.testing.assert_allclose(logits(x, None)[0, 0], logits(changed_in_prefix, None)[0, 0])
    changed_after = x.at[0, 7].set((x[0, 7] + 1) % 64)
    # Tokens after the prefix stay causal: position 5 does not see position 7.
    np.testing.assert_allclose(logits(x, prefix)[0, :7], logits(changed_after, prefix)[0, :7],
                               atol=1e-6)


def test_grouped_query_heads_must_divide():
    model = tiny_decoder(num_kv_heads=3)
    with pytest.raises(ValueError, match="num_heads=4 is not a multiple of num_kv_heads=3"):
        model.init(jax.random.key(0), tokens())


def tiny_encoder(**overrides):
    from t5x_like.models import encoder

    settings = dict(vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=48, num_layers=2,
                    max_length=32)
    settings.update(overrides)
    return encoder.EncoderOnly(config_lib.model_spec_of(dict(**settings, family="encoder")))


def test_span_boundaries_are_the_tokens_around_each_span():
    from t5x_like.models.encoder import span_boundaries

    mask = jnp.asarray([[0, 0, 1, 1, 1, 0, 1, 0], [1, 1, 0, 0, 0, 0, 0, 1]], bool)
    left, right, offset = (np.asarray(a) for a in span_boundaries(mask))
    np.testing.assert_array_equal(left[0, 2:5], [1, 1, 1])
    np.testing.assert_array_equal(right[0, 2:5], [5, 5, 5])
    np.testing.assert_array_equal(offset[0], [0, 0, 0, 1, 2, 0, 0, 0])
    assert (left[0, 6], right[0, 6]) == (5, 7)
    np.testing.assert_array_equal(left[1, :2], [0, 0])    # span at the left edge
    np.testing.assert_array_equal(right[1, :2], [2, 2])
    assert (left[1, 7], right[1, 7]) == (6, 7)             # span at the right edge


def test_span_boundary_head_adds_its_loss_to_masked_lm():
    from conftest import structure_loss

    model = tiny_encoder(span_boundary_head=True, next_sentence_head=False)
    x = tokens((2, 12))
    params = drawn_params(model, x)
    assert "span_boundary" in params
    weights = np.zeros((2, 12), np.float32)
    weights[:, 3:6] = 1
    batch = {"encoder_input_tokens": x, "encoder_target_tokens": x, "encoder_loss_weights": weights}
    loss, metrics = jax.jit(structure_loss("encoder", model))(params, batch)
    np.testing.assert_allclose(loss, metrics["mlm_loss"] + metrics["sbo_loss"], rtol=1e-6)
    assert abs(float(metrics["sbo_loss"]) - np.log(64)) < 1.5


def test_encoder_packed_rows_scan_and_local_attention():
    loop = tiny_encoder()
    a, b = tokens((1, 7), seed=1), tokens((1, 5), seed=2)
    params = drawn_params(loop, a)
    packed = jnp.concatenate([a, b], axis=1)
    scanned = tiny_encoder(scan_layers=True)
    local = tiny_encoder(attention_window=2, num_layers=1)
    changed = packed.at[0, 5].set((packed[0, 5] + 1) % 64)

    def run(p, stacked, packed, b, changed):
        def logits(model, params, t, **features):
            return model.apply({"params": params}, t, **features)["mlm_logits"]
        return dict(
            packed=logits(loop, p, packed, segment_ids=jnp.asarray([[1] * 7 + [2] * 5]),
                          positions=jnp.asarray([list(range(7)) + list(range(5))])),
            alone=logits(loop, p, b), whole=logits(loop, p, packed),
            scanned=logits(scanned, stacked, packed),
            local=logits(local, p, packed)[0, 0], local_changed=logits(local, p, changed)[0, 0])
    out = jax.jit(run)(params, stacking.stack_layer_params(params), packed, b, changed)
    np.testing.assert_allclose(out["packed"][:, 7:], out["alone"], atol=1e-5)
    np.testing.assert_allclose(out["scanned"], out["whole"], atol=1e-5)
    # One layer, window 2: the first token does not see the sixth.
    np.testing.assert_allclose(out["local"], out["local_changed"], atol=1e-6)


@pytest.mark.slow
def test_t5_packed_rows_give_the_logits_of_separate_rows():
    from t5x_like.models import t5

    model = t5.EncoderDecoder(config_lib.model_spec_of(dict(
        vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=48, num_encoder_layers=2,
        num_decoder_layers=2, family="encoder_decoder")))
    (ea, da), (eb, db) = [(tokens((1, n), seed=s), tokens((1, m), seed=s + 10))
                          for n, m, s in ((6, 4, 1), (5, 3, 2))]
    shift = lambda t: jnp.concatenate([jnp.zeros((1, 1), jnp.int32), t[:, :-1]], axis=1)  # noqa: E731
    params = drawn_params(model, ea, shift(da), da)
    packed_in, packed_targets = jnp.concatenate([ea, eb], 1), jnp.concatenate([da, db], 1)

    def run(p, packed_in, packed_targets, eb, db):  # the packed row, then b alone
        apply = functools.partial(model.apply, {"params": p})
        return (apply(packed_in, jnp.concatenate([shift(da), shift(db)], 1), packed_targets,
                      encoder_segment_ids=jnp.asarray([[1] * 6 + [2] * 5]),
                      decoder_segment_ids=jnp.asarray([[1] * 4 + [2] * 3])),
                apply(eb, shift(db), db))
    out, alone = jax.jit(run)(params, packed_in, packed_targets, eb, db)
    np.testing.assert_allclose(out[:, 4:], alone, atol=1e-5)
    with pytest.raises(ValueError, match="need both encoder_segment_ids and decoder_segment_ids"):
        model.apply({"params": params}, ea, shift(da), da, encoder_segment_ids=jnp.ones((1, 6)))


@pytest.mark.parametrize("family", ["encoder_decoder", "bart", "decoder", "encoder"])
def test_bfloat16_compute_keeps_float32_parameters_and_logits(family):
    from t5x_like import config_lib, models

    def build(dtype):
        cfg = config_lib.model_defaults(family)
        sizes = dict(vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=48, dtype=dtype)
        sizes.update({"num_layers": 2, "max_length": 16} if "num_layers" in cfg
                     else {"num_encoder_layers": 1, "num_decoder_layers": 1})
        if "max_length" in cfg:
            sizes["max_length"] = 16
        cfg.update(sizes)
        return structures.build_model(cfg)

    f32, bf16 = build("float32"), build("bfloat16")
    inputs = tuple(jnp.asarray(np.random.default_rng(0).integers(3, 64, size=x.shape), jnp.int32)
                   for x in models.example_inputs(f32, {}, batch_size=2))
    params = drawn_params(bf16, *inputs)
    assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype("float32")}
    logits = lambda out: out["mlm_logits"] if isinstance(out, dict) else out  # noqa: E731
    low, full = jax.jit(lambda p, *xs: tuple(logits(m.apply({"params": p}, *xs))
                                             for m in (bf16, f32)))(params, *inputs)
    assert low.dtype == jnp.float32
    assert np.abs(np.asarray(low) - np.asarray(full)).max() < 0.1 * np.abs(np.asarray(full)).max()
    assert not np.array_equal(np.asarray(low), np.asarray(full))  # bf16 really was used


def test_gradient_boundaries_change_no_gradient_and_stay_in_the_compiled_step():
    """The boundaries are there for XLA:CPU's fusion; they must be exact identities, and
    the conditional that makes them work must survive into the program."""
    from t5x_like.models import layers

    x = tokens()
    model = tiny_decoder(position_embedding="learned", num_kv_heads=0)
    params = drawn_params(model, x)

    def loss(p):
        return jnp.mean(jnp.square(model.apply({"params": p}, x)))

    dense_layers = sum(1 for path, _ in jax.tree_util.tree_leaves_with_path(params)
                       if path[-1].key == "kernel")
    grads = {}
    for enabled in (True, False):
        with layers.gradient_boundaries(enabled):
            lowered = jax.jit(jax.grad(loss)).lower(params)
            grads[enabled] = lowered.compile()(params)
        conditionals = lowered.as_text().count("stablehlo.case")
        # One per layer input (3), one between the sublayers of each block (3), and one
        # per dense layer for the input its kernel gradient reads (``layers.contract``).
        assert conditionals == (6 + dense_layers if enabled else 0)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 grads[True], grads[False])


@pytest.mark.parametrize("shared", [False, True])
def test_every_block_input_of_a_loop_or_a_shared_stack_passes_a_boundary(shared):
    """Of a loop or a shared (ALBERT-style) stack of 4 blocks: 4 conditionals."""
    from t5x_like.models import layers

    class Shared(nn.Module):
        @nn.compact
        def __call__(self, h):
            return stacking.run_stack(_Scale, None, 4, h, shared=shared)

    h = jnp.ones((2, 3))
    shared_params = Shared().init(jax.random.key(0), h)
    with layers.gradient_boundaries(True):
        text = jax.jit(jax.grad(lambda p, h: Shared().apply(p, h).sum(), argnums=(0, 1))
                       ).lower(shared_params, h).as_text()
    assert text.count("stablehlo.case") == 4


@pytest.mark.parametrize("x_shape, axes, kernel_shape", [
    ((3, 4, 5), (2,), (5, 6)),              # a dense layer
    ((3, 4, 5, 6), (1, 3), (4, 6, 7, 2)),   # several contracted and output dims
    ((3, 4, 5, 6), (3, 1), (6, 4, 7)),      # contracted dims out of order
    ((2, 5, 3), (0,), (2, 4)),              # a leading contracted dim
])
def test_contract_gradient_is_dot_generals(x_shape, axes, kernel_shape):
    from t5x_like.models import layers

    rng = np.random.default_rng(0)
    x, kernel = rng.standard_normal(x_shape), rng.standard_normal(kernel_shape)

    def grads(fn):
        return jax.grad(lambda x, k: jnp.sum(jnp.sin(fn(x, k))), argnums=(0, 1))(x, kernel)
    expected = grads(lambda x, k: jax.lax.dot_general(
        x, k, ((axes, tuple(range(len(axes)))), ((), ()))))
    with layers.gradient_boundaries(True):
        got = grads(lambda x, k: layers.contract(x, k, axes))
    for a, b in zip(got, expected, strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


class _Scale(nn.Module):
    config: object = None

    @nn.compact
    def __call__(self, h):
        return h * self.param("scale", nn.initializers.ones, (h.shape[-1],))
