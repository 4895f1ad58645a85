"""Train state, its shardings, and the jitted train and eval steps.

``train_step(state, batch) -> (state, metrics)`` is a pure function; the loop in
``train.py`` owns everything with side effects.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from t5x_like import models, structures
from t5x_like.config import check_devices, spec_of
from t5x_like.engine import optim, partitioning
from t5x_like.models import context_parallel, layers, peft_modules, pipeline_parallel, quantization
from t5x_like.models import peft_modules as peft
from t5x_like.system import traced_platform


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


LossFn = Callable[..., tuple[jax.Array, dict]]


def loss_weights(batch) -> jax.Array | None:
    """The batch's loss-weight feature (``decoder_loss_weights`` or ``encoder_loss_weights``;
    None for rows without one, preference pairs, whose losses average over pairs)."""
    keys = [k for k in batch if k.endswith("_loss_weights")]
    if not keys:
        return None
    if len(keys) != 1:
        raise ValueError(f"Expected one *_loss_weights feature in the batch, found {sorted(batch)}.")
    return batch[keys[0]]


def abstract_boxed_params(model: nn.Module, model_feature_lengths: Mapping[str, int]):
    """Shapes and logical names of every parameter, without allocating anything."""
    inputs = models.example_inputs(model, dict(model_feature_lengths))
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), *inputs))
    return variables["params"]


def abstract_boxed_params_for(model: nn.Module, model_feature_lengths: Mapping[str, int], mesh,
                              settings: pipeline_parallel.PipelineSettings):
    """``abstract_boxed_params`` as traced for ``mesh``: its platform's attention kernels
    and a pipeline's parameter layout (``settings.stages``), the mesh itself not entered
    (an example batch of one row would not divide over it)."""
    with traced_for(mesh, settings):
        return abstract_boxed_params(model, model_feature_lengths)


@contextlib.contextmanager
def traced_for(mesh, settings: pipeline_parallel.PipelineSettings):
    with (traced_platform.target_platform(mesh.devices.flat[0].platform),
          pipeline_parallel.pipeline_settings(settings)):
        yield


def logical_axes(boxed_params):
    """Each parameter's logical axis names as a tuple (``()`` for one without names), in
    the params' tree: what the sharding rules read, and Muon to find its matrices."""
    specs = nn.get_partition_spec(boxed_params)
    return jax.tree.map(lambda spec: tuple(spec), specs,
                        is_leaf=lambda x: isinstance(x, PartitionSpec))


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
            jax.tree.leaves(param_shardings), strict=False):
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
                 seed: int = 0, microbatches: int = 1, loss_normalizer: float | None = None,
                 skip_nonfinite_updates: bool = False, trainable=None,
                 context_settings: context_parallel.ContextSettings | None = None,
                 pipeline_settings: pipeline_parallel.PipelineSettings | None = None,
                 log_batch_checksum: bool = False,
                 quant_settings: quantization.QuantSettings | None = None):
        """``microbatches`` > 1 accumulates gradients over that many slices of each batch;
        ``loss_normalizer`` divides summed losses by a constant instead of the real
        target-token count; ``skip_nonfinite_updates`` keeps params and optimizer
        state unchanged on a step whose loss or gradient is NaN/Inf; ``trainable``
        (``params -> bool tree``) freezes the rest: no gradient flows into a frozen
        parameter and the gradient norm counts only trainable ones. ``context_settings``:
        how attention works across a ``context`` mesh axis; ``pipeline_settings``: the
        schedule over a ``stage`` axis. ``log_batch_checksum``: each
        step's metrics get ``batch_checksum`` (the function below). ``quant_settings``:
        the train and eval steps run ``model`` with Qwix's quantized matmuls
        (``models.quantization``); its parameters stay float."""
        self.quant_settings = quant_settings or quantization.QuantSettings()
        self.log_batch_checksum = log_batch_checksum
        self.context_settings = context_settings or context_parallel.ContextSettings()
        self.pipeline_settings = dataclasses.replace(
            pipeline_settings or pipeline_parallel.PipelineSettings(),
            stages=pipeline_parallel.stages_of(mesh, rules))
        self.microbatches = int(microbatches)
        self.loss_normalizer = loss_normalizer
        self.skip_nonfinite_updates = skip_nonfinite_updates
        self.seed = seed
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.schedule = schedule
        self.mesh = mesh
        self.rules = rules
        self.model_feature_lengths = dict(model_feature_lengths)
        with traced_for(self.mesh, self.pipeline_settings):  # as the params are traced
            self.model = quantization.with_quantized_training(
                model, self.quant_settings, self.model_feature_lengths)

        boxed = self._abstract_boxed_params(model)
        param_shardings = partitioning.logical_shardings(boxed, mesh, rules)
        abstract_params = nn.unbox(boxed)
        partitioning.check_divisible(abstract_params, param_shardings)
        self.trainable = None if trainable is None else trainable(abstract_params)
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
        self.batch_sharding = partitioning.batch_sharding(mesh, rules)
        self._init = jax.jit(self._init_state, out_shardings=self.state_shardings)
        self.frozen_params = None
        self._jit_steps()
        self._schedule_free = optim.is_schedule_free(abstract_opt_state)
        self._evaluation_params = jax.jit(
            lambda state: optim.evaluation_params(state.opt_state, state.params),
            in_shardings=(self.state_shardings,), out_shardings=self.state_shardings.params)
        self._fresh_state = jax.jit(
            lambda params: TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                      opt_state=self.optimizer.init(params)),
            in_shardings=(self.state_shardings.params,), out_shardings=self.state_shardings)

    def _jit_steps(self, frozen_shardings=None, in_evaluation: bool = False) -> None:
        """The jitted train and eval steps; with ``frozen_shardings`` the train step (and
        with ``in_evaluation`` the eval step) takes a frozen model's params (a teacher, a
        reference) as a last argument (``attach_frozen``)."""
        frozen = () if frozen_shardings is None else (frozen_shardings,)
        self._frozen_in_evaluation = in_evaluation and frozen_shardings is not None
        self._train_step = jax.jit(
            self._train_step_fn,
            in_shardings=(self.state_shardings, self.batch_sharding, *frozen),
            out_shardings=(self.state_shardings, partitioning.replicated(self.mesh)),
            donate_argnums=(0,))
        self._eval_step = jax.jit(
            self._eval_step_fn,
            in_shardings=(self.state_shardings.params, self.batch_sharding,
                          *(frozen if in_evaluation else ())),
            out_shardings=partitioning.replicated(self.mesh))

    # -- pure functions, traced under the mesh and axis rules ----------------
    def _init_state(self, rng):
        inputs = models.example_inputs(self.model, self.model_feature_lengths)
        params = nn.unbox(self.model.init(rng, *inputs)["params"])
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=self.optimizer.init(params))

    def _train_step_fn(self, state: TrainState, batch, frozen_params=None):
        # Dropout randomness derives from (seed, step): resumed runs replay it exactly.
        rng = jax.random.fold_in(jax.random.key(self.seed + 1), state.step)
        normalizer = self.loss_normalizer
        kwargs = {}
        if self.microbatches > 1:
            # Every microbatch divides by the whole batch's tokens (and sequences, for
            # per-sequence terms): the summed gradient is the whole batch's gradient.
            weights = loss_weights(batch)
            if normalizer is None and weights is not None:
                normalizer = jnp.maximum(weights.sum(), 1.0)
            kwargs["num_sequences"] = jax.tree.leaves(batch)[0].shape[0]
        if normalizer is not None:
            kwargs["normalizer"] = normalizer
        if frozen_params is not None:  # a teacher or a reference (attach_frozen)
            kwargs["frozen_params"] = frozen_params

        def loss_and_grad(params, microbatch, index):
            micro_rng = jax.random.fold_in(rng, index)
            return jax.value_and_grad(
                lambda p: self.loss_fn(self.model, self._frozen_cut(p), microbatch, micro_rng,
                                       **kwargs),
                has_aux=True)(params)

        (_, metrics), grads = optim.accumulate_gradients(
            loss_and_grad, state.params, batch, self.microbatches,
            partitioning.batch_axes(self.rules))
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(metrics, learning_rate=self.schedule(state.step), grad_norm=grad_norm)
        if self.log_batch_checksum:
            metrics["batch_checksum"] = batch_checksum(batch)
        if self.skip_nonfinite_updates:
            finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
            def keep(new, old):
                return jnp.where(finite, new, old)

            params = jax.tree.map(keep, params, state.params)
            opt_state = jax.tree.map(keep, opt_state, state.opt_state)
            metrics["skipped_updates"] = 1.0 - finite.astype(jnp.float32)
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    def _frozen_cut(self, params):
        """Frozen parameters behind a stop_gradient: their gradients are zeros XLA
        never computes (their kernel gradients are dead code)."""
        if self.trainable is None:
            return params
        return jax.tree.map(lambda p, t: p if t else jax.lax.stop_gradient(p), params,
                            self.trainable)

    def _eval_step_fn(self, params, batch, frozen_params=None):
        """Token-weighted sums: ``loss_sum``, ``correct_sum`` and ``<metric>_sum`` for the
        objective's other metrics (ELECTRA's discriminator accuracy, BERT's NSP loss)."""
        frozen = {} if frozen_params is None else {"frozen_params": frozen_params}
        _, metrics = self.loss_fn(self.model, params, batch, None, **frozen)
        tokens = metrics["num_target_tokens"]
        sums = {f"{name}_sum": value * tokens for name, value in metrics.items()
                if name not in ("loss", "accuracy", "num_target_tokens")}
        return {**sums, "loss_sum": metrics["loss"] * tokens,
                "correct_sum": metrics["accuracy"] * tokens, "num_target_tokens": tokens}

    def _abstract_boxed_params(self, model):
        """``abstract_boxed_params`` for this mesh (``abstract_boxed_params_for``)."""
        return abstract_boxed_params_for(model, self.model_feature_lengths, self.mesh,
                                         self.pipeline_settings)

    # -- entry points ---------------------------------------------------------
    def _context(self):
        # Qwix's quantized matmuls carry their own gradients, which the CPU backward forms
        # (``layers.contract``'s custom gradient) would replace with float ones.
        return _MeshAndRules(self.mesh, self.rules, self.context_settings, self.pipeline_settings,
                             cpu_forms=not self.quant_settings.on)

    def init_state(self, seed: int) -> TrainState:
        with self._context():
            return self._init(jax.random.key(seed))

    def state_from_params(self, params) -> TrainState:
        """Step 0 with given (e.g. pretrained, host numpy) params and a fresh optimizer state.

        Params are placed onto this mesh's shardings from host memory, so any saved
        layout loads; a structure or shape mismatch names the first differing parameter.
        """
        placed = self.place_params(params)
        with self._context():
            return self._fresh_state(placed)

    def evaluation_params(self, state: TrainState):
        """The params a state stands for when evaluated, checkpoint readers and export:
        its params, or schedule-free's averaged iterate (``optim.evaluation_params``)."""
        if not self._schedule_free:
            return state.params  # no copy: the params are the model
        with self._context():
            return self._evaluation_params(state)

    def trained_params_of(self, restoring: tuple, state: TrainState):
        """The params this trainer's model reads of ``state``, restored onto
        ``restoring``'s trainer (``trainer_to_restore``): its evaluation params, their
        trained part placed here when the run kept helpers beside it."""
        run_trainer, trained = restoring
        params = run_trainer.evaluation_params(state)
        if trained is None:
            return params
        return self.place_params(jax.device_get(trained(params)))

    def place_params(self, params):
        """Host (numpy) params -> sharded ``jax.Array``s on this mesh, checked against the
        model's parameter tree (evaluation needs no optimizer state)."""
        return _place(self.abstract_state.params, params)

    def attach_frozen(self, model: nn.Module, params, loss_fn: LossFn,
                      in_evaluation: bool = False) -> None:
        """A frozen model beside the trained one (distillation's teacher, DPO's reference):
        ``params`` (host arrays of ``model``) become an argument of every train step (and
        with ``in_evaluation`` of every eval step), placed by the model's own logical axes
        on this mesh (sharded as the trained params are, no optimizer state, no
        gradient); ``loss_fn`` takes them as ``frozen_params``. Without
        ``in_evaluation`` evaluation calls ``loss_fn`` without them (distillation scores
        the student's own objective). ``params`` None places their shapes alone, for
        ``lower_train_step`` (the planner)."""
        boxed = self._abstract_boxed_params(model)
        shardings = partitioning.logical_shardings(boxed, self.mesh, self.rules)
        abstract = jax.tree.map(
            lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
            nn.unbox(boxed), shardings)
        # None: abstract params (shapes and shardings), for ahead-of-time compilation
        self.frozen_params = (abstract if params is None
                              else _place(abstract, params, what="Frozen params"))
        self.loss_fn = loss_fn  # traced afresh: the steps are jitted again below
        self._jit_steps(shardings, in_evaluation)

    def _step_args(self, state, batch) -> tuple:
        return (state, batch) if self.frozen_params is None else (state, batch,
                                                                  self.frozen_params)

    def train_step(self, state: TrainState, batch) -> tuple[TrainState, dict]:
        with self._context():
            return self._train_step(*self._step_args(state, batch))

    def lower_train_step(self, state: TrainState, batch):
        """The lowered train step, for ahead-of-time compilation and cost analysis."""
        with self._context():
            return self._train_step.lower(*self._step_args(state, batch))

    def eval_step(self, params, batch) -> dict:
        with self._context():
            if self._frozen_in_evaluation:
                return self._eval_step(params, batch, self.frozen_params)
            return self._eval_step(params, batch)


