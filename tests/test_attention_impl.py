"""Every attention implementation against the reference, on masks of every kind.

The Pallas splash and flash kernels run in interpret mode on CPU; the cuDNN path's call is
checked through ``jax.nn.dot_product_attention``'s XLA implementation (the same
arguments, so the mask translation is what is tested)."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import drawn_params
from jax.experimental.pallas import tpu as pltpu

from t5x_like import config_lib
from t5x_like.models import attention, encoder
from t5x_like.system import traced_platform

BATCH, LENGTH, HEADS, KV_HEADS, HEAD_DIM = 2, 40, 4, 2, 8
SCALE = 0.35


def qkv(length=LENGTH, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, seed=0):
    rng = np.random.default_rng(seed)
    make = lambda h: jnp.asarray(rng.normal(size=(BATCH, length, h, head_dim)), jnp.float32)  # noqa: E731
    return make(heads), make(kv_heads), make(kv_heads)


def masks(length=LENGTH):
    """One of each: padding, packed segments, causal, prefix LM, windows, globals, bias."""
    positions = np.arange(length)[None]
    valid = jnp.asarray(positions < np.array([[length], [length * 3 // 4]]))
    segments = jnp.asarray(np.where(positions < length * 2 // 5, 1, 2) * np.ones((BATCH, 1), int))
    prefix = jnp.asarray(positions < np.array([[length // 4], [length // 2]]))
    global_tokens = jnp.zeros((BATCH, length), bool).at[:, 0].set(True).at[1, length // 2].set(True)
    bias = jnp.asarray(np.random.default_rng(1).normal(size=(1, HEADS, length, length)),
                       jnp.float32)
    make = attention.self_attention_mask
    return {
        "padding": make(valid),
        "packed": make(valid, segments),
        "causal": make(valid, causal=True),
        "causal_packed": make(valid, segments, causal=True),
        "prefix_lm": make(valid, prefix=prefix),
        "window": make(valid, window=5),
        "window_packed": make(valid, segments, window=6),
        "causal_window": make(valid, segments, causal=True, window=7),
        "prefix_window": make(valid, prefix=prefix, window=7),
        "global_window": make(valid, segments, window=5, global_tokens=global_tokens,
                              max_global_tokens=3),
        "position_bias": make(valid, segments, position_bias=bias),
    }


def real_rows(mask):
    return np.asarray(mask.query_segment_ids > 0)


def outputs_and_gradients(fn, q, k, v, mask, *more):
    """The output at real rows, and the gradients of a fixed random projection of it (of
    ``q``, ``k``, ``v`` and ``more``, further arguments of ``fn``: a position bias)."""
    weights = jnp.asarray(np.random.default_rng(2).normal(size=q.shape), jnp.float32)
    rows = jnp.asarray(real_rows(mask))[:, :, None, None]
    loss = lambda *args: jnp.sum(jnp.where(rows, fn(*args) * weights, 0))  # noqa: E731
    argnums = tuple(range(3 + len(more)))
    return jax.jit(lambda *args: (fn(*args), jax.grad(loss, argnums=argnums)(*args)))(
        q, k, v, *more)


def assert_same(name, got, want, mask, atol=2e-5):
    (out, grads), (ref_out, ref_grads) = got, want
    rows = real_rows(mask)
    np.testing.assert_allclose(np.asarray(out)[rows], np.asarray(ref_out)[rows], atol=atol,
                               err_msg=f"{name}: outputs")
    for which, a, b in zip(("q", "k", "v", "bias")[:len(grads)], grads, ref_grads, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol,
                                   err_msg=f"{name}: d{which}")


def reference(mask):
    return lambda q, k, v: attention.reference_attention(q, k, v, mask, scale=SCALE)


@pytest.mark.parametrize("name", [n for n in masks() if "window" in n])
def test_chunked_attention_equals_the_dense_reference(name):
    mask = masks()[name]
    q, k, v = qkv()
    chunked = lambda q, k, v: attention.chunked_attention(q, k, v, mask, scale=SCALE)  # noqa: E731
    assert_same(name, outputs_and_gradients(chunked, q, k, v, mask),
                outputs_and_gradients(reference(mask), q, k, v, mask), mask)


@pytest.mark.parametrize("name", [n for n in masks() if n != "global_window"])
def test_cudnn_call_expresses_the_same_mask(name):
    mask = masks()[name]
    q, k, v = qkv()
    call = lambda q, k, v: attention.cudnn_attention(  # noqa: E731
        q, k, v, mask, scale=SCALE, implementation="xla")
    assert_same(name, outputs_and_gradients(call, q, k, v, mask),
                outputs_and_gradients(reference(mask), q, k, v, mask), mask)


@pytest.mark.parametrize("name", ["packed", "causal_packed", "window_packed", "causal_window"])
def test_splash_kernel_in_interpret_mode_equals_the_reference(name):
    mask = masks(128)[name]
    q, k, v = qkv(length=128, heads=2, kv_heads=1)
    splash = lambda q, k, v: attention.splash_attention(  # noqa: E731
        q, k, v, mask, scale=SCALE, interpret=True)
    assert_same(name, outputs_and_gradients(splash, q, k, v, mask),
                outputs_and_gradients(reference(mask), q, k, v, mask), mask, atol=5e-5)


def test_global_tokens_see_and_are_seen_by_all_and_local_ones_only_the_window():
    length, window = 32, 3
    valid = jnp.ones((1, length), bool)
    global_tokens = jnp.zeros((1, length), bool).at[0, [0, 20]].set(True)
    allowed = np.asarray(attention.dense_allowed(attention.self_attention_mask(
        valid, window=window, global_tokens=global_tokens, max_global_tokens=2)))[0, 0]
    is_global = np.asarray(global_tokens[0])
    offset = np.abs(np.arange(length)[:, None] - np.arange(length)[None])
    # Every query sees the global keys; local keys only within the window.
    assert allowed[:, is_global].all()
    local_keys = ~is_global
    np.testing.assert_array_equal(allowed[:, local_keys], (offset < window)[:, local_keys])
    # The global rows (through the global projections) see every key.
    q, k, v = qkv(length=length)
    q, k, v = q[:1], k[:1], v[:1]
    mask = attention.self_attention_mask(valid, window=window, global_tokens=global_tokens,
                                         max_global_tokens=2)

    def row_output(v):
        return attention.global_query_attention(q, k, v, mask, scale=SCALE, chunked=True)
    jacobian = jax.jit(jax.jacobian(lambda v: row_output(v)[0, :, 0, 0]))(v)  # [length, 1, length, kv, d]
    depends = np.asarray(jnp.abs(jacobian).sum(axis=(1, 3, 4)) > 0)  # [query row, key]
    assert depends[0].all() and depends[20].all()
    assert not depends[np.flatnonzero(~is_global)].any()  # only global rows are filled


def test_chunked_global_rows_equal_the_dense_ones():
    mask = masks()["global_window"]
    q, k, v = qkv()
    dense, chunked = jax.jit(lambda q, k, v: tuple(attention.global_query_attention(
        q, k, v, mask, scale=SCALE, chunked=chunked) for chunked in (False, True)))(q, k, v)
    np.testing.assert_allclose(np.asarray(chunked), np.asarray(dense), atol=2e-6)


def test_backward_local_attention_never_sees_beyond_the_window():
    mask = masks()["window"]
    q, k, v = qkv()
    jacobian = jax.jit(jax.jacobian(
        lambda v: attention.chunked_attention(q, k, v, mask)[0, :, 0, 0]))(v)
    depends = np.asarray(jnp.abs(jacobian[:, 0]).sum(axis=(2, 3)) > 0)  # [query, key]
    offset = np.abs(np.arange(LENGTH)[:, None] - np.arange(LENGTH)[None])
    assert not depends[offset >= 5].any()
    assert depends[offset < 5].all()


def cross_mask(q_len, k_len):
    """Decoder positions over encoder keys, both padded, packed in two segments."""
    def ids(length, valid):
        positions = np.arange(length)[None]
        return jnp.asarray(np.where(positions < length // 2, 1, 2) *
                           (positions < np.array([[length], [valid]])))
    return attention.AttentionMask(ids(q_len, q_len * 3 // 4), ids(k_len, k_len * 3 // 4))


def flash_cases():
    """T5's cases for the TPU flash kernel: a position bias on its own, with packing,
    causal, and short queries over 128 keys (T5's decoder over its encoder)."""
    all_masks = masks(128)
    bias = all_masks["position_bias"].position_bias
    return {
        "position_bias": all_masks["position_bias"],
        "causal_position_bias": all_masks["causal_packed"].replace(position_bias=bias),
        "short_queries": cross_mask(24, 128),
        "short_queries_bias": cross_mask(24, 128).replace(
            position_bias=bias[:, :, :24, :]),
    }


@pytest.mark.parametrize("name", list(flash_cases()))
def test_flash_kernel_in_interpret_mode_equals_the_reference(name):
    """Outputs and the gradients of queries, keys, values and (where the mask has one)
    the position bias: the flash kernel returns the bias's gradient, summed over the
    batch it was broadcast to."""
    mask = flash_cases()[name]
    q_len = mask.query_segment_ids.shape[1]
    q, _, _ = qkv(length=q_len, heads=HEADS, kv_heads=KV_HEADS)
    _, k, v = qkv(length=128, heads=HEADS, kv_heads=KV_HEADS, seed=3)
    bias = () if mask.position_bias is None else (mask.position_bias,)

    def attend(implementation):
        def fn(q, k, v, *bias):
            given = mask.replace(position_bias=bias[0]) if bias else mask
            return implementation(q, k, v, given, scale=SCALE)
        return fn
    with pltpu.force_tpu_interpret_mode():
        got = outputs_and_gradients(attend(attention.flash_attention), q, k, v, mask, *bias)
    want = outputs_and_gradients(attend(attention.reference_attention), q, k, v, mask, *bias)
    assert_same(name, got, want, mask, atol=5e-5)
    if bias:  # the bias does receive a gradient
        assert float(jnp.abs(want[1][3]).max()) > 1e-3


def test_auto_and_fallbacks_are_chosen_and_explained():
    all_masks = masks(256)
    choose = lambda name, platform, impl="auto", dtype=jnp.bfloat16, **kw: (  # noqa: E731
        attention.choose_implementation(impl, all_masks[name], platform=platform, dtype=dtype,
                                        head_dim=64, **kw))
    assert choose("packed", "cpu") == ("xla", "no fused kernel on cpu")
    assert choose("packed", "tpu")[0] == "flash"
    assert choose("causal_window", "tpu")[0] == "flash"
    assert choose("position_bias", "tpu", "flash")[0] == "flash"  # the flash kernel's bias
    impl, why = choose("position_bias", "tpu")  # ...which auto leaves to a request
    assert impl == "xla" and "opt-in" in why
    windowed_bias = all_masks["window"].replace(
        position_bias=all_masks["position_bias"].position_bias)
    impl, why = attention.choose_implementation("flash", windowed_bias, platform="tpu",
                                                dtype=jnp.bfloat16, head_dim=64)
    assert impl == "xla" and "no window" in why
    impl, why = choose("prefix_lm", "tpu", "flash")
    assert impl == "xla" and "prefix" in why
    assert choose("position_bias", "gpu")[0] == "flash"  # cuDNN takes a bias
    assert choose("causal_window", "gpu")[0] == "flash"
    impl, why = choose("window", "gpu", "flash")
    assert impl == "xla" and "backwards" in why
    impl, why = choose("packed", "gpu", dtype=jnp.float32)
    assert impl == "xla" and "bfloat16" in why
    impl, why = choose("packed", "tpu", dropout=True)
    assert impl == "xla" and "dropout" in why
    # Global tokens: no kernel mask for them, so the linear-memory blocks.
    assert choose("global_window", "tpu")[0] == "chunked"
    assert choose("global_window", "cpu", "flash")[0] == "chunked"
    assert choose("window", "cpu")[0] == "chunked"  # 256 tokens = 51 windows of 5
    impl, why = choose("packed", "cpu", "chunked")
    assert impl == "xla" and "no attention window" in why
    with pytest.raises(ValueError, match="attention_impl='fused'"):
        choose("packed", "cpu", "fused")


def test_the_tpu_kernels_refuse_keys_off_their_block():
    choose = lambda mask: attention.choose_implementation(  # noqa: E731
        "flash", mask, platform="tpu", dtype=jnp.bfloat16, head_dim=64)
    impl, why = choose(masks(40)["packed"])
    assert impl == "xla" and "keys are not a multiple of 128" in why
    impl, why = choose(cross_mask(200, 256))
    assert impl == "xla" and "neither a multiple of 128 nor shorter" in why
    assert choose(cross_mask(114, 512))[0] == "flash"  # T5's decoder over its encoder




def tiny_longformer(**overrides):
    settings = dict(vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_layers=2,
                    max_length=64, next_sentence_head=False, attention_window=4,
                    global_attention=True, max_global_tokens=4)
    settings.update(overrides)
    return encoder.EncoderOnly(config_lib.model_spec_of(dict(**settings, family="encoder")))


def test_longformer_encoder_is_the_same_function_under_every_implementation():
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 64, size=(2, 48)))
    tokens = tokens.at[1, 40:].set(0)
    global_mask = jnp.zeros((2, 48), bool).at[:, 0].set(True).at[0, 7].set(True)
    model = tiny_longformer(num_layers=1)  # every layer attends alike: one shows it
    params = drawn_params(model, tokens)
    assert "query_global" in params["layers_0"]["attention"]

    def loss(params, model):
        out = model.apply({"params": params}, tokens, global_attention_mask=global_mask)
        real = (tokens > 0)[:, :, None]
        return jnp.sum(jnp.where(real, out["mlm_logits"], 0) ** 2), out["mlm_logits"]

    def every_implementation(params):  # one program: each implementation's logits and grads
        results = {}
        for impl in ("xla", "chunked"):
            model = tiny_longformer(attention_impl=impl, num_layers=1)
            (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(params, model)
            results[impl] = (logits, grads)
        return results
    results = jax.jit(every_implementation)(params)
    real = np.asarray(tokens > 0)
    np.testing.assert_allclose(np.asarray(results["chunked"][0])[real],
                               np.asarray(results["xla"][0])[real], atol=1e-4)
    for a, b in zip(jax.tree.leaves(results["chunked"][1]), jax.tree.leaves(results["xla"][1]), strict=False):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-3, atol=2e-4)


