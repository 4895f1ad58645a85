import jax
import numpy as np

from t5x_like import models, optim, partitioning, trainer as trainer_lib

from conftest import tiny_config


def build_trainer(config, mesh_shape):
    model = models.build_model(config.model)
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
    for (path, sharding), shape in zip(flat, shapes):
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
                              jax.tree.leaves(trainer.state_shardings.opt_state)):
        assert len(sharding.spec) <= len(leaf.shape)
        sharding.shard_shape(leaf.shape)  # raises if a sharded dim does not divide


def test_tensor_rules_shard_heads_and_mlp():
    config = tiny_config(**{"partitioning.rules": "fsdp_tensor"})
    trainer = build_trainer(config, {"data": 2, "fsdp": 2, "tensor": 2})
    mlp = trainer.state_shardings.params["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    assert tuple(mlp.spec) == ("fsdp", "tensor")


def test_global_batch_is_split_over_data_axes():
    mesh = partitioning.make_mesh({"data": 2, "fsdp": 4, "tensor": 1})
    batch = partitioning.global_batch({"x": np.arange(32).reshape(16, 2)}, mesh)
    assert batch["x"].shape == (16, 2)
    assert batch["x"].sharding.shard_shape((16, 2)) == (2, 2)