def _place(expected, params, what: str = "Pretrained params"):
    """Host (numpy) params -> ``jax.Array``s with the shardings of ``expected`` (abstract
    arrays), checked leaf by leaf against its tree."""
    flat_expected = dict(flat_with_paths(expected))
    flat_given = dict(flat_with_paths(params))
    missing = sorted(set(flat_expected) - set(flat_given))
    extra = sorted(set(flat_given) - set(flat_expected))
    if missing or extra:
        raise ValueError(f"{what} do not match the model: missing {missing[:3]}, "
                         f"unexpected {extra[:3]}. Use the model config the params were "
                         "saved with.")
    for path, want in flat_expected.items():
        if tuple(flat_given[path].shape) != tuple(want.shape):
            raise ValueError(f"{what}: {path} has shape {flat_given[path].shape}, the "
                             f"model expects {want.shape}. Use the model config the params "
                             "were saved with.")
    return jax.tree.map(
        lambda want, value: jax.make_array_from_callback(
            want.shape, want.sharding,
            lambda index, value=value: jnp.asarray(value[index], want.dtype)),
        expected, jax.tree.unflatten(jax.tree.structure(expected),
                                     [flat_given[p] for p in flat_expected]))


def trainable_for(config):
    """``params -> bool tree`` of what trains under ``config.peft`` (None: everything)."""
    peft = spec_of(config).peft
    added = peft_modules.PeftSettings.from_config(peft).any
    if not (peft.bitfit or added):
        return None
    return functools.partial(optim.trainable_mask, bitfit=bool(peft.bitfit), added=added)


