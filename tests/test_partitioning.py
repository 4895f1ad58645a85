import flax.linen as nn
import jax
import numpy as np
import pytest
from conftest import tiny_config

from t5x_like import errors, models, structures
from t5x_like.engine import flops, optim, partitioning
from t5x_like.engine import trainer as trainer_lib


def build_trainer(config, mesh_shape):
    model = structures.build_model(config.model)
    optimizer, schedule = optim.make_optimizer(config.optimizer, config.num_train_steps)
    mesh = partitioning.make_mesh(mesh_shape)
    rules = partitioning.axis_rules(config.partitioning.rules)
    lengths = {"encoder_input_tokens": 32, "decoder_input_tokens": 8, "decoder_target_tokens": 8}
    return trainer_lib.Trainer(model, None, optimizer, schedule, mesh, rules, lengths)


def _is_replicated(sharding) -> bool:
    return all(axis is None for axis in sharding.spec)


def test_fsdp_shards_every_matrix_parameter():
    config = tiny_config()
    trainer = build_trainer(config, {"data": 2, "fsdp": 4, "tensor": 1})
    flat = jax.tree_util.tree_flatten_with_path(trainer.state_shardings.params)[0]
    shapes = jax.tree.leaves(trainer.abstract_state.params)
    for (path, sharding), shape in zip(flat, shapes, strict=False):
        if len(shape.shape) >= 2 and "relpos" not in jax.tree_util.keystr(path):
            assert "fsdp" in jax.tree.leaves(tuple(sharding.spec)), jax.tree_util.keystr(path)


def test_optimizer_state_follows_parameter_shardings():
    config = tiny_config(**{"optimizer.name": "adamw"})
    trainer = build_trainer(config, {"data": 2, "fsdp": 4, "tensor": 1})
    params = trainer.state_shardings.params
    adam_state = trainer.state_shardings.opt_state[0]
    assert jax.tree.map(lambda s: s.spec, adam_state.mu) == jax.tree.map(lambda s: s.spec, params)


def test_adafactor_factored_statistics_keep_a_valid_sharding():
    config = tiny_config()
    trainer = build_trainer(config, {"data": 2, "fsdp": 4, "tensor": 1})
    for leaf, sharding in zip(jax.tree.leaves(trainer.abstract_state.opt_state),
                              jax.tree.leaves(trainer.state_shardings.opt_state), strict=False):
        assert len(sharding.spec) <= len(leaf.shape)
        sharding.shard_shape(leaf.shape)  # raises if a sharded dim does not divide


def test_tensor_rules_shard_heads_and_mlp():
    config = tiny_config(**{"partitioning.rules": "fsdp_tensor"})
    trainer = build_trainer(config, {"data": 2, "fsdp": 2, "tensor": 2})
    mlp = trainer.state_shardings.params["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    assert tuple(mlp.spec) == (("fsdp", "context"), "tensor")


def test_global_batch_is_split_over_data_axes():
    mesh = partitioning.make_mesh({"data": 2, "fsdp": 4, "tensor": 1})
    batch = partitioning.global_batch({"x": np.arange(32).reshape(16, 2)}, mesh)
    assert batch["x"].shape == (16, 2)
    assert batch["x"].sharding.shard_shape((16, 2)) == (2, 2)


@pytest.mark.parametrize("config_name", ["t5_1_1_small", "gpt2_small", "bert_base",
                                         "albert_base", "bart_base", "decoder_modern_1b"])
def test_no_large_parameter_is_left_replicated_under_fsdp(config_name):
    import pathlib

    from t5x_like import config_lib

    path = pathlib.Path(__file__).resolve().parents[1] / "configs" / f"{config_name}.py"
    config = config_lib.load_config_file(str(path))
    model = structures.build_model(config.model)
    mesh = partitioning.make_mesh({"data": 2, "fsdp": 4, "tensor": 1})
    boxed = trainer_lib.abstract_boxed_params(model, {})
    shardings = partitioning.logical_shardings(boxed, mesh, partitioning.axis_rules("fsdp"))
    leaves = jax.tree_util.tree_flatten_with_path(nn.unbox(boxed))[0]
    for (path, leaf), sharding in zip(leaves, jax.tree.leaves(shardings), strict=False):
        if np.prod(leaf.shape) > 1_000_000:
            assert not _is_replicated(sharding), jax.tree_util.keystr(path)


TINY_FAMILIES = {
    "encoder_decoder": dict(vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32,
                            num_encoder_layers=1, num_decoder_layers=1),
    "decoder": dict(vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_layers=2,
                    max_length=16),
    "encoder": dict(vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_layers=2,
                    max_length=16),
    "bart": dict(vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32,
                 num_encoder_layers=1, num_decoder_layers=2, max_length=16),
    # The modern decoder, scanned and rematerialised, with grouped-query attention.
    "decoder_modern": dict(family="decoder", vocab_size=64, d_model=16, num_heads=4,
                           num_kv_heads=2, head_dim=4, d_ff=32, num_layers=2, max_length=16,
                           norm="rmsnorm", position_embedding="rotary", use_bias=False,
                           mlp_activations=("silu", "linear"), tie_embeddings=False,
                           scan_layers=True, remat_policy="full"),
    # ALBERT: factorized embeddings, one shared block, with the span-boundary head.
    "encoder_albert": dict(family="encoder", vocab_size=64, d_model=16, num_heads=2, head_dim=8,
                           d_ff=32, num_layers=2, max_length=16, embedding_dim=8,
                           share_layers=True, span_boundary_head=True),
}


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_forward_on_a_2x4_mesh_equals_one_device(family):
    from t5x_like import config_lib

    settings = dict(TINY_FAMILIES[family])
    model_config = config_lib.model_defaults(settings.pop("family", family))
    model_config.update(settings)
    model = structures.build_model(model_config)
    inputs = tuple(np.random.default_rng(0).integers(1, 64, size=x.shape).astype(np.int32)
                   for x in models.example_inputs(model, {}, batch_size=8))
    params = nn.unbox(model.init(jax.random.key(0), *inputs))["params"]
    single = model.apply({"params": params}, *inputs)

    mesh = partitioning.make_mesh({"data": 2, "fsdp": 4, "tensor": 1})
    rules = partitioning.axis_rules("fsdp")
    boxed = trainer_lib.abstract_boxed_params(model, {})
    sharded_params = jax.device_put(params, partitioning.logical_shardings(boxed, mesh, rules))
    sharded_inputs = tuple(jax.device_put(x, partitioning.batch_sharding(mesh)) for x in inputs)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        sharded = jax.jit(lambda p, *xs: model.apply({"params": p}, *xs))(sharded_params,
                                                                           *sharded_inputs)
    for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(sharded), strict=False):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_train_step_compiles_ahead_of_time_with_a_flop_count():

    config = tiny_config()
    model = structures.build_model(config.model)
    optimizer, schedule = optim.make_optimizer(config.optimizer, config.num_train_steps)
    mesh = partitioning.make_mesh({"data": 2, "fsdp": 4, "tensor": 1})
    lengths = {"encoder_input_tokens": 32, "decoder_input_tokens": 8, "decoder_target_tokens": 8}
    trainer = trainer_lib.Trainer(model, structures.EncoderDecoderStructure(model).loss_fn(
                                      config.loss), optimizer, schedule, mesh,
                                  partitioning.axis_rules("fsdp"), lengths)
    batch = {name: jax.ShapeDtypeStruct((16, n), np.int32, sharding=trainer.batch_sharding)
             for name, n in lengths.items()}
    batch["decoder_loss_weights"] = jax.ShapeDtypeStruct((16, 8), np.float32,
                                                          sharding=trainer.batch_sharding)
    compiled = trainer.lower_train_step(trainer.abstract_state, batch).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    # Per device, about an eighth of the model's FLOPs (2 x 4 devices share the batch and
    # the weights; the optimizer update and the loss add a little).
    model_flops = flops.train_flops_per_step(config.model, {"inputs": 32, "targets": 8}, 16)
    assert 0.8 < cost["flops"] * 8 / model_flops < 1.5, (cost["flops"], model_flops)


