"""Context parallelism: rows' positions split over a ``context`` mesh axis.

Logits and gradients on (data 2, context 4) equal one device's, causal and
bidirectional, packed and unpacked, for the all-gather and the ring strategy; the
activations really are split; the load-balanced order gives every device as many
visible (query, key) pairs; a short run on a context mesh logs the losses of a data-
parallel one; meshes and models it cannot split are refused before anything compiles.
"""

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import check_mesh_on_8, drawn_params, set_keys

from t5x_like import config_lib, errors, models, structures, train
from t5x_like.engine import partitioning
from t5x_like.engine import trainer as trainer_lib
from t5x_like.models import context_parallel

BATCH, LENGTH = 4, 32
MESH = {"data": 2, "context": 4}


def _model(family, **settings):
    model_config = config_lib.model_defaults(family)
    model_config.update({**dict(vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=48,
                                num_layers=2, positions=dict(max_length=LENGTH)), **settings})
    return structures.build_model(model_config)


def _packed_rows():
    """Three examples a row (lengths 12, 8, 9) and 3 padding positions."""
    segments = np.repeat([1, 2, 3, 0], [12, 8, 9, 3])
    positions = np.concatenate([np.arange(n) for n in (12, 8, 9, 3)])
    return (np.tile(segments, (BATCH, 1)).astype(np.int32),
            np.tile(positions, (BATCH, 1)).astype(np.int32))


def _inputs(family, packed, prefix):
    tokens = np.random.default_rng(0).integers(1, 64, (BATCH, LENGTH)).astype(np.int32)
    features = {}
    segments, positions = _packed_rows()
    if family == "decoder":
        if packed:
            features.update(decoder_segment_ids=segments, decoder_positions=positions)
        if prefix:
            features["decoder_causal_attention"] = np.tile(np.arange(LENGTH) < 10,
                                                           (BATCH, 1)).astype(np.int32)
    elif packed:
        features["segment_ids"] = segments
    return tokens, features


