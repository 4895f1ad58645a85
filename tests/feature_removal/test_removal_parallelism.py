"""Removals of the parallelism features: each is proved by what the compiled program does
on 8 fake devices (its collectives, their operands and trip counts, its memory), not
only by outputs that an unsharded program would give as well."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from removals import Removal, existing, proving_tests

from t5x_like import config_lib, models, structures
from t5x_like.engine import partitioning
from t5x_like.engine import trainer as trainer_lib
from t5x_like.models import attention, context_parallel, moe, pipeline_parallel
from t5x_like.planner import hlo_collectives

# -- context parallelism: a decoder on (data 2, context 4) --------------------------------

CP_BATCH, CP_LENGTH, CP_MESH = 4, 64, {"data": 2, "context": 4}


def _decoder(num_layers=2, **settings):
    model_config = config_lib.model_defaults("decoder")
    model_config.update({**dict(vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=48,
                                num_layers=num_layers,
                                positions=dict(max_length=max(CP_LENGTH, 16))), **settings})
    return structures.build_model(model_config)


def _abstract_params(model, mesh, rules):
    boxed = trainer_lib.abstract_boxed_params(model, {})
    shardings = partitioning.logical_shardings(boxed, mesh, rules)
    return jax.tree.map(lambda b, s: jax.ShapeDtypeStruct(b.value.shape, b.value.dtype,
                                                          sharding=s),
                        boxed, shardings, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


def _context_step(strategy: str, balanced: bool = True):
    """The compiled forward and backward of a 2-layer decoder on (data 2, context 4)."""
    model = _decoder()
    mesh = partitioning.make_mesh(CP_MESH)
    rules = partitioning.axis_rules("fsdp")

    def forward_and_grad(p, tokens):
        return jax.value_and_grad(lambda p: jnp.mean(jnp.sin(model.apply({"params": p},
                                                                          tokens))))(p)
    settings = context_parallel.ContextSettings(strategy, balanced)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules), \
            context_parallel.context_settings(settings):
        tokens = jax.ShapeDtypeStruct((CP_BATCH, CP_LENGTH), jnp.int32,
                                      sharding=partitioning.batch_sharding(mesh))
        return jax.jit(forward_and_grad).lower(_abstract_params(model, mesh, rules),
                                               tokens).compile()


def _shape(type_text: str) -> tuple[int, ...]:
    dims = type_text.split("[", 1)[1].split("]", 1)[0]
    return tuple(int(d) for d in dims.split(",") if d)


def ring_moves_key_blocks(request):
    """The ring's program passes each layer's key and value blocks ``[rows/2, L/4, kv, d]``
    around the context axis in C - 1 hops (forward and backward), gathers no keys, and
    holds less temporary memory than the all-gather program on the same shapes."""
    ring = _context_step("ring")
    block = (CP_BATCH // 2, CP_LENGTH // 4, 4, 8)
    found = hlo_collectives.listed(ring.as_text(), CP_MESH)
    hops = [c for c in found if c.kind == "collective-permute" and c.axes == "context"
            and _shape(c.operand_types[0]) == block]
    assert len(hops) >= 2 * 2 * 2, f"{len(hops)} permutes of key blocks"  # K, V; 2 layers; fwd+bwd
    assert all(c.times == CP_MESH["context"] - 1 for c in hops)
    gathered_keys = [c for c in found if c.kind == "all-gather" and c.axes == "context"
                     and _shape(c.operand_types[0]) == block]
    assert not gathered_keys, "the ring gathers the row's keys"
    gathered = _context_step("all_gather")
    ring_bytes = ring.memory_analysis().temp_size_in_bytes
    gathered_bytes = gathered.memory_analysis().temp_size_in_bytes
    assert ring_bytes < gathered_bytes, (ring_bytes, gathered_bytes)


def _ring_is_all_gather(monkeypatch):
    monkeypatch.setattr(context_parallel, "_ring", context_parallel._gathered)


def _cp_logits(strategy: str, balanced: bool = True, spy=None):
    """(one device's logits, the context mesh's) of the decoder on the same tokens."""
    model = _decoder()
    tokens = np.random.default_rng(0).integers(1, 64, (CP_BATCH, CP_LENGTH)).astype(np.int32)
    params = nn.unbox(model.init(jax.random.key(0), *models.example_inputs(model, {})))["params"]
    single = jax.jit(lambda p, t: model.apply({"params": p}, t))(params, tokens)
    mesh = partitioning.make_mesh(CP_MESH)
    rules = partitioning.axis_rules("fsdp")
    shardings = partitioning.logical_shardings(trainer_lib.abstract_boxed_params(model, {}),
                                               mesh, rules)
    settings = context_parallel.ContextSettings(strategy, balanced)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules), \
            context_parallel.context_settings(settings):
        split = jax.jit(lambda p, t: model.apply({"params": p}, t))(
            jax.device_put(params, shardings),
            jax.device_put(tokens, partitioning.batch_sharding(mesh)))
    return np.asarray(single), np.asarray(split)


def all_gather_equals_one_device(request):
    """All-gather context attention: the split rows' logits equal one device's."""
    single, split = _cp_logits("all_gather")
    np.testing.assert_allclose(split, single, rtol=1e-5, atol=2e-6)


def _each_shard_attends_to_itself(monkeypatch):
    """Every device's queries see only the keys it holds: no gather."""
    def local(q, k, v, q_ids, k_ids, order, prefix, *, pattern, scale, dtype):
        allowed = pattern.allowed(q_ids, k_ids, order, order, prefix, prefix)
        bias = jnp.where(allowed, 0.0, attention.NEG_INF)[:, None]
        return attention.reference_attention(q, k, v, None, scale=scale, dtype=dtype, bias=bias)
    monkeypatch.setattr(context_parallel, "_gathered", local)


