"""Mixture-of-experts layers: router math, both dispatch modes against a plain loop over
experts, the auxiliary losses against their formulas, expert sharding, and the router
terms of the training objective (exact resume with experts: ``test_training``)."""

import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import drawn_params, structure_loss, tiny_config

from t5x_like import config_lib, errors, models, structures
from t5x_like.engine import partitioning
from t5x_like.engine import trainer as trainer_lib
from t5x_like.models import layers, moe
from t5x_like.objectives import router_terms


def test_router_weights_match_a_hand_computation():
    logits = jnp.array([[2.0, 0.0, 1.0, -1.0]])
    e = np.exp([2.0, 0.0, 1.0, -1.0])
    probabilities, weights, experts = moe.route(logits, 2, "before_top_k")
    np.testing.assert_allclose(probabilities[0], e / e.sum(), rtol=1e-6)
    assert experts.tolist() == [[0, 2]]
    np.testing.assert_allclose(weights[0], [e[0] / e.sum(), e[2] / e.sum()], rtol=1e-6)
    # After the top k: the softmax over the two chosen logits (Mixtral's renormalised form).
    _, weights, experts = moe.route(logits, 2, "after_top_k")
    np.testing.assert_allclose(weights[0], [e[0] / (e[0] + e[2]), e[2] / (e[0] + e[2])],
                               rtol=1e-6)
    _, weights, experts = moe.route(logits, 1, "before_top_k")  # Switch: top-1, its probability
    assert experts.tolist() == [[0]]
    np.testing.assert_allclose(weights[0], [e[0] / e.sum()], rtol=1e-6)


def test_capacity_dispatch_drops_exactly_the_overflow_and_keeps_order():
    # One group of 5 tokens, k=2, 3 experts, 2 slots each. First choices go first, in
    # token order: expert 0 gets tokens 0 and 1, token 3's first choice overflows; second
    # choices then fill what is left (expert 1: token 2 then token 0; expert 2: 4 then 1).
    experts = jnp.array([[[0, 1], [0, 2], [1, 0], [0, 1], [2, 1]]])
    weights = jnp.full((1, 5, 2), 0.5)
    dispatch, combine = moe.capacity_dispatch(experts, weights, num_experts=3, capacity=2)
    slots = {(t, e): int(np.argmax(dispatch[0, t, e])) for t in range(5) for e in range(3)
             if dispatch[0, t, e].sum()}
    assert slots == {(0, 0): 0, (1, 0): 1, (2, 1): 0, (4, 2): 0, (0, 1): 1, (1, 2): 1}
    assert float(dispatch.sum()) == 6  # 10 assignments, 3 experts x 2 slots: 4 dropped
    assert float(dispatch[0, 3].sum()) == 0  # token 3 lost both of its choices
    np.testing.assert_allclose(combine, dispatch * 0.5)
    assert moe.expert_capacity(5, 3, 2, 1.0) == 4 and moe.expert_capacity(8, 8, 1, 1.25) == 2


def _layer(dispatch, k=2, activations=("silu", "linear"), **settings):
    """The layer of a model given these expert keys (in the flat spelling before the spec,
    which moves them into ``model.experts``)."""
    fields = config_lib.model_spec_of(dict(family="decoder", num_experts=4,
                                           num_experts_per_token=k, moe_dispatch=dispatch,
                                           **settings)).experts
    return moe.MoeFeedForward(fields, 12, activations)


def _dense_loop(params, x, k, activations=("silu", "linear"), softmax="before_top_k"):
    """The layer written as a loop: every token through each of its k experts, weighted."""
    tokens = x.reshape(-1, x.shape[-1])
    _, weights, experts = moe.route(tokens @ params["router"]["kernel"], k, softmax)
    out = []
    for t in range(tokens.shape[0]):
        y = 0.0
        for j in range(k):
            e = experts[t, j]
            hidden = 1.0
            for i, name in enumerate(activations):
                kernel = params["experts"]["wi" if len(activations) == 1 else f"wi_{i}"][e]
                hidden = hidden * layers.ACTIVATIONS[name](tokens[t] @ kernel)
            y = y + weights[t, j] * (hidden @ params["experts"]["wo"][e])
        out.append(y)
    return jnp.stack(out).reshape(x.shape)


