"""The continuous-batching engine over a paged cache (``t5x_like.generation``): tokens
equal the static batch's (``decoding.generate_padded``, each row as it decodes alone),
requests come and go between steps, prompts share pages, each request samples from its
own seed, and the page pool hands out, shares, evicts and takes back pages."""

import dataclasses
import threading

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like import config_lib
from t5x_like.generation import engine as engine_lib
from t5x_like.generation.engine import Engine, Request, Stats
from t5x_like.generation.pages import OutOfPages, PagePool
from t5x_like.models import decoder, decoding

GPT = dict(vocab_size=40, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_layers=2,
           max_length=48)
# Rotary positions, grouped-query attention, a sliding window on every other layer.
MODERN = dict(GPT, norm="rmsnorm", position_embedding="rotary", num_kv_heads=1, use_bias=False,
              mlp_activations=("silu", "linear"), tie_embeddings=False, sliding_window=5,
              layer_types=("sliding_attention", "full_attention"))
MAX_LENGTH = 48


def tiny(settings):
    model = decoder.DecoderOnly(config_lib.model_spec_of(dict(**settings, family="decoder")))
    return model, nn.unbox(model.init(jax.random.key(2), jnp.ones((1, 4), jnp.int32))["params"])


def mixed_requests():
    """Prompts of 1 to 20 tokens and 3 to 20 new tokens; two repeat a prompt and one
    starts with another's first page (8 tokens), so pages are shared."""
    rng = np.random.default_rng(0)
    prompts = [tuple(int(t) for t in rng.integers(3, 40, size=n))
               for n in (1, 3, 9, 17, 20, 5, 18, 17)]
    prompts[2] = prompts[3][:8] + (5,)
    prompts[7] = prompts[3]
    return [Request(p, n) for p, n in zip(prompts, (6, 10, 3, 12, 4, 20, 7, 7), strict=True)]


def static_batch(model, params, requests):
    """Each request's greedy tokens from one ``generate_padded`` batch of all of them."""
    width = max(len(r.prompt) for r in requests)
    rows = np.zeros((len(requests), width), np.int32)
    for i, r in enumerate(requests):
        rows[i, :len(r.prompt)] = r.prompt
    out = decoding.generate_padded(model, params, jnp.asarray(rows),
                                   jnp.asarray([len(r.prompt) for r in requests]),
                                   max_new_tokens=max(r.max_tokens for r in requests), eos_id=-1)
    return [list(np.asarray(row)[:r.max_tokens]) for row, r in zip(out, requests, strict=True)]


def fresh(engine, pages=None):
    """``engine`` with its counts at zero and an empty page pool (of ``pages``, at most the
    cache's): no prompt page of an earlier test is found."""
    engine.stats = Stats()
    engine.pool = PagePool(pages or engine.cache_pages, engine.page_size)
    return engine


def serving(settings):
    """The model, its params, the mixed requests, their static-batch tokens, and an
    engine of 3 slots over pages of 8 (one per model: its programs compile once)."""
    model, params = tiny(settings)
    requests = mixed_requests()
    return (model, params, requests, static_batch(model, params, requests),
            Engine(model, params, max_length=MAX_LENGTH, slots=3, page_size=8))


@pytest.fixture(scope="module", params=[GPT, MODERN], ids=["gpt2", "modern"])
def served(request):
    return serving(request.param)


def test_greedy_tokens_are_the_static_batchs_with_slots_coming_and_going(served):
    *_, requests, expected, engine = served
    got = fresh(engine).run(requests)
    assert [g.tokens for g in got] == expected
    assert all(g.finish_reason == "length" for g in got)
    # Windows of up to 8 steps a call, each token fed back on the device.
    assert engine.stats.calls < engine.stats.steps / 2
    # The repeated prompt and the one sharing a first page read 8 + 16 positions.
    assert engine.stats.shared_tokens == 8 + 16
    assert engine.pool.free == engine.pool.pages - 1  # every page back


def test_one_step_a_call_gives_the_same_tokens(served):
    *_, requests, expected, engine = served
    engine.steps_per_call = 1
    try:
        assert [g.tokens for g in fresh(engine).run(requests)] == expected
    finally:
        engine.steps_per_call = 8
    # Eight requests through three slots: requests were admitted while others ran.
    assert engine.stats.calls == engine.stats.steps
    assert engine.stats.steps < sum(r.max_tokens for r in requests) / 3 + 8


def test_a_prefill_projects_only_each_rows_last_position(served):
    """Only the last prompt position's logits choose a token: the prefill runs the output
    layer on it alone, never on every padded position of the rows."""
    *_, engine = served
    count, width, vocab = 2, 16, engine.model.config.vocab_size
    row = np.zeros((count, width), np.int32)
    text = engine._prefill.lower(
        engine._params, engine.cache, row, row, np.ones((count, 2), np.int32),
        np.zeros((count,), np.int32), engine._settings([], [], count)).as_text()
    assert f"tensor<{count}x1x{vocab}xf32>" in text  # the last positions, projected
    assert f"x{width}x{vocab}x" not in text