def balanced_devices_do_equal_causal_work(request):
    """The order the context mesh's attention is given (the positions each device's rows
    came from) gives every device as many visible causal (query, key) pairs, and the
    logits still equal one device's."""
    orders = []
    original = context_parallel.attend

    def spying(query, key, value, mask, **kw):
        if mask.order is None:
            orders.append(None)
        else:  # a traced constant: read when the program runs
            jax.debug.callback(lambda order: orders.append(np.asarray(order)), mask.order)
        return original(query, key, value, mask, **kw)
    context_parallel.attend = spying
    try:
        single, split = _cp_logits("ring")
    finally:
        context_parallel.attend = original
    np.testing.assert_allclose(split, single, rtol=1e-5, atol=2e-6)
    assert orders, "no attention ran across the context axis"
    order = orders[0] if orders[0] is not None else np.arange(CP_LENGTH)
    work = (order.reshape(CP_MESH["context"], -1) + 1).sum(axis=1)
    assert len(set(work.tolist())) == 1, f"visible pairs per device: {work.tolist()}"


def _no_load_balance(monkeypatch):
    monkeypatch.setattr(context_parallel, "balanced_parts", lambda length: 0)


# -- pipeline stages: a scanned decoder on (stage 4, data 2) ------------------------------

PP_BATCH, PP_LENGTH, PP_MESH = 8, 16, {"stage": 4, "data": 2}


def _pipelined(schedule: str, num_layers: int, microbatches: int):
    """(compiled forward, the stack's parameter shardings) of a scanned decoder."""
    model = _decoder(num_layers, numerics=dict(scan_layers=True))
    mesh = partitioning.make_mesh(PP_MESH)
    rules = partitioning.axis_rules("fsdp")
    settings = pipeline_parallel.PipelineSettings(schedule, microbatches, 1, PP_MESH["stage"])
    with trainer_lib._MeshAndRules(mesh, rules, pipeline_settings=settings):
        abstract = _abstract_params(model, mesh, rules)
        tokens = jax.ShapeDtypeStruct((PP_BATCH, PP_LENGTH), jnp.int32,
                                      sharding=partitioning.batch_sharding(mesh, rules))
        compiled = jax.jit(lambda p, t: model.apply({"params": p}, t)).lower(
            abstract, tokens).compile()
    return compiled


def _stage_hand_overs(compiled) -> list:
    """The stage axis's permutes of one microbatch's activations ``[rows, L, d]``."""
    rows = PP_BATCH // 4 // PP_MESH["data"]
    return [c for c in hlo_collectives.listed(compiled.as_text(), PP_MESH)
            if c.kind == "collective-permute" and c.axes == "stage"
            and _shape(c.operand_types[0]) == (rows, PP_LENGTH, 32)]