def test_dropless_equals_a_dense_loop_over_experts_in_outputs_and_gradients():
    x = jax.random.normal(jax.random.key(1), (2, 3, 8))
    layer = _layer("dropless")
    params = drawn_params(layer, x)

    def outputs_and_grads(apply):  # one program each: the outputs, and their gradients
        loss = lambda p, x: jnp.sum(jnp.sin(apply(p, x)))  # noqa: E731
        return jax.jit(lambda p, x: (apply(p, x), jax.grad(loss, argnums=(0, 1))(p, x)))(
            params, x)
    out, grads = outputs_and_grads(lambda p, x: layer.apply({"params": p}, x))
    want_out, want = outputs_and_grads(lambda p, x: _dense_loop(p, x, 2))
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_capacity_dispatch_with_room_for_every_token_equals_dropless():
    x = jax.random.normal(jax.random.key(2), (2, 6, 8))
    capacity = _layer("capacity", capacity_factor=4.0 / 2)  # E/k: every token fits
    dropless = _layer("dropless")
    # At capacity factor 0.5 with skewed routing some assignments are dropped, and counted.
    tight = _layer("capacity", capacity_factor=0.5)
    params = drawn_params(dropless, x)

    def run(p, x):
        out, state = capacity.apply({"params": p}, x, mutable=[moe.COLLECTION])
        _, tight_state = tight.apply({"params": p}, x, mutable=[moe.COLLECTION])
        return (out, dropless.apply({"params": p}, x),
                router_terms(state)[1]["moe_dropped_fraction"],
                router_terms(tight_state)[1]["moe_dropped_fraction"])
    out, want, dropped, tight_dropped = jax.jit(run)(params, x)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    assert float(dropped) == 0.0
    assert float(tight_dropped) > 0.0


def test_shared_expert_and_its_gate_add_a_sigmoid_weighted_mlp():
    x = jax.random.normal(jax.random.key(3), (1, 4, 8))
    layer = _layer("dropless", shared_expert_d_ff=6, shared_expert_gate=True)
    params = drawn_params(layer, x)

    def run(p, x):
        shared = layers.Mlp(6, ("silu", "linear")).apply({"params": p["shared_expert"]}, x)
        gate = jax.nn.sigmoid(x @ p["shared_expert_gate"]["kernel"])
        return layer.apply({"params": p}, x), _dense_loop(p, x, 2) + gate * shared
    out, want = jax.jit(run)(params, x)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_load_balancing_and_z_losses_equal_their_formulas():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 7, 4)).astype(np.float32)
    probabilities, _, experts = moe.route(jnp.asarray(logits), 2)
    chosen = np.zeros(4)
    for e in np.asarray(experts).reshape(-1):
        chosen[e] += 1
    f = chosen / 21  # tokens
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    want = 4 * np.sum(f * p.reshape(-1, 4).mean(0))
    np.testing.assert_allclose(moe.load_balancing_loss(probabilities, experts, 4), want,
                               rtol=1e-5)
    z = np.mean(np.log(np.exp(logits).sum(-1)) ** 2)
    np.testing.assert_allclose(moe.router_z_loss(jnp.asarray(logits)), z, rtol=1e-5)
    # Uniform routing with k=1 scores exactly 1.
    uniform = jnp.zeros((1, 4, 4))
    np.testing.assert_allclose(moe.load_balancing_loss(jax.nn.softmax(uniform),
                                                       jnp.arange(4).reshape(1, 4, 1), 4), 1.0)


def _model_config(family, **moe_settings):
    config = config_lib.model_defaults(family)
    config.update(dict(vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32))
    depth = {"decoder": dict(num_layers=2, max_length=16),
             "encoder": dict(num_layers=2, max_length=16, next_sentence_head=False)}
    config.update(depth.get(family, dict(num_encoder_layers=2, num_decoder_layers=2)))
    config.update(dict(num_experts=4, **moe_settings))
    return config


def _sparse_layers(params) -> list[str]:
    from flax import traverse_util
    return sorted({"/".join(path[:path.index("experts") - 1])
                   for path in traverse_util.flatten_dict(params) if "experts" in path})