def build_on_devices(config, devices=None, process_count: int | None = None
                     ) -> tuple[dict, Trainer]:
    """``(mesh shape, trainer)``: the config's mesh over ``devices`` (default: every device
    of the run), checked against them, and the trainer on it. The one set-up of ``train``,
    ``eval``, ``infer`` and ``plan``."""
    spec = spec_of(config)
    devices = jax.devices() if devices is None else list(devices)
    process_count = jax.process_count() if process_count is None else process_count
    mesh_shape = check_devices(spec, len(devices), process_count, partitioning.num_slices(devices))
    mesh = partitioning.make_mesh(mesh_shape, devices, spec.partitioning.split_physical_axes)
    return mesh_shape, build_trainer(spec, mesh)


def build_trainer(config, mesh) -> Trainer:
    """The Trainer a run spec (or config) describes: the structure's model and objective,
    the optimizer and rules (the family's own axes too) on ``mesh``."""
    spec = spec_of(config)
    structure = structures.for_config(spec)
    structure.check_logit_chunks(spec.loss.logit_chunks)
    trainable = trainable_for(spec)
    lengths = structure.model_feature_lengths(spec.task_feature_lengths)
    rules = (partitioning.axis_rules(spec.partitioning.rules, spec.partitioning.pipeline_over_dcn,
                                     spec.partitioning.fsdp_over_dcn)
             + structures.families.of(spec.model).axis_rules(spec.partitioning.rules))
    context_settings = context_parallel.ContextSettings(spec.partitioning.context_attention,
                                                        spec.partitioning.context_load_balance)

    staged = dataclasses.replace(pipeline_settings(spec), stages=pipeline_parallel.stages_of(mesh, rules))

    def traced_logical_axes():  # for this mesh: a pipeline's layout depends on it
        return logical_axes(abstract_boxed_params_for(structure.model, lengths, mesh, staged))
    optimizer, schedule = optim.make_optimizer(
        spec.optimizer, spec.num_train_steps, trainable, logical_axes=traced_logical_axes)
    normalizer = (float(spec.loss.normalizing_constant)
                  if spec.loss.normalization == "constant" else None)
    return Trainer(structure.model, structure.loss_fn(spec.loss), optimizer, schedule, mesh,
                   rules, lengths, seed=spec.seed, microbatches=spec.optimizer.microbatches,
                   loss_normalizer=normalizer,
                   skip_nonfinite_updates=spec.divergence.on_nonfinite_loss == "skip_update",
                   trainable=trainable, context_settings=context_settings,
                   pipeline_settings=pipeline_settings(spec),
                   log_batch_checksum=spec.logging.batch_checksum,
                   quant_settings=quantization.QuantSettings.from_config(spec.quantization))