CASES = {
    # name: (family, strategy, packed, prefix-LM, model settings)
    "decoder-all_gather": ("decoder", "all_gather", False, False, {}),
    "decoder-ring": ("decoder", "ring", False, False, {}),
    "decoder-ring-unbalanced": ("decoder", "ring", True, False, {}),
    "decoder-ring-packed-rotary-gqa": (
        "decoder", "ring", True, False,
        dict(positions=dict(kind="rotary", max_length=LENGTH), attention=dict(num_kv_heads=2))),
    "decoder-all_gather-packed-prefix_lm": ("decoder", "all_gather", True, True, {}),
    "decoder-ring-prefix_lm-window": ("decoder", "ring", False, True,
                                      dict(attention=dict(sliding_window=5))),
    "encoder-all_gather-packed": ("encoder", "all_gather", True, False, {}),
    "encoder-ring-packed": ("encoder", "ring", True, False, {}),
    "encoder-ring": ("encoder", "ring", False, False, {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_context_mesh_gives_one_devices_logits_and_gradients(case):
    family, strategy, packed, prefix, settings = CASES[case]
    balanced = not case.endswith("unbalanced")
    model = _model(family, **settings)
    tokens, features = _inputs(family, packed, prefix)
    params = drawn_params(model, *models.example_inputs(model, {}))

    def forward_and_grad(p, tokens, features):
        def loss(p):  # every output position and every parameter reach the gradient
            out = model.apply({"params": p}, tokens, **features)
            return sum(jnp.mean(jnp.sin(x)) for x in jax.tree.leaves(out)), out
        (_, out), grads = jax.value_and_grad(loss, has_aux=True)(p)
        return out, grads

    single = jax.jit(forward_and_grad)(params, tokens, features)

    mesh = partitioning.make_mesh(MESH)
    rules = partitioning.axis_rules("fsdp")
    shardings = partitioning.logical_shardings(trainer_lib.abstract_boxed_params(model, {}),
                                               mesh, rules)
    rows = partitioning.batch_sharding(mesh)
    args = (jax.device_put(params, shardings), jax.device_put(tokens, rows),
            jax.device_put(features, rows))
    with (jax.set_mesh(mesh), nn.logical_axis_rules(rules),
          context_parallel.context_settings(context_parallel.ContextSettings(strategy, balanced))):
        step = jax.jit(forward_and_grad).lower(*args).compile()  # read below, and run
        split = step(*args)
        compiled = step.as_text()
    for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(split), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=2e-6)
    # Each device computes its MLP on 2 rows x 8 positions, never on whole rows ...
    assert "f32[2,8,48]" in compiled and "f32[2,32,48]" not in compiled
    # ... and its keys reach the others by the strategy asked for.
    collective = "collective-permute" if strategy == "ring" else "all-gather"
    assert re.search(rf"= \S+ {collective}(-start)?\(", compiled), collective


def test_rows_the_axis_does_not_divide_are_scored_whole_on_every_device():
    """An evaluator's own lengths (a benchmark's choices) need not split over the axis:
    such rows take the plain path and still give one device's logits."""
    model = _model("decoder")
    tokens = np.random.default_rng(1).integers(1, 64, (BATCH, 30)).astype(np.int32)
    params = drawn_params(model, *models.example_inputs(model, {}))
    single = jax.jit(lambda p, t: model.apply({"params": p}, t))(params, tokens)
    mesh = partitioning.make_mesh(MESH)
    rules = partitioning.axis_rules("fsdp")
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        split = jax.jit(lambda p, t: model.apply({"params": p}, t))(params, tokens)
    np.testing.assert_allclose(np.asarray(split), np.asarray(single), rtol=1e-5, atol=2e-6)


def test_the_balanced_order_gives_each_device_an_early_and_a_late_piece():
    order = context_parallel.balanced_order(16, 2)
    np.testing.assert_array_equal(order, [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11])
    x = jnp.arange(2 * 48 * 3).reshape(2, 48, 3)
    balanced = context_parallel.balance(x, 4)
    np.testing.assert_array_equal(balanced[:, :, 0] // 3 % 48,
                                  np.tile(context_parallel.balanced_order(48, 4), (2, 1)))
    np.testing.assert_array_equal(context_parallel.unbalance(balanced, 4), x)


@pytest.mark.parametrize("context", [2, 4, 8])
def test_balanced_devices_see_equal_numbers_of_causal_pairs(context):
    """Under a causal mask the query at position p sees p + 1 keys: unbalanced, the last
    device does 2C - 1 times the first's work; balanced, every device the same."""
    length = 64 * context
    def work(order):
        return (order.reshape(context, -1) + 1).sum(axis=1)

    assert len(set(work(context_parallel.balanced_order(length, context)))) == 1
    plain = work(np.arange(length))
    assert plain[-1] / plain[0] > 2 * context - 2


def _metrics(workdir) -> list[dict]:
    return [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").open()]


def _decoder_run(**overrides):
    config = config_lib.load_config_file("configs/pretrain/gpt2_tiny.py")
    settings = {"task_feature_lengths": {"targets": 64}, "batch_size": 8, "num_train_steps": 2,
                "logging.every_steps": 1, "evals.held_out.every_steps": 0,
                "checkpoint.every_steps": 2, "model.num_layers": 2, "model.d_model": 64,
                "model.d_ff": 128, "model.num_heads": 2, **overrides}
    return set_keys(config, settings)


@pytest.fixture(scope="module")
def data_parallel_metrics(tmp_path_factory):
    """The two steps' records on (data 8): what both strategies are compared with."""
    workdir = tmp_path_factory.mktemp("data")
    train.run(_decoder_run(**{"mesh.data": 8}), str(workdir), quiet=True)
    return _metrics(workdir)


@pytest.mark.parametrize("strategy", ["all_gather", "ring"])
def test_two_steps_on_a_context_mesh_log_the_data_parallel_losses(tmp_path, strategy,
                                                                  data_parallel_metrics):
    train.run(_decoder_run(**{"mesh.data": 2, "mesh.context": 4,
                              "partitioning.context_attention": strategy}),
              str(tmp_path / "context"), quiet=True)
    plain, split = data_parallel_metrics, _metrics(tmp_path / "context")
    assert [r["step"] for r in split] == [1, 2]
    for a, b in zip(plain, split, strict=True):
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=2e-6)
        np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=1e-4)


REFUSED = [
    # (overrides on the decoder run, fragment of the one-line error)
    ({"mesh.data": 2, "mesh.context": 4, "task_feature_lengths": {"targets": 60}},
     "task_feature_lengths.targets=60 does not split into 8 equal parts over mesh.context=4 "
     "(load-balanced: two parts a device); use a multiple of 8, e.g. "
     "--config.task_feature_lengths.targets=64"),
    ({"mesh.data": 2, "mesh.context": 4, "task_feature_lengths": {"targets": 36},
      "partitioning.context_load_balance": False}, None),  # 36 = 4 x 9: fine unbalanced
    ({"mesh.data": 2, "mesh.context": 4, "model.dropout_rate": 0.1},
     "set --config.model.dropout_rate=0"),
    ({"mesh.data": 2, "mesh.context": 4, "model.attention.logit_softcap": 50.0},
     "attention.logit_softcap"),
    ({"mesh.data": 1, "mesh.context": 16}, "needs 16 devices but 8 are available"),
    ({"mesh.data": 2, "mesh.context": 4, "partitioning.context_attention": "ulysses"},
     "partitioning.context_attention"),
]


@pytest.mark.parametrize("overrides,fragment", REFUSED)
def test_meshes_and_models_a_context_axis_cannot_split_are_refused(overrides, fragment):
    check_mesh_on_8(_decoder_run(**overrides), fragment)


def test_an_encoder_decoder_is_refused_with_the_axes_that_do_split_it():
    config = config_lib.load_config_file("configs/quickstart.py")
    config.mesh.context = 4
    config.mesh.data = 2
    with pytest.raises(errors.ConfigError, match="does not split its rows over a context axis"):
        config_lib.check_devices(config_lib.spec_of(config), 8)


@pytest.mark.slow
def test_the_pages_command_trains_as_printed(tmp_path):
    """docs/parallelism.md's command: a ring context-parallel run of gpt2_tiny (4 steps of
    8 rows, a held-out eval at the end)."""
    page = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "parallelism.md").read_text()
    block = re.search(r"```\n(XLA_FLAGS=.*?)```", page, flags=re.S).group(1)
    words = shlex.split(block.replace("\\\n", " "))
    env = dict(os.environ, **dict(w.split("=", 1) for w in words[:1]))
    command = [sys.executable, *words[2:]]
    command = [w.replace("/tmp/context_run", str(tmp_path / "run")) for w in command]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600,
                          cwd=pathlib.Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    records = _metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2, 4]
    assert records[2]["loss"] < records[0]["loss"]