def test_dcn_axis_puts_data_parallelism_across_slices():
    """Fake CPU devices rehearse two slices as two blocks of four devices: the dcn axis
    splits the blocks, every other axis (and so every parameter shard) stays inside one."""
    devices = jax.devices()
    mesh = partitioning.make_mesh({"dcn": 2, "data": 1, "fsdp": 4, "tensor": 1})
    assert dict(mesh.shape) == {"dcn": 2, "stage": 1, "data": 1, "fsdp": 4, "expert": 1,
                                "context": 1, "tensor": 1}
    assert set(mesh.devices[0].flat) == set(devices[:4])
    assert set(mesh.devices[1].flat) == set(devices[4:])
    # The batch is split over slices too: each device holds 16 / (2 * 4) rows.
    batch = partitioning.global_batch({"x": np.arange(32).reshape(16, 2)}, mesh)
    assert batch["x"].sharding.shard_shape((16, 2)) == (2, 2)
    # Parameters are sharded inside a slice and replicated across slices (hybrid FSDP).
    trainer = build_trainer(tiny_config(), {"dcn": 2, "data": 1, "fsdp": 4, "tensor": 1})
    spec = trainer.state_shardings.params["token_embedder"]["embedding"].spec
    assert "dcn" not in jax.tree.leaves(tuple(spec)) and "fsdp" in jax.tree.leaves(tuple(spec))


class _SliceDevice:
    def __init__(self, index, slice_index):
        self.id, self.slice_index, self.process_index = index, slice_index, 0


def test_slices_of_real_devices_follow_their_slice_index():
    # Interleaved on purpose: grouping must follow slice_index, not device order.
    devices = [_SliceDevice(i, i % 2) for i in range(8)]
    groups = partitioning.slice_groups(devices, 2)
    assert [[d.id for d in g] for g in groups] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    with pytest.raises(ValueError, match="span 2 slices but mesh.dcn=1; set --config.mesh.dcn=2"):
        partitioning.slice_groups(devices, 1)


def test_dcn_zero_follows_the_slices_found():
    from t5x_like import config_lib
    config = tiny_config()
    config.batch_size = 16
    assert config_lib.validate_for_devices(config, 8)["dcn"] == 1
    assert config_lib.validate_for_devices(config, 8, num_slices=2) == {
        "dcn": 2, "stage": 1, "data": 4, "fsdp": 1, "expert": 1, "context": 1, "tensor": 1}
    config.mesh.dcn = 4
    with pytest.raises(errors.ConfigError, match="span 2 slices but mesh.dcn=4"):
        config_lib.validate_for_devices(config, 8, num_slices=2)


def test_a_mesh_that_does_not_divide_a_parameter_is_one_line_before_compiling():
    """Two heads over tensor 8 (JAX's IndivisibleError, deep in a traceback, before):
    a user error naming the parameter, its shape, the dimension and the mesh axis."""
    config = tiny_config(**{"partitioning.rules": "fsdp_tensor"})
    with pytest.raises(errors.UserError, match=(
            r"^params/\S+/kernel \(32, 2, 16\): its dimension 1 \(2\) does not split over "
            r"mesh.tensor=8; make mesh.tensor divide 2, or choose partitioning.rules that "
            r"leave that dimension whole.$")):
        trainer_lib.build_trainer(config, partitioning.make_mesh({"tensor": 8}))
