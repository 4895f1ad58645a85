"""Train state, its shardings, and the jitted train and eval steps.

``train_step(state, batch) -> (state, metrics)`` is a pure function; the loop in
``train.py`` owns everything with side effects.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from t5x_like import models, partitioning


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


LossFn = Callable[..., tuple[jax.Array, dict]]


def abstract_boxed_params(model: nn.Module, model_feature_lengths: Mapping[str, int]):
    """Shapes and logical names of every parameter, without allocating anything."""
    inputs = models.example_inputs(model, dict(model_feature_lengths))
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), *inputs))
    return variables["params"]


def _path_tuple(path) -> tuple:
    return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def optimizer_state_shardings(abstract_opt_state, abstract_params, param_shardings, mesh):
    """Each optimizer leaf follows the parameter it belongs to.

    Optax states mirror the parameter tree (Adam moments) or drop one dimension of
    it (Adafactor's factored row/column statistics); leaves are matched to their
    parameter by path suffix and shape, anything else (counts) is replicated.
    """
    by_path = {}
    for (path, leaf), sharding in zip(
            jax.tree_util.tree_flatten_with_path(abstract_params)[0],
            jax.tree.leaves(param_shardings)):
        spec = tuple(sharding.spec) + (None,) * (leaf.ndim - len(sharding.spec))
        by_path[_path_tuple(path)] = (tuple(leaf.shape), spec)

    def leaf_sharding(path, leaf):
        keys = _path_tuple(path)
        for start in range(len(keys)):
            match = by_path.get(keys[start:])
            if match is None:
                continue
            shape, spec = match
            if tuple(leaf.shape) == shape:
                return NamedSharding(mesh, PartitionSpec(*spec))
            for dropped in range(len(shape)):
                if shape[:dropped] + shape[dropped + 1:] == tuple(leaf.shape):
                    return NamedSharding(mesh, PartitionSpec(*(spec[:dropped] + spec[dropped + 1:])))
            break
        return partitioning.replicated(mesh)

    return jax.tree_util.tree_map_with_path(leaf_sharding, abstract_opt_state)


class Trainer:
    """Holds the model, optimizer, mesh and rules; builds sharded state and jitted steps."""

    def __init__(self, model: nn.Module, loss_fn: LossFn, optimizer: optax.GradientTransformation,
                 schedule: optax.Schedule, mesh, rules, model_feature_lengths: Mapping[str, int],
                 seed: int = 0):
        self.model = model
        self.seed = seed
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.schedule = schedule
        self.mesh = mesh
        self.rules = rules
        self.model_feature_lengths = dict(model_feature_lengths)

        boxed = abstract_boxed_params(model, self.model_feature_lengths)
        param_shardings = partitioning.logical_shardings(boxed, mesh, rules)
        abstract_params = nn.unbox(boxed)
        abstract_opt_state = jax.eval_shape(optimizer.init, abstract_params)
        self.state_shardings = TrainState(
            step=partitioning.replicated(mesh),
            params=param_shardings,
            opt_state=optimizer_state_shardings(abstract_opt_state, abstract_params,
                                                param_shardings, mesh))
        abstract_state = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32),
                                    params=abstract_params, opt_state=abstract_opt_state)
        self.abstract_state = jax.tree.map(
            lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
            abstract_state, self.state_shardings)
        self.batch_sharding = partitioning.batch_sharding(mesh)
        self._init = jax.jit(self._init_state, out_shardings=self.state_shardings)
        self._train_step = jax.jit(
            self._train_step_fn,
            in_shardings=(self.state_shardings, self.batch_sharding),
            out_shardings=(self.state_shardings, partitioning.replicated(mesh)),
            donate_argnums=(0,))
        self._eval_step = jax.jit(
            self._eval_step_fn,
            in_shardings=(self.state_shardings.params, self.batch_sharding),
            out_shardings=partitioning.replicated(mesh))

    # -- pure functions, traced under the mesh and axis rules ----------------
    def _init_state(self, rng):
        inputs = models.example_inputs(self.model, self.model_feature_lengths)
        params = nn.unbox(self.model.init(rng, *inputs)["params"])
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=self.optimizer.init(params))

    def _train_step_fn(self, state: TrainState, batch):
        # Dropout randomness derives from (seed, step): resumed runs replay it exactly.
        rng = jax.random.fold_in(jax.random.key(self.seed + 1), state.step)
        grad_fn = jax.value_and_grad(
            lambda params: self.loss_fn(self.model, params, batch, rng), has_aux=True)
        (_, metrics), grads = grad_fn(state.params)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(metrics, learning_rate=self.schedule(state.step),
                       grad_norm=optax.tree.norm(grads))
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    def _eval_step_fn(self, params, batch):
        _, metrics = self.loss_fn(self.model, params, batch, None)
        tokens = metrics["num_target_tokens"]
        return {"loss_sum": metrics["loss"] * tokens, "correct_sum": metrics["accuracy"] * tokens,
                "num_target_tokens": tokens}

    # -- entry points ---------------------------------------------------------
    def _context(self):
        return _MeshAndRules(self.mesh, self.rules)

    def init_state(self, seed: int) -> TrainState:
        with self._context():
            return self._init(jax.random.key(seed))

    def train_step(self, state: TrainState, batch) -> tuple[TrainState, dict]:
        with self._context():
            return self._train_step(state, batch)

    def lower_train_step(self, state: TrainState, batch):
        """The lowered train step, for ahead-of-time compilation and cost analysis."""
        with self._context():
            return self._train_step.lower(state, batch)

    def eval_step(self, params, batch) -> dict:
        with self._context():
            return self._eval_step(params, batch)


class _MeshAndRules:
    """``jax.set_mesh`` + flax logical axis rules, entered together."""

    def __init__(self, mesh, rules):
        self._mesh_cm = jax.set_mesh(mesh)
        self._rules_cm = nn.logical_axis_rules(rules)

    def __enter__(self):
        self._mesh_cm.__enter__()
        self._rules_cm.__enter__()

    def __exit__(self, *exc):
        self._rules_cm.__exit__(*exc)
        self._mesh_cm.__exit__(*exc)
        return False


def param_count(params) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(params))