def trainer_to_restore(run_config, trainer: Trainer):
    """``(trainer, trained part)``: the trainer a checkpoint of the run ``run_config``
    restores onto for a reader whose ``trainer`` holds the model the run trained, and
    what of its params that model reads (``Trainer.trained_params_of``). That trainer
    and None, or, when the run's params hold helpers beside the model
    (``Structure.keeps_helpers``: PPO's value model), the run's own trainer (its params
    and optimizer state restore whole) and ``Structure.trained_params``."""
    structure = structures.for_config(spec_of(run_config))
    if not structure.keeps_helpers:
        return trainer, None
    return build_trainer(run_config, trainer.mesh), structure.trained_params


def trained_model_spec(config):
    """``config`` as the model its run trained for use, where its params hold helpers
    (``mode_structures.as_trained_model``: PPO's policy, a decoder); else ``config``."""
    spec = spec_of(config)
    if not structures.for_config(spec).keeps_helpers:
        return spec
    return structures.mode_structures.as_trained_model(spec)


def pipeline_settings(spec) -> pipeline_parallel.PipelineSettings:
    p = spec.partitioning
    return pipeline_parallel.PipelineSettings(p.pipeline_schedule, p.pipeline_microbatches,
                                     p.pipeline_layers_per_stage)


CHECKSUM_MODULUS = 2**24