def compiled_temp_bytes(fn, *args):
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_chunked_memory_grows_linearly_where_the_dense_path_grows_quadratically():
    def temp_bytes(length, impl):
        q, k, v = (jax.ShapeDtypeStruct((1, length, 2, 16), jnp.float32) for _ in range(3))
        valid = jax.ShapeDtypeStruct((1, length), jnp.bool_)

        def run(q, k, v, valid):
            mask = attention.self_attention_mask(valid, window=64)
            fn = attention.chunked_attention if impl == "chunked" else (
                attention.reference_attention)
            return fn(q, k, v, mask, scale=SCALE)
        return compiled_temp_bytes(run, q, k, v, valid)
    dense = [temp_bytes(n, "xla") for n in (1024, 2048)]
    chunked = [temp_bytes(n, "chunked") for n in (1024, 2048)]
    assert dense[1] / dense[0] > 3.5     # L²
    assert chunked[1] / chunked[0] < 2.5  # L
    assert chunked[1] * 4 < dense[1]


def test_a_model_config_names_an_unknown_implementation_early():
    from t5x_like import config_lib, errors
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("encoder")
    config.model.attention_impl = "fused"
    with pytest.raises(errors.ConfigError, match=r"model\.attention\.impl' is 'fused'; choose one of"):
        config_lib.validate(config)