def gpipe_hands_microbatches_over(request):
    """GPipe over 4 stages with 4 microbatches: one hand-over of a microbatch's
    activations to the next stage per iteration, M + S - 1 = 7 iterations, and no
    stacked layer gathered whole onto a stage."""
    compiled = _pipelined("gpipe", 4, 4)
    hand_overs = _stage_hand_overs(compiled)
    assert [c.times for c in hand_overs] == [4 + 4 - 1], hand_overs
    gathered = [c for c in hlo_collectives.listed(compiled.as_text(), PP_MESH)
                if c.kind == "all-gather" and "stage" in c.axes]
    assert not gathered, gathered


def circular_laps_the_stages(request):
    """Circular with 8 layers on 4 stages (2 laps) and 4 microbatches: R M + S - 1 = 11
    hand-overs, against GPipe's 7 for the same stack."""
    hand_overs = _stage_hand_overs(_pipelined("circular", 8, 4))
    assert [c.times for c in hand_overs] == [2 * 4 + 4 - 1], hand_overs


def _every_layer_on_every_stage(monkeypatch):
    """The stack runs whole on every device (its layers gathered), microbatches unused."""
    def plain(layer, params, x, args, *, stages, microbatches, repeats, remat=False):
        flat = jax.tree.map(lambda p: p.reshape((-1,) + p.shape[2:]) if repeats > 1 else p,
                            params)
        out, _ = jax.lax.scan(lambda h, layer_params: (layer(layer_params, h, args), None), x,
                              flat)
        return out
    monkeypatch.setattr(pipeline_parallel, "run", plain)


def _circular_as_gpipe(monkeypatch):
    """A circular schedule stored and run as GPipe's one lap."""
    monkeypatch.setattr(pipeline_parallel.PipelineSettings, "repeats", lambda self, layers, stages: 1)


# -- experts ------------------------------------------------------------------------------

def _moe_decoder(dispatch: str):
    config = config_lib.model_defaults("decoder")
    config.update(dict(vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_layers=2,
                       max_length=16, num_experts=4, num_experts_per_token=2,
                       moe_dispatch=dispatch))
    return structures.build_model(config)


def _moe_forward(dispatch: str, mesh_shape: dict):
    model = _moe_decoder(dispatch)
    mesh = partitioning.make_mesh(mesh_shape)
    rules = partitioning.axis_rules("fsdp")
    abstract = _abstract_params(model, mesh, rules)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        tokens = jax.ShapeDtypeStruct((8, 16), jnp.int32,
                                      sharding=partitioning.batch_sharding(mesh))
        return jax.jit(lambda p, t: model.apply({"params": p}, t)).lower(
            abstract, tokens).compile()


def dropless_exchanges_rows_over_the_expert_axis(request):
    """Expert-parallel dropless dispatch on (fsdp 2, expert 4): each sparse layer sends
    token rows to their experts' devices and back (two all-to-alls of float rows over
    ``expert``, ragged where the platform has it) instead of gathering the experts."""
    mesh_shape = {"fsdp": 2, "expert": 4}
    found = hlo_collectives.listed(_moe_forward("dropless", mesh_shape).as_text(), mesh_shape)
    exchanges = [c for c in found if c.kind in ("all-to-all", "ragged-all-to-all")
                 and c.axes == "expert" and c.operand_types[0].startswith("f32")]
    assert len(exchanges) >= 2 * 2, found  # there and back, in each of 2 layers
    summed = [c for c in found if c.kind == "all-reduce" and "expert" in c.axes
              and c.operand_types[0].startswith("f32[") and _shape(c.operand_types[0])[0] >= 64]
    assert not summed, summed


def _no_expert_axis_mesh(monkeypatch):
    monkeypatch.setattr(moe, "_expert_axis_mesh", lambda: None)


def capacity_experts_live_on_their_devices(request):
    """Capacity dispatch on (data 2, expert 4): the compiled step's expert kernels hold one
    expert a device, and the token slots cross the expert axis."""
    mesh_shape = {"data": 2, "expert": 4}
    compiled = _moe_forward("capacity", mesh_shape)
    kernels = compiled.input_shardings[0][0]["layers_0"]["mlp"]["experts"]
    for name, sharding in kernels.items():
        assert sharding.shard_shape((4, 16, 32) if name != "wo" else (4, 32, 16))[0] == 1, name
    found = hlo_collectives.listed(compiled.as_text(), mesh_shape)
    assert any(c.axes == "expert" and c.operand_types[0].startswith("f32") for c in found)