def batch_checksum(batch) -> jax.Array:
    """A checksum of a global batch's integer features (tokens, ids, positions) that
    depends on every value and its row and position: the sum over features, rows i and
    positions j of ``value * a(i) * b(j)``, in wrapping 32-bit integers. Integer sums
    do not depend on their order, so the same rows give the same checksum on any mesh
    and process count (``logging.batch_checksum``: two runs' batches compared step by
    step). Reduced mod 2**24 so a float32 metric holds it exactly."""
    total = jnp.zeros((), jnp.uint32)
    for name in sorted(batch):
        value = batch[name]
        if not jnp.issubdtype(value.dtype, jnp.integer) or value.ndim != 2:
            continue
        rows = jnp.arange(value.shape[0], dtype=jnp.uint32) * jnp.uint32(2654435761) + 1
        positions = jnp.arange(value.shape[1], dtype=jnp.uint32) * jnp.uint32(40503) + 7
        weighted = value.astype(jnp.uint32) * rows[:, None] * positions[None, :]
        total = total * jnp.uint32(31) + jnp.sum(weighted, dtype=jnp.uint32)
    return (total % jnp.uint32(CHECKSUM_MODULUS)).astype(jnp.int32)


class _MeshAndRules:
    """``jax.set_mesh``, flax logical axis rules, the mesh platform's choices of
    gradient boundaries (``layers.gradient_boundary``) and attention kernels
    (``traced_platform.target_platform``), and attention across a context axis
    (``context_parallel.context_settings``) and the pipeline schedule over a stage axis
    (``pipeline_parallel.pipeline_settings``), entered together."""

    def __init__(self, mesh, rules, context_settings=None, pipeline_settings=None,
                 cpu_forms: bool = True):
        self._mesh, self._rules = mesh, rules
        self._cpu_forms = cpu_forms
        self._context_settings = context_settings or context_parallel.ContextSettings()
        self._pipeline_settings = pipeline_settings or pipeline_parallel.PipelineSettings()
        self._stack = None

    def __enter__(self):
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(jax.set_mesh(self._mesh))
        self._stack.enter_context(nn.logical_axis_rules(self._rules))
        platform = self._mesh.devices.flat[0].platform
        self._stack.enter_context(layers.gradient_boundaries(platform == "cpu"
                                                             and self._cpu_forms))
        self._stack.enter_context(traced_platform.target_platform(platform))
        self._stack.enter_context(context_parallel.context_settings(self._context_settings))
        self._stack.enter_context(pipeline_parallel.pipeline_settings(self._pipeline_settings))

    def __exit__(self, *exc):
        self._stack.__exit__(*exc)
        return False


def flat_with_paths(tree) -> list[tuple[str, Any]]:
    """``("encoder/layers_0/.../kernel", leaf)`` for every leaf of a parameter tree."""
    return [("/".join(_path_tuple(path)), leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def param_count(params) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(params))


def parameter_shapes(model_config, peft_settings=None) -> dict:
    """Every parameter's shape (``jax.ShapeDtypeStruct``) of a model spec's model (or a
    model section's), with ``peft_settings``' added modules: nothing is allocated."""
    model = structures.build_model(model_config)
    model = peft.with_peft(model, peft_settings or peft.PeftSettings())
    lengths = {"encoder_input_tokens": 8, "decoder_input_tokens": 8, "decoder_target_tokens": 8}
    return nn.unbox(abstract_boxed_params(model, lengths))


def flat_parameter_shapes(model_config) -> list[tuple[str, tuple[int, ...]]]:
    """``("encoder/layers_0/.../kernel", shape)`` for every parameter of the model."""
    return [(name, tuple(leaf.shape))
            for name, leaf in flat_with_paths(parameter_shapes(model_config))]
