"""Optimizers and learning-rate schedules (optax), built from the ``optimizer`` config."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec
from optax.contrib import MuonDimensionNumbers, ScheduleFreeState

from t5x_like.models import peft_modules as peft


def learning_rate_schedule(cfg, num_train_steps: int) -> optax.Schedule:
    """Linear warmup to ``learning_rate``, then constant, 1/sqrt(step), linear or cosine decay,
    or warmup-stable-decay; the decays end at ``final_learning_rate_fraction`` of the peak
    at the last step (Chinchilla: cosine to 10% at the run's own end).

    WSD (MiniCPM, Hu et al. 2024) holds the peak and decays linearly over the last
    ``decay_fraction`` of the steps after warmup: the stable phase's checkpoints can be
    continued for longer or decayed, which a cosine fixed to one length cannot."""
    peak = cfg.learning_rate
    final = peak * float(cfg.get("final_learning_rate_fraction", 0.0))
    warmup = max(int(cfg.warmup_steps), 0)
    decay_steps = max(num_train_steps - warmup, 1)
    if cfg.schedule == "constant":
        after = optax.constant_schedule(peak)
    elif cfg.schedule == "rsqrt":
        # T5: lr = peak * sqrt(warmup / step) after warmup, continuous at the boundary.
        base = max(warmup, 1)
        def after(count):
            return peak * jnp.sqrt(base / (count + base))
    elif cfg.schedule == "linear":
        after = optax.linear_schedule(peak, final, decay_steps)
    elif cfg.schedule == "cosine":
        after = optax.cosine_decay_schedule(peak, decay_steps, alpha=final / peak if peak else 0.0)
    elif cfg.schedule == "wsd":
        decay = min(max(round(float(cfg.get("decay_fraction", 0.1)) * decay_steps), 1), decay_steps)
        after = optax.join_schedules([optax.constant_schedule(peak),
                                      optax.linear_schedule(peak, final, decay)],
                                     [decay_steps - decay])
    else:
        raise ValueError(f"Unknown optimizer.schedule {cfg.schedule!r}.")
    if warmup == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])


NO_DECAY_NAMES = ("bias", "scale")


def decay_mask(params):
    """True where AdamW's weight decay applies: weight matrices and embeddings.

    Norm scales and biases are skipped by name (attention biases can be 2-D, so
    the rank alone is not enough) and anything below rank 2 is skipped too.
    """
    def decays(path, leaf) -> bool:
        name = str(getattr(path[-1], "key", path[-1])) if path else ""
        return leaf.ndim > 1 and name not in NO_DECAY_NAMES
    return jax.tree_util.tree_map_with_path(decays, params)


def trainable_mask(params, bitfit: bool = False, added: bool = False):
    """True where a parameter trains. Everything, unless parameter-efficient tuning is
    on: then a fine-tuning head (``head/...``) trains, the parameters LoRA, adapters,
    prefixes and prompts added (``added``; ``models.peft_modules.is_peft_param``) and, with
    ``bitfit`` (Ben Zaken et al.), the bias terms; the rest of the model stays frozen."""
    def trains(path, leaf) -> bool:
        if not (bitfit or added):
            return True
        keys = tuple(str(getattr(k, "key", k)) for k in path)
        return (keys[0] == "head" or (added and peft.is_peft_param(keys))
                or (bitfit and keys[-1] == "bias"))
    return jax.tree_util.tree_map_with_path(trains, params)


# Logical axes that index a stack of layers (``nn.scan``): Muon orthogonalises each layer's
# matrix on its own.
STACK_AXES = ("layers",)


def muon_dimension_numbers(logical_axes):
    """Which parameters Muon orthogonalises, and as which matrix, from their logical axis
    names (a tree of name tuples beside the params).

    A projection kernel that reads the residual stream (``embed`` first: query, key,
    value, the MLP's input) is the matrix ``embed x (the rest)``; one that writes it
    (``embed`` last: the attention output ``heads x kv x embed``, the MLP's output) is
    ``(the rest) x embed``; stacked layers are batch axes. Everything else goes to
    AdamW, as Muon's authors recommend: embeddings and the output layer (a ``vocab``
    axis), fine-tuning heads, norms, biases, position biases and the parameters PEFT
    adds (not named ``kernel``)."""

    def numbers(path, names):
        leaf = str(getattr(path[-1], "key", path[-1])) if path else ""
        head = str(getattr(path[0], "key", path[0])) if path else ""
        matrix = [i for i, name in enumerate(names) if name not in STACK_AXES]
        if (leaf != "kernel" or head == "head" or "vocab" in names or "embed" not in names
                or len(matrix) < 2):
            return None
        if names[matrix[-1]] == "embed":
            return MuonDimensionNumbers(tuple(matrix[:-1]), (matrix[-1],))
        if names[matrix[0]] == "embed":
            return MuonDimensionNumbers((matrix[0],), tuple(matrix[1:]))
        return None
    return jax.tree_util.tree_map_with_path(numbers, logical_axes,
                                            is_leaf=lambda x: isinstance(x, tuple))


def _muon(cfg, schedule, logical_axes) -> optax.GradientTransformation:
    """``optax.contrib.muon``: Newton-Schulz orthogonalised momentum on the projection
    matrices, AdamW (``b1``, ``b2``) on the rest. Updates are scaled to AdamW's RMS
    (Moonlight, Liu et al. 2025: ``0.2 sqrt(max(fan_in, fan_out))``), so one
    ``learning_rate`` and ``weight_decay`` serve both groups. Weight decay applies to
    the Muon matrices; the AdamW group is not decayed (modded-nanogpt)."""
    if logical_axes is None:
        raise ValueError("Muon needs the parameters' logical axis names (logical_axes).")
    return optax.contrib.muon(
        schedule, beta=cfg.get("muon_momentum", 0.95), weight_decay=cfg.weight_decay,
        adam_b1=cfg.b1, adam_b2=cfg.b2, consistent_rms=0.2,
        muon_weight_dimension_numbers=muon_dimension_numbers(logical_axes()))


def _schedule_free_adamw(cfg, schedule) -> optax.GradientTransformation:
    """Schedule-free AdamW (Defazio et al. 2024) through ``optax.contrib.schedule_free``:
    the AdamW step without momentum, its weight decay masked as ``adamw``'s. The
    trained params are the interpolation ``y``; evaluate and export the average ``x``
    (``evaluation_params``)."""
    base = optax.chain(
        optax.scale_by_rms(decay=cfg.b2, eps=1e-8, eps_in_sqrt=False, bias_correction=True),
        optax.add_decayed_weights(cfg.weight_decay, mask=decay_mask),
        optax.scale_by_learning_rate(schedule))
    return optax.contrib.schedule_free(base, learning_rate=schedule, b1=cfg.b1)


def _schedule_free_states(opt_state) -> list:

    def is_state(x):
        return isinstance(x, ScheduleFreeState)
    return [s for s in jax.tree.leaves(opt_state, is_leaf=is_state) if is_state(s)]


def is_schedule_free(opt_state) -> bool:
    """Whether ``opt_state`` (or its abstract shapes) is schedule-free's: its params are
    not the model to evaluate."""
    return bool(_schedule_free_states(opt_state))


def evaluation_params(opt_state, params):
    """The params to evaluate, checkpoint readers and export: ``params`` itself, except
    under schedule-free optimisation, whose averaged iterate ``x = (y - (1 - b1) z) / b1``
    is the model (frozen parameters have no ``z`` and stay as they are)."""
    found = _schedule_free_states(opt_state)
    if not found:
        return params
    state = found[0]
    masked = optax.transforms.MaskedNode
    z_leaves = dict(jax.tree_util.tree_flatten_with_path(
        state.z, is_leaf=lambda x: isinstance(x, masked))[0])

    def average(path, y):
        z = z_leaves.get(path)
        if z is None or isinstance(z, masked):
            return y
        return ((y - (1.0 - state.b1) * z) / state.b1).astype(y.dtype)
    return jax.tree_util.tree_map_with_path(average, params)


def make_optimizer(cfg, num_train_steps: int, trainable=None, logical_axes=None
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """``trainable``: ``params -> bool tree`` (see ``trainable_mask``); frozen parameters
    get a zero update and no optimizer state at all (``optax.multi_transform``).
    ``logical_axes``: ``() -> tree of logical axis names`` beside the params, which Muon
    reads to find its matrices (called only for Muon)."""
    schedule = learning_rate_schedule(cfg, num_train_steps)
    if cfg.name == "muon":
        tx = _muon(cfg, schedule, logical_axes)
    elif cfg.name == "schedule_free_adamw":
        tx = _schedule_free_adamw(cfg, schedule)
    elif cfg.name == "adafactor":
        # T5's defaults: factored second moments, parameter scaling, update clipping at 1.
        tx = optax.adafactor(learning_rate=schedule, multiply_by_parameter_scale=True,
                             clipping_threshold=1.0, decay_rate=0.8,
                             weight_decay_rate=cfg.weight_decay or None)
    elif cfg.name == "adamw":
        tx = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay,
                         mask=decay_mask)
    else:
        raise ValueError(f"Unknown optimizer.name {cfg.name!r}; choose adafactor, adamw, muon "
                         "or schedule_free_adamw.")
    if cfg.grad_clip_norm and cfg.grad_clip_norm > 0:
        tx = optax.chain(optax.clip_by_global_norm(cfg.grad_clip_norm), tx)
    if trainable is not None:
        tx = optax.multi_transform(
            {"train": tx, "frozen": optax.set_to_zero()},
            lambda params: jax.tree.map(lambda t: "train" if t else "frozen", trainable(params)))
    return tx, schedule


def split_microbatches(batch, num_microbatches: int, batch_axes):
    """``[B, ...]`` -> ``[k, B/k, ...]`` where microbatch ``i`` takes rows ``i, i+k, ...``.

    Strided rows keep every device's share of each microbatch equal (a contiguous
    split would put a whole microbatch on a few devices of the data axes).
    ``batch_axes`` are the mesh axes of the batch dimension (None: no mesh).
    """

    def split(x):
        rows = x.shape[0] // num_microbatches
        x = x.reshape((rows, num_microbatches) + x.shape[1:]).swapaxes(0, 1)
        if batch_axes is None:  # no mesh: nothing to constrain
            return x
        return jax.lax.with_sharding_constraint(
            x, PartitionSpec(None, batch_axes, *([None] * (x.ndim - 2))))
    return jax.tree.map(split, batch)


def _is_count(metric: str) -> bool:
    """A metric that counts (tokens, completions): summed over microbatches, not averaged."""
    return metric.startswith("num_")


def accumulate_gradients(loss_and_grad, params, batch, num_microbatches: int, batch_axes):
    """Sums ``loss_and_grad(params, microbatch, index) -> ((objective, metrics), grads)``
    over ``num_microbatches`` slices of ``batch`` with a scan, so activation memory
    is that of one microbatch.

    Objectives are normalised by the whole batch (see ``objectives``), so the sum
    of the microbatch gradients is the gradient of the whole batch. Per-token
    metrics are averaged weighted by ``num_target_tokens``; counts (``num_*`` metrics,
    that one too) are summed.
    """
    if num_microbatches == 1:
        return loss_and_grad(params, batch, 0)
    micro = split_microbatches(batch, num_microbatches, batch_axes)

    def body(carry, inputs):
        index, microbatch = inputs
        (objective, metrics), grads = loss_and_grad(params, microbatch, index)
        tokens = metrics["num_target_tokens"]
        weighted = {k: (v if _is_count(k) else v * tokens) for k, v in metrics.items()}
        acc_objective, acc_metrics, acc_grads = carry
        acc_grads = jax.tree.map(lambda a, g: a + g.astype(a.dtype), acc_grads, grads)
        acc_metrics = jax.tree.map(jnp.add, acc_metrics, weighted)
        return (acc_objective + objective, acc_metrics, acc_grads), None

    first = jax.tree.map(lambda x: x[0], micro)
    metric_shapes = jax.eval_shape(lambda: loss_and_grad(params, first, 0)[0][1])
    init = (jnp.zeros((), jnp.float32),
            jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), metric_shapes),
            jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params))
    (objective, sums, grads), _ = jax.lax.scan(
        body, init, (jnp.arange(num_microbatches), micro))
    tokens = jnp.maximum(sums["num_target_tokens"], 1.0)
    metrics = {k: (v if _is_count(k) else v / tokens) for k, v in sums.items()}
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    return (objective, metrics), grads