@pytest.mark.parametrize("family,settings,sparse", [
    ("decoder", dict(num_experts_per_token=2, router_softmax="after_top_k",
                     moe_dispatch="dropless"), ["layers_0", "layers_1"]),
    ("encoder_decoder", dict(moe_every=2, router_z_loss_weight=1e-3),
     ["decoder/layers_1", "encoder/layers_1"]),
    ("encoder", dict(num_experts_per_token=2, router_z_loss_weight=1e-3),
     ["layers_0", "layers_1"]),
    ("bart", dict(moe_every=2), ["decoder/layers_1", "encoder/layers_1"]),
])
def test_every_family_with_experts_adds_the_router_losses_and_their_metrics(family, settings,
                                                                            sparse):
    from t5x_like import structures
    model = structures.build_model(_model_config(family, **settings))
    inputs = models.example_inputs(model, {}, batch_size=2)
    params = drawn_params(model, *inputs)
    assert _sparse_layers(params) == sparse
    structure = structures.structure_class(family)(model)
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, 64, (2, 8)), jnp.int32)
    batch = {name: tokens for name in ("encoder_input_tokens", "encoder_target_tokens",
                                       "decoder_input_tokens", "decoder_target_tokens")}
    batch[structure.weights_feature] = jnp.ones((2, 8))
    unweighted = dict(settings, router_aux_loss_weight=0.0, router_z_loss_weight=0.0)
    weighted_loss = structure_loss(family, model, z_loss=0.0)
    plain_loss = structure_loss(family, structures.build_model(
        _model_config(family, **unweighted)), z_loss=0.0)
    (objective, metrics), (plain, _) = jax.jit(  # one program: both objectives
        lambda p, b: (weighted_loss(p, b), plain_loss(p, b)))(params, batch)
    aux = 0.01 * metrics["moe_load_balancing_loss"] + settings.get(
        "router_z_loss_weight", 0.0) * metrics["moe_router_z_loss"]
    np.testing.assert_allclose(objective, plain + aux, rtol=1e-5)
    fractions = [metrics[f"moe_expert_fraction_{e}"] for e in range(4)]
    np.testing.assert_allclose(sum(fractions), 1.0, rtol=1e-5)


@pytest.mark.parametrize("family,dispatch,mesh_shape", [
    ("decoder", "capacity", {"data": 2, "expert": 4}),
    ("encoder_decoder", "capacity", {"data": 2, "expert": 4}),
    # dropless runs as a shard_map; FSDP's embed shards are gathered inside it
    ("decoder", "dropless", {"fsdp": 2, "expert": 4}),
])
def test_experts_sharded_over_a_2x4_mesh_equal_one_device(family, dispatch, mesh_shape):
    model = structures.build_model(_model_config(family, num_experts_per_token=2,
                                             moe_dispatch=dispatch))
    inputs = tuple(np.random.default_rng(0).integers(1, 64, size=x.shape).astype(np.int32)
                   for x in models.example_inputs(model, {}, batch_size=8))
    params = drawn_params(model, *inputs)

    def forward(p, *xs):
        logits, state = model.apply({"params": p}, *xs, mutable=[moe.COLLECTION])
        return logits, router_terms(state)

    def loss(p, *xs):  # gradients through the dispatch, the experts and the router loss
        logits, (aux, _) = forward(p, *xs)
        return jnp.mean(jnp.sin(logits)) + aux
    def forward_and_grad(p, *xs):
        return forward(p, *xs), jax.grad(loss)(p, *xs)
    single = jax.jit(forward_and_grad)(params, *inputs)
    mesh = partitioning.make_mesh(mesh_shape)
    rules = partitioning.axis_rules("fsdp")
    shardings = partitioning.logical_shardings(trainer_lib.abstract_boxed_params(model, {}),
                                               mesh, rules)
    layer = shardings["decoder"]["layers_0"] if family == "encoder_decoder" else (
        shardings["layers_0"])
    assert layer["mlp"]["experts"]["wo"].spec[0] == "expert"
    sharded_params = jax.device_put(params, shardings)
    sharded_inputs = tuple(jax.device_put(x, partitioning.batch_sharding(mesh)) for x in inputs)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        sharded = jax.jit(lambda p, *xs: forward_and_grad(p, *xs))(  # traced here, anew
            sharded_params, *sharded_inputs)
    for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(sharded), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)