def test_a_request_sharing_pages_decodes_as_it_does_alone(served):
    *_, requests, expected, engine = served
    group = fresh(engine).run([requests[3]] * 4)
    assert [g.tokens for g in group] == [expected[3]] * 4
    # One prefill of the 17-token prompt, then three that read its two full pages.
    assert engine.stats.prefill_tokens == 17 + 3 * 1
    assert engine.stats.shared_tokens == 3 * 16


def test_a_pool_smaller_than_the_work_makes_requests_wait(served):
    *_, requests, expected, engine = served
    # 7 pages of 8: the 20-token prompt with 4 new tokens needs 3, the longest request 4.
    assert [g.tokens for g in fresh(engine, pages=7).run(requests)] == expected
    with pytest.raises(ValueError, match="more pages than the pool"):
        fresh(engine, pages=3).check(Request(tuple(range(3, 20)), 10))


def test_a_short_request_does_not_wait_for_the_long_one_beside_it(served):
    engine = fresh(served[-1])
    order = []

    def watch(name):
        def on_token(token, logprob):
            order.append(name)
            return True
        return on_token
    handles = [engine.submit(Request((5, 6, 7), n), watch(name))
               for name, n in (("long", 30), ("short", 2), ("other", 2), ("next", 2))]
    while engine.busy():
        engine.step()
    [h.wait() for h in handles]
    # The fourth request took a short one's slot while the long one still decoded.
    assert order.index("next") < len(order) - 1 - order[::-1].index("long")
    assert engine.stats.steps == 30 - 1


def test_sampling_follows_each_requests_seed_not_its_neighbours(served):
    *_, requests, expected, engine = served
    fresh(engine)
    sampled = Request(requests[1].prompt, 12, temperature=1.3, top_k=20, top_p=0.9, seed=7)
    alone = engine.run([sampled])[0].tokens
    among = engine.run([requests[0], requests[4], sampled, requests[5], sampled])
    assert among[2].tokens == alone and among[4].tokens == alone
    assert [among[i].tokens for i in (0, 1, 3)] == [expected[i] for i in (0, 4, 5)]
    other_seed = engine.run([Request(sampled.prompt, 12, temperature=1.3, seed=8)])[0].tokens
    assert other_seed != alone
    top_1 = engine.run([Request(sampled.prompt, 10, temperature=2.0, top_k=1, seed=3)])[0]
    assert top_1.tokens == expected[1]


def test_log_probabilities_are_the_models_and_stop_ids_end_a_request(served):
    model, params, requests, expected, engine = served
    fresh(engine)
    request = dataclasses.replace(requests[5], logprobs=True)
    got = engine.run([request])[0]
    full = jnp.asarray([list(request.prompt) + got.tokens])
    logp = jax.nn.log_softmax(model.apply({"params": params}, full[:, :-1]))[0]
    first = len(request.prompt) - 1
    want = [float(logp[first + i, t]) for i, t in enumerate(got.tokens)]
    np.testing.assert_allclose(got.logprobs, want, atol=1e-5)
    assert engine.run([requests[5]])[0].logprobs == []  # not asked: no pass over the vocabulary
    stop = expected[5][4]
    ended = engine.run([Request(request.prompt, 20, stop_ids=(stop,))])[0]
    cut = expected[5].index(stop) + 1
    assert ended.tokens == expected[5][:cut] and ended.finish_reason == "stop"


def test_requests_from_many_threads_on_the_background_loop(served):
    *_, requests, expected, engine = served
    fresh(engine).start()
    results, streamed = {}, {i: [] for i in range(len(requests))}

    def client(i):
        handle = engine.submit(requests[i],
                               lambda token, logprob: streamed[i].append(token) is None)
        results[i] = handle.wait(timeout=120).tokens
    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    engine.stop()
    assert [results[i] for i in range(len(requests))] == expected
    assert [streamed[i] for i in range(len(requests))] == expected
    assert not engine.busy()


def test_a_failing_step_fails_its_requests_and_the_loop_serves_on(served, monkeypatch):
    *_, requests, expected, engine = served
    original, calls = engine._decode, []

    def fails_once(*args):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("device lost")
        return original(*args)
    monkeypatch.setattr(engine, "_decode", fails_once)
    fresh(engine).start()
    try:
        with pytest.raises(RuntimeError, match="device lost"):
            engine.submit(requests[1]).wait(timeout=120)
        assert engine.submit(requests[1]).wait(timeout=120).tokens == expected[1]
        assert engine.pool.free == engine.pool.pages - 1
    finally:
        engine.stop()


def test_requests_the_engine_cannot_hold_are_refused_before_they_run(served):
    engine = served[-1]
    with pytest.raises(ValueError, match="exceeds the engine's max_length 48"):
        engine.submit(Request(tuple(range(3, 40)), 20))
    with pytest.raises(ValueError, match="at least one prompt token"):
        engine.submit(Request((), 3))
    assert engine.submit(Request((4,), 0)).wait().tokens == []
    model, params = served[:2]
    with pytest.raises(ValueError, match="steps_per_call=3: give a power of two"):
        Engine(model, params, max_length=MAX_LENGTH, steps_per_call=3)