def test_dropout_keeps_the_plain_path_and_is_applied():
    model = tiny_longformer(global_attention=False, attention_window=0, dropout_rate=0.5,
                            attention_impl="flash")
    tokens = jnp.ones((1, 8), jnp.int32)
    params = drawn_params(model, tokens)
    a, b = jax.jit(lambda p, t: tuple(model.apply(
        {"params": p}, t, deterministic=False,
        rngs={"dropout": jax.random.PRNGKey(seed)})["hidden"] for seed in (1, 2)))(params, tokens)
    assert not np.allclose(np.asarray(a), np.asarray(b))


def test_a_task_global_mask_reaches_the_longformer_through_the_converter():
    from t5x_like.data import feature_converters
    converter = feature_converters.EncoderFeatureConverter(pack=True, global_attention=True)
    question = {"inputs": np.arange(1, 9), "targets": np.arange(1, 9),
                "loss_weights": np.ones(8, np.float32),
                "global_attention_mask": np.array([1, 1, 1, 0, 0, 0, 0, 0])}
    plain = {"inputs": np.arange(1, 6), "targets": np.arange(1, 6),
             "loss_weights": np.ones(5, np.float32)}
    [row] = converter([question, plain], {"inputs": 16})
    # The task's mask where it gave one; the example's first token where it did not.
    np.testing.assert_array_equal(row["encoder_global_attention_mask"][:13],
                                  [1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0])
    assert "encoder_global_attention_mask" not in feature_converters.EncoderFeatureConverter()(
        plain, {"inputs": 16})

    model = tiny_longformer()
    tokens = jnp.asarray(row["encoder_input_tokens"])[None]
    params = drawn_params(model, tokens)
    run = lambda p, mask: model.apply(  # noqa: E731
        {"params": p}, tokens, segment_ids=jnp.asarray(row["encoder_segment_ids"])[None],
        positions=jnp.asarray(row["encoder_positions"])[None],
        global_attention_mask=mask)["hidden"]
    given, default = jax.jit(lambda p, mask: (run(p, mask), run(p, None)))(
        params, jnp.asarray(row["encoder_global_attention_mask"])[None])
    assert not np.allclose(np.asarray(given), np.asarray(default))  # questions are global