def _kept_by_buffers(experts: np.ndarray, devices: int, local: int, buffer_rows: int):
    """Which assignments ``experts [groups, sources, tokens, k]`` reach their expert
    through receive buffers of ``buffer_rows``: each destination takes the sources in
    order, each source's assignments to it sorted by expert (ties in assignment order),
    and keeps the first ``buffer_rows``."""
    kept = np.zeros(experts.shape, bool)
    for g in range(experts.shape[0]):
        for d in range(devices):
            arriving = []
            for s in range(devices):
                flat = experts[g, s].reshape(-1)
                mine = [i for i in np.argsort(flat, kind="stable") if flat[i] // local == d]
                arriving += [(s, i) for i in mine]
            for s, i in arriving[:buffer_rows]:
                kept[g, s].reshape(-1)[i] = True
    return kept


@pytest.mark.parametrize("factor", [0.0, 4.0, 1.0])
def test_expert_parallel_receive_buffers_keep_the_first_arrivals_and_report_the_rest(factor):
    """(data 2, expert 4), 8 experts (2 a device), routing skewed to the first experts so
    a buffer of a device's own assignments overflows. The output equals one device's dropless output with the
    dropped assignments' weights set to zero, and the dropped fraction is theirs."""
    devices, local, k, d, ff = 4, 2, 2, 8, 16
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.normal(size=(8, 128 // 8, d)), jnp.float32)  # 16 tokens a device
    experts = np.minimum(rng.geometric(0.45, size=(8, 16, k)) - 1, 2 * devices - 1)
    weights = jnp.asarray(rng.uniform(size=experts.shape), jnp.float32)
    kernels = {name: jnp.asarray(rng.normal(size=shape) / 4, jnp.float32) for name, shape in (
        ("wi_0", (8, d, ff)), ("wi_1", (8, d, ff)), ("wo", (8, ff, d)))}
    activations = ("silu", "linear")
    mesh = partitioning.make_mesh({"data": 2, "expert": devices})
    rules = partitioning.axis_rules("fsdp")
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        out, dropped = jax.jit(lambda *a: moe.expert_parallel_dropless(
            *a, activations, "ragged_dot", mesh, factor))(x, jnp.asarray(experts), weights,
                                                          kernels)
    buffer_rows = moe.receive_buffer_rows(16 * k, devices, factor)
    assert buffer_rows == {0.0: 128, 4.0: 128, 1.0: 32}[factor]
    kept = _kept_by_buffers(experts.reshape(2, devices, 16, k), devices, local,
                            buffer_rows).reshape(experts.shape)
    expected = moe.dropless_combine(x.reshape(-1, d), jnp.asarray(experts).reshape(-1, k),
                                    (weights * kept).reshape(-1, k), kernels, activations)
    np.testing.assert_allclose(np.asarray(out).reshape(-1, d), expected, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(float(dropped), 1 - kept.mean(), rtol=1e-6)
    assert (float(dropped) > 0.1) == (factor == 1.0)


def test_receive_buffers_are_the_worst_case_or_whole_tiles_of_the_factor():
    assert moe.receive_buffer_rows(1000, 8, 0.0) == 8000
    assert moe.receive_buffer_rows(1000, 8, 1.5) == 1500
    assert moe.receive_buffer_rows(1024, 8, 1.1) == 1152  # 1,126.4 in tiles of 128
    assert moe.receive_buffer_rows(1000, 8, 20.0) == 8000  # never past the worst case
    assert moe.megablox_tiling(131072, 4096, 14336) == (512, 1024, 1024)
    assert moe.megablox_tiling(384, 640, 768) == (128, 128, 128)


@pytest.mark.parametrize("override,message", [
    ({"model.num_experts": 4, "model.num_experts_per_token": 5}, "num_experts_per_token=5"),
    ({"model.num_experts": 4, "model.moe_dispatch": "dropful"},
     "'model.experts.dispatch' is 'dropful'"),
    ({"model.num_experts": 4, "model.moe_every": 2, "model.scan_layers": True}, "scan_layers"),
    ({"model.num_experts": 4, "model.experts.ragged_buffer_factor": -1.0},
     "model.experts.ragged_buffer_factor"),
])
def test_expert_settings_that_cannot_be_built_are_refused_naming_the_key(override, message):
    with pytest.raises(errors.ConfigError, match=message):
        tiny_config(**{"model.num_encoder_layers": 2, "model.num_decoder_layers": 2, **override})


def test_groups_of_moe_group_size_tokens_dispatch_as_rows_of_that_length():
    x = jax.random.normal(jax.random.key(4), (2, 6, 8))
    grouped = _layer("capacity", capacity_factor=1.0, moe_group_size=3)
    rows = _layer("capacity", capacity_factor=1.0)
    params = drawn_params(rows, x)
    out, want = jax.jit(lambda p, x: (grouped.apply({"params": p}, x), rows.apply(
        {"params": p}, x.reshape(4, 3, 8)).reshape(x.shape)))(params, x)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("path,hf_config", [
    ("configs/switch_base_8.py", ("SwitchTransformers", dict(
        d_ff=3072, num_sparse_encoder_layers=6, num_sparse_decoder_layers=6))),
    ("configs/mixtral_8x7b.py", ("Mixtral", {})),
])
def test_the_published_moe_shapes_count_what_transformers_counts(path, hf_config):
    import torch
    import transformers

    from t5x_like.engine import flops
    config = config_lib.load_config_file(path)
    config_lib.validate(config)
    shapes = trainer_lib.parameter_shapes(config.model)
    ours = trainer_lib.param_count(shapes)
    name, settings = hf_config
    hf_class = "SwitchTransformersForConditionalGeneration" if "Switch" in name else (
        f"{name}ForCausalLM")
    with torch.device("meta"):
        model = getattr(transformers, hf_class)(getattr(transformers, f"{name}Config")(**settings))
    assert ours == sum(p.numel() for p in model.parameters())
    # Active parameters and FLOPs count the k experts a token runs through.
    model_config = config_lib.spec_of(config).model
    active = ours - moe.inactive_parameters(shapes, 8, model_config.experts.num_experts_per_token)
    dense = model_config.replace(experts=model_config.experts.replace(num_experts=0))
    if "mixtral" in path:
        assert round(active / 1e9, 1) == 12.9 and round(ours / 1e9, 1) == 46.7  # Mistral AI's
        lengths = {"targets": 4096}
        per_token = flops.forward_flops_per_sequence(model_config, lengths) / 4096
        # Two experts of Mistral 7B's width instead of one, plus the router.
        extra = flops.forward_flops_per_sequence(dense, lengths) / 4096 + 2 * 32 * (
            3 * 4096 * 14336 + 4096 * 8)
        np.testing.assert_allclose(per_token, extra, rtol=1e-9)
    else:  # top-1 over experts as wide as the dense MLP: T5 base's FLOPs plus the router
        lengths = {"inputs": 512, "targets": 114}
        router = 2 * 768 * 8 * (6 * 512 + 6 * 114)  # 6 sparse layers a stack
        np.testing.assert_allclose(flops.forward_flops_per_sequence(model_config, lengths),
                                   flops.forward_flops_per_sequence(dense, lengths) + router,
                                   rtol=1e-9)


def test_summary_prints_total_and_active_parameters(capsys):
    from t5x_like import summary
    assert summary.main(["--config=configs/pretrain/t5_tiny_moe.py"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # In closed form: the quickstart's T5 (tests/test_cli.py), whose second layer of each
    # stack becomes 8 experts of its gated MLP (3 d d_ff each) and a router (d x 8, no
    # bias); a token runs through 1 of the 8, so 7 experts' kernels a layer are inactive.
    from test_cli import quickstart_parameters
    d, d_ff, experts = 128, 512, 8
    total = quickstart_parameters() + 2 * ((experts - 1) * 3 * d * d_ff + d * experts)
    active = total - 2 * (experts - 1) * 3 * d * d_ff
    assert lines[-2] == (f"active params per token: {active} ({100 * active / total:.1f}% of "
                         f"{total}: 1 of 8 experts)")  # 3280640 (54.4% of 6033152)
    assert lines[-1].startswith(f"params: {total}")


def test_router_jitter_perturbs_routing_inputs_only_while_training():
    x = jax.random.normal(jax.random.key(5), (2, 6, 8))
    layer = _layer("dropless", k=1, router_jitter=0.5)
    params = drawn_params(layer, x)

    def run(p, x):
        evaluated = layer.apply({"params": p}, x)
        plain = _layer("dropless", k=1).apply({"params": p}, x)
        trained = [layer.apply({"params": p}, x, deterministic=False,
                               rngs={"dropout": jax.random.key(seed)}) for seed in (1, 2)]
        return evaluated, plain, trained
    evaluated, plain, trained = jax.jit(run)(params, x)
    np.testing.assert_array_equal(evaluated, plain)
    assert not np.allclose(trained[0], trained[1])  # the noise follows the dropout rng


def test_an_expert_axis_that_does_not_divide_the_experts_is_refused():
    config = tiny_config(**{"model.num_experts": 6, "mesh.data": 2, "mesh.expert": 4})
    with pytest.raises(errors.ConfigError, match="mesh.expert=4 does not divide "
                                                 "model.experts.num_experts=6"):
        config_lib.validate_for_devices(config, 8)
    config.model.num_experts = 8
    assert config_lib.validate_for_devices(config, 8)["expert"] == 4


def _np_route(x, router, k):
    """Router probabilities, top-k experts and their weights (the softmax over all
    experts read at the top k: Switch's and the layer's default), in float64 numpy."""
    logits = x.astype(np.float64) @ router.astype(np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    experts = np.argsort(-logits, axis=-1, kind="stable")[..., :k]
    return experts, np.take_along_axis(p, experts, -1)


def _capacity_loop(params, x, k, capacity_factor, group_size=0):
    """The documented capacity rule, one assignment at a time (independent of the
    layer's one-hot cumsum): each group (a row, or ``group_size`` consecutive tokens)
    gives each expert ``ceil(capacity_factor * k * tokens / experts)`` slots; all first
    choices are placed before any second choice, each in token order; an assignment that
    finds its expert full is dropped (adds nothing: the residual outside the layer
    carries the token). Experts are gated SiLU MLPs (``silu(x wi_0) * (x wi_1) wo``).
    Returns the output and, per choice j, how many assignments were placed/dropped."""
    params = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    num_experts = params["router"]["kernel"].shape[-1]
    tokens = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
    group = group_size or x.shape[1]
    capacity = max(1, math.ceil(capacity_factor * k * group / num_experts))
    experts, weights = _np_route(tokens, params["router"]["kernel"], k)
    out = np.zeros_like(tokens)
    placed, dropped = [0] * k, [0] * k
    for start in range(0, len(tokens), group):
        fill = [0] * num_experts
        for j in range(k):
            for t in range(start, start + group):
                e = experts[t, j]
                if fill[e] == capacity:
                    dropped[j] += 1
                    continue
                fill[e] += 1
                placed[j] += 1
                gate = tokens[t] @ params["experts"]["wi_0"][e]
                hidden = gate / (1 + np.exp(-gate)) * (tokens[t] @ params["experts"]["wi_1"][e])
                out[t] += weights[t, j] * (hidden @ params["experts"]["wo"][e])
    return out.reshape(x.shape), placed, dropped


@pytest.mark.parametrize("group_size", [0, 4])
def test_capacity_dispatch_that_drops_tokens_equals_a_per_token_loop(group_size):
    x = jax.random.normal(jax.random.key(6), (3, 8, 8))
    # 4 experts, k = 2, 0.5 x: a group of 8 tokens has 8 slots for 16 assignments.
    layer = _layer("capacity", capacity_factor=0.5, moe_group_size=group_size)
    params = drawn_params(layer, x, seed=7)
    out, state = jax.jit(lambda p, x: layer.apply({"params": p}, x, mutable=[moe.COLLECTION]))(
        params, x)
    want, placed, dropped = _capacity_loop(params, x, 2, 0.5, group_size)
    # Both halves of the rule are exercised: some first choices overflow (so token order
    # decides), and some second choices still find room (after every first choice).
    assert dropped[0] > 0 and placed[1] > 0 and dropped[1] > 0, (placed, dropped)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(router_terms(state)[1]["moe_dropped_fraction"]),
                               sum(dropped) / (sum(placed) + sum(dropped)), rtol=1e-6)


@pytest.mark.parametrize("expert_capacity", [1, 2])
def test_switch_capacity_dispatch_equals_transformers_switch_sparse_mlp(expert_capacity):
    """Against transformers' ``SwitchTransformersSparseMLP`` (top-1, probabilities before
    the top 1, ``expert_capacity`` tokens per expert and sequence, earlier tokens first)
    with random weights copied into the layer. The two rules agree everywhere for k = 1:
    a token past capacity leaves transformers' layer (5.x) as zeros, as it leaves ours
    (transformers 4.x passed it through times its router probability instead, and has no
    second choices, so k = 2 is compared with the loop above only)."""
    import torch
    import transformers

    batch, length, d_model, d_ff, num_experts = 3, 8, 8, 12, 4
    hf_config = transformers.SwitchTransformersConfig(
        d_model=d_model, d_ff=d_ff, num_experts=num_experts, expert_capacity=expert_capacity,
        router_bias=False, router_jitter_noise=0.0, dense_act_fn="relu", dropout_rate=0.0)
    torch.manual_seed(expert_capacity)
    hf = transformers.models.switch_transformers.modeling_switch_transformers.\
        SwitchTransformersSparseMLP(hf_config).eval()
    with torch.no_grad():
        for parameter in hf.parameters():
            parameter.normal_(0.0, 0.5)
    x = torch.randn(batch, length, d_model)
    with torch.no_grad():
        want = hf(x).numpy()
        kept = hf.router(x)[0].sum().item()  # assignments within capacity
    assert kept < batch * length  # tokens are dropped
    # _layer: 4 experts of width 12, probabilities before the top k (the default); the
    # factor makes ceil(capacity_factor * length / num_experts) == expert_capacity.
    layer = _layer("capacity", k=1, activations=("relu",),
                   capacity_factor=expert_capacity * num_experts / length)
    experts = [hf.experts[f"expert_{e}"] for e in range(num_experts)]
    params = {"router": {"kernel": hf.router.classifier.weight.detach().numpy().T},
              "experts": {"wi": np.stack([e.wi.weight.detach().numpy().T for e in experts]),
                          "wo": np.stack([e.wo.weight.detach().numpy().T for e in experts])}}
    shapes = jax.tree.map(np.shape, nn.unbox(layer.init(jax.random.key(0), x.numpy()))["params"])
    assert jax.tree.map(np.shape, params) == shapes
    ours = layer.apply({"params": params}, jnp.asarray(x.numpy()))
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)
    assert int((np.abs(want).sum(-1) == 0).sum()) == batch * length - kept  # the dropped


def test_capacity_dispatch_over_an_expert_axis_gathers_no_more_than_its_fsdp_share():
    """fsdp 2 x expert 4 (MaxText's layout for Mixtral 8x22B, scaled down): the groups
    are constrained to the batch axes but ``expert``, so a device gathers along the expert
    axis the rows of its fsdp shard (16 of 32), never the whole batch's hidden states, as
    XLA chose without the constraint (117.6 GiB a chip for Mixtral 8x22B on v6e-256)."""
    model = structures.build_model(_model_config("decoder", num_experts_per_token=2,
                                                 moe_dispatch="capacity"))
    inputs = tuple(np.random.default_rng(0).integers(1, 64, size=x.shape).astype(np.int32)
                   for x in models.example_inputs(model, {}, batch_size=32))
    params = drawn_params(model, *inputs)
    mesh = partitioning.make_mesh({"fsdp": 2, "expert": 4})
    rules = partitioning.axis_rules("fsdp")
    shardings = partitioning.logical_shardings(trainer_lib.abstract_boxed_params(model, {}),
                                               mesh, rules)

    def loss(p, *xs):
        return jnp.mean(jnp.sin(model.apply({"params": p}, *xs, mutable=[moe.COLLECTION])[0]))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        text = jax.jit(jax.grad(loss), in_shardings=(shardings, *[partitioning.batch_sharding(
            mesh)] * len(inputs))).lower(params, *inputs).compile().as_text()
    gathered = [math.prod(int(d) for d in dims.split(",") if d)
                for dims in re.findall(r"= \w+\[([\d,]*)\][^ ]* all-gather\(", text)]
    rows, length = inputs[0].shape
    d_model = params["layers_0"]["mlp"]["router"]["kernel"].shape[0]
    assert gathered and max(gathered) <= rows // 2 * length * d_model, sorted(gathered)[-3:]