@pytest.mark.parametrize("balanced,window,packed", [(True, 0, True), (False, 0, False),
                                                    (True, 300, False)])
def test_the_splash_kernel_inside_each_shard_equals_one_devices_attention(
        monkeypatch, balanced, window, packed):
    """TPU's all-gather path, run in interpret mode on the CPU devices: causal rows of
    1,024 positions over (data 2, context 4), each device's 256 queries through one
    splash kernel cut into the axis's query shards, in the balanced order or not, with
    a window, packed or not; outputs and the gradients of queries, keys and values
    equal the plain path on one device."""
    from t5x_like.models import attention
    batch, length, heads, kv_heads, dim, size = 2, 1024, 4, 2, 32, 4
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(batch, length, heads, dim)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(batch, length, kv_heads, dim)), jnp.float32)
            for _ in range(2))
    segments = (np.repeat([1, 2, 0], [600, 400, 24]) if packed else np.ones(length))
    segments = jnp.asarray(np.tile(segments, (batch, 1)), jnp.int32)

    def whole(q, k, v):
        mask = attention.AttentionMask(segments, segments, causal=True, window=window)
        return attention.reference_attention(q, k, v, mask, scale=0.2)

    def split(q, k, v):
        parts = size if balanced else 0
        arrange = (lambda x: context_parallel.balance(x, parts)) if parts else (lambda x: x)
        order = (jnp.asarray(context_parallel.balanced_order(length, parts)) if parts
                 else None)
        mask = attention.AttentionMask(arrange(segments), arrange(segments), causal=True,
                                       window=window, order=order)
        out = context_parallel.attend(arrange(q), arrange(k), arrange(v), mask, scale=0.2,
                                      platform="tpu", interpret=True)
        return context_parallel.unbalance(out, parts) if parts else out

    def with_grads(attend, q, k, v):  # q, k, v arguments: constants would be folded
        def loss(q, k, v):
            out = attend(q, k, v)
            return jnp.sum(jnp.sin(out) * (segments > 0)[..., None, None]), out
        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
        return out, grads

    expected = jax.jit(lambda *a: with_grads(whole, *a))(q, k, v)
    mesh = partitioning.make_mesh(MESH)
    kernels = []
    monkeypatch.setattr(context_parallel, "_gathered_splash", _counted(
        context_parallel._gathered_splash, kernels))
    with (jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.axis_rules("fsdp")),
          context_parallel.context_settings(context_parallel.ContextSettings("all_gather",
                                                                             balanced))):
        found = jax.jit(lambda *a: with_grads(split, *a))(q, k, v)
    assert kernels, "the splash path was not taken"
    live = np.asarray(segments > 0)[..., None, None]
    np.testing.assert_allclose(np.where(live, found[0], 0), np.where(live, expected[0], 0),
                               rtol=2e-5, atol=2e-5)
    for a, b in zip(found[1], expected[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def _counted(function, calls: list):
    def counted(*args, **kwargs):
        calls.append(1)
        return function(*args, **kwargs)
    return counted


def test_the_ring_and_other_platforms_keep_the_plain_path(monkeypatch):
    """Only TPU's all-gather takes the kernel: the ring (whose running softmax needs
    statistics the kernel does not give back with gradients) and CPU do not."""
    from t5x_like.models import attention
    calls = []
    monkeypatch.setattr(context_parallel, "_gathered_splash", _counted(
        context_parallel._gathered_splash, calls))
    x = jnp.ones((2, 1024, 2, 32), jnp.float32)
    ids = jnp.ones((2, 1024), jnp.int32)
    mask = attention.AttentionMask(ids, ids, causal=True)
    mesh = partitioning.make_mesh(MESH)
    for strategy, platform in (("ring", "tpu"), ("all_gather", "cpu")):
        with (jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.axis_rules("fsdp")),
              context_parallel.context_settings(context_parallel.ContextSettings(strategy,
                                                                                 False))):
            jax.jit(lambda x, platform=platform: context_parallel.attend(
                x, x, x, mask, platform=platform)).lower(x)
    assert not calls