def test_the_pool_shares_full_prompt_pages_and_evicts_the_oldest_released():
    pool = PagePool(pages=5, page_size=2)
    assert pool.free == 4
    a = pool.allocate(3)
    pool.index_prompt([1, 2, 3, 4, 5], a)  # pages of [1, 2] and [1, 2, 3, 4]
    assert pool.shared_prefix([1, 2, 3, 4, 9]) == a[:2]
    assert pool.shared_prefix([1, 2, 3, 4]) == a[:1]  # the last token is always run
    assert pool.shared_prefix([1, 7, 3, 4, 5]) == []
    pool.hold(a[:2])
    pool.release(a)
    assert pool.free == 1 + 1  # the unindexed page, and nothing held twice
    pool.release(a[:2])
    assert pool.free == 4 and pool.shared_prefix([1, 2, 3, 4, 9]) == a[:2]  # still found
    pool.allocate(3)  # the two free pages, then the prefix page released longest ago
    assert pool.shared_prefix([1, 2, 3, 4, 9]) == []
    with pytest.raises(OutOfPages):
        pool.allocate(2)
    with pytest.raises(RuntimeError, match="released more often"):
        pool.release([a[2], a[2]])


def test_rows_sample_under_their_own_filters():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]] * 3))
    from t5x_like.generation import sampling
    kept = sampling.filter_rows(logits, jnp.asarray([1, 0, 3]), jnp.asarray([1.0, 0.7, 0.9]))
    finite = np.asarray(kept > jnp.finfo(jnp.float32).min)
    assert finite.tolist() == [[True, False, False, False], [True, True, False, False],
                               [True, True, True, False]]
    assert engine_lib.bucket(9, 8, 64) == 16 and engine_lib.bucket(100, 8, 64) == 64


def test_int8_weights_decode_as_the_static_batch_does():
    """The engine runs the model ``infer --weights=int8`` runs (Qwix's int8 kernels):
    the same greedy tokens, and its decoding step reads the kernels in int8."""
    import qwix

    from t5x_like.models import example_inputs, quantization
    model, params = tiny(GPT)
    int8_model = quantization.with_int8_weights(model)
    abstract = jax.eval_shape(lambda: int8_model.init(jax.random.key(0),
                                                      *example_inputs(model)))["params"]
    int8_params = qwix.quantize_params(params, abstract)
    requests = mixed_requests()[:3]
    engine = Engine(int8_model, int8_params, max_length=MAX_LENGTH, slots=3, page_size=8)
    assert [g.tokens for g in engine.run(requests)] == static_batch(int8_model, int8_params,
                                                                    requests)
    step = engine._decode.lower(engine._params, engine.cache, *engine.step_inputs(), 1).compile()
    parameters = step.as_text().split("\n", 1)[0].split("->")[0]
    assert "s8[16,32]" in parameters and "s8[32,16]" in parameters  # the MLP's kernels


def test_on_a_tpu_a_step_reads_its_pages_with_the_paged_attention_kernel(monkeypatch):
    """On a TPU a decoding step attends with the Pallas paged-attention kernel, each row
    reading its own pages where they are (run here in the kernel's interpret mode): the
    logits of the step that gathers the rows' pages, up to the bfloat16 rounding of the
    interpreter's operands; a prompt's prefill still gathers."""
    from jax.experimental.pallas import tpu as pltpu

    from t5x_like.models import attention
    from t5x_like.system import traced_platform
    model, params = tiny(dict(GPT, head_dim=128, num_kv_heads=1))
    pool = decoding.init_page_pool(model, 9, 8)
    table = jnp.asarray([[1, 2], [3, 4]], jnp.int32)
    prompt = jnp.asarray(np.random.default_rng(0).integers(3, 40, size=(2, 11)), jnp.int32)
    _, pool = decoding.paged_forward(model, params, pool, prompt,
                                     jnp.broadcast_to(jnp.arange(11), (2, 11)), table, 8)
    step = jax.jit(lambda pool: decoding.paged_forward(
        model, params, pool, jnp.asarray([[7], [9]]), jnp.asarray([[11], [5]]), table, 8))
    gathered, _ = step(pool)
    calls = []
    original = attention.paged_attention

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)
    monkeypatch.setattr(attention, "paged_attention", spy)
    with traced_platform.target_platform("tpu"), pltpu.force_tpu_interpret_mode():
        read, _ = jax.jit(lambda pool: decoding.paged_forward(
            model, params, pool, jnp.asarray([[7], [9]]), jnp.asarray([[11], [5]]), table,
            8))(pool)
    assert calls == [(2, 1, 2, 128)] * 2  # both layers' steps, one token a row
    np.testing.assert_allclose(np.asarray(read), np.asarray(gathered), atol=2e-3)
    assert float(jnp.abs(gathered).max()) > 0.1  # logits that tell rows apart