def _experts_not_split(monkeypatch):
    original = partitioning.axis_rules

    def rules(*args, **kwargs):
        return tuple((name, None if name == "expert" else axes)
                     for name, axes in original(*args, **kwargs))
    monkeypatch.setattr(partitioning, "axis_rules", rules)


def dropless_drops_nothing(request):
    """Dropless dispatch (capacity factor 1, which capacity dispatch would overflow on
    these routes): no assignment dropped, the output every token through its k experts
    (``test_moe._dense_loop``, a plain loop)."""
    from test_moe import _dense_loop, _layer
    x = jax.random.normal(jax.random.key(2), (2, 6, 8))
    layer = _layer("dropless", capacity_factor=1.0)
    params = nn.unbox(layer.init(jax.random.key(0), x))["params"]
    out, state = layer.apply({"params": params}, x, mutable=[moe.COLLECTION])
    np.testing.assert_allclose(out, _dense_loop(params, x, 2), rtol=1e-5, atol=1e-6)
    assert float(state[moe.COLLECTION]["dropped_fraction"][0]) == 0.0


def _dropless_as_capacity(monkeypatch):
    monkeypatch.setattr(moe.MoeFeedForward, "_dropless", moe.MoeFeedForward._capacity)


def _groups_unconstrained(monkeypatch):
    """The groups' constraint (``("expert_batch", None, ...)``) dropped; the slots' kept."""
    original = moe.constrain
    monkeypatch.setattr(moe, "constrain", lambda x, names: x if (
        len(names) == 3 and names[0] == "expert_batch") else original(x, names))


GROUPS = existing("test_moe.py::"
                  "test_capacity_dispatch_over_an_expert_axis_gathers_no_more_than_its_fsdp_share")


REMOVALS = [
    Removal("capacity dispatch's groups over the expert axis", "the groups' sharding "
            "constraint is dropped (the slots' kept)", "on fsdp 2 x expert 4 no all-gather "
            "holds more than an fsdp shard's rows", _groups_unconstrained, GROUPS[1], holds_in=GROUPS[0]),
    Removal("ring attention", "the ring's block function replaced by the all-gather one",
            "key/value blocks permuted over `context` in C-1 hops, none gathered, less "
            "temporary memory than all-gather", _ring_is_all_gather, ring_moves_key_blocks),
    Removal("all-gather context attention",
            "each device attends to the keys it holds only (no gather)",
            "logits on (data 2, context 4) equal one device's", _each_shard_attends_to_itself,
            all_gather_equals_one_device),
    Removal("causal load balancing of context rows", "`balanced_parts` returns 0 (rows in "
            "order)", "every context device sees as many causal pairs; logits equal one "
            "device's", _no_load_balance, balanced_devices_do_equal_causal_work),
    Removal("GPipe pipeline schedule", "the stack runs whole on every stage",
            "M+S-1 hand-overs of a microbatch over `stage`, no layer gathered",
            _every_layer_on_every_stage, gpipe_hands_microbatches_over),
    Removal("circular pipeline schedule", "circular stored and run as one GPipe lap",
            "R*M+S-1 hand-overs over `stage`", _circular_as_gpipe, circular_laps_the_stages),
    Removal("expert-parallel dropless dispatch", "the expert-axis mesh lookup returns None",
            "float rows cross `expert` by all-to-all there and back in each sparse layer",
            _no_expert_axis_mesh, dropless_exchanges_rows_over_the_expert_axis),
    Removal("expert-parallel capacity dispatch", "the `expert` logical axis maps to no mesh "
            "axis", "the compiled step holds one expert per device and slots cross `expert`",
            _experts_not_split, capacity_experts_live_on_their_devices),
    Removal("dropless dispatch (vs capacity)", "dropless runs capacity dispatch",
            "tokens routed to two experts: none dropped, the output every token's k experts",
            _dropless_as_capacity, dropless_drops_nothing),
]

globals().update(proving_tests(REMOVALS))