def test_a_fallback_to_the_plain_path_is_reported(caplog):
    model = tiny_longformer(global_attention=False, attention_window=0, attention_impl="chunked")
    tokens = jnp.ones((1, 8), jnp.int32)
    attention._report.cache_clear()  # each reason is logged once per process
    with caplog.at_level("WARNING", logger="t5x_like.models.attention"):  # when traced
        jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens))
    assert "attention: xla (attention_impl=chunked): chunked attention unavailable: " \
        "no attention window" in caplog.text


def test_t5_on_an_accelerator_passes_the_bias_as_two_factors_with_the_same_values():
    from t5x_like.models import t5
    config = config_lib.model_spec_of(dict(vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=64,
                         num_encoder_layers=2, num_decoder_layers=2, attention_impl="xla", family="encoder_decoder"))
    model = t5.EncoderDecoder(config)
    rng = np.random.default_rng(0)
    inputs = jnp.asarray(rng.integers(1, 64, (2, 16)) * (np.arange(16) < [[16], [11]]))
    targets = jnp.asarray(rng.integers(1, 64, (2, 6)))
    decoder_inputs = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))
    params = {"params": drawn_params(model, inputs, decoder_inputs, targets)}

    def loss(params):
        logits = model.apply(params, inputs, decoder_inputs, targets)
        return jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(targets, 64))

    position_bias = jnp.zeros((1, 4, 16, 16))
    mask = attention.self_attention_mask(inputs > 0, position_bias=position_bias)
    for platform in ("cpu", "gpu"):
        with traced_platform.target_platform(platform):
            handed = attention.for_every_layer(mask, config, deterministic=True)
        assert isinstance(handed, attention.SplitBias) == (platform == "gpu")

    def on_each_platform(params):  # one program: each half traced for its platform
        results = {}
        for platform in ("cpu", "gpu"):
            with traced_platform.target_platform(platform):
                results[platform] = jax.value_and_grad(loss)(params)
        return results
    results = jax.jit(on_each_platform)(params)
    (value_cpu, grads_cpu), (value_gpu, grads_gpu) = results["cpu"], results["gpu"]
    np.testing.assert_allclose(value_gpu, value_cpu, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(grads_gpu), jax.tree.leaves(grads_cpu), strict=False):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
