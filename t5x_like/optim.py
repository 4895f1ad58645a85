"""Optimizers and learning-rate schedules (optax), built from the ``optimizer`` config."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def learning_rate_schedule(cfg, num_train_steps: int) -> optax.Schedule:
    """Linear warmup to ``learning_rate``, then constant, 1/sqrt(step), linear or cosine decay;
    the decays end at ``final_learning_rate_fraction`` of the peak at the last step
    (Chinchilla: cosine to 10% at the run's own end)."""
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
    prefixes and prompts added (``added``; ``models.peft.is_peft_param``) and, with
    ``bitfit`` (Ben Zaken et al.), the bias terms; the rest of the model stays frozen."""
    from t5x_like.models import peft

    def trains(path, leaf) -> bool:
        if not (bitfit or added):
            return True
        keys = tuple(str(getattr(k, "key", k)) for k in path)
        return (keys[0] == "head" or (added and peft.is_peft_param(keys))
                or (bitfit and keys[-1] == "bias"))
    return jax.tree_util.tree_map_with_path(trains, params)


def make_optimizer(cfg, num_train_steps: int, trainable=None
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """``trainable``: ``params -> bool tree`` (see ``trainable_mask``); frozen parameters
    get a zero update and no optimizer state at all (``optax.multi_transform``)."""
    schedule = learning_rate_schedule(cfg, num_train_steps)
    if cfg.name == "adafactor":
        # T5's defaults: factored second moments, parameter scaling, update clipping at 1.
        tx = optax.adafactor(learning_rate=schedule, multiply_by_parameter_scale=True,
                             clipping_threshold=1.0, decay_rate=0.8,
                             weight_decay_rate=cfg.weight_decay or None)
    elif cfg.name == "adamw":
        tx = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay,
                         mask=decay_mask)
    else:
        raise ValueError(f"Unknown optimizer.name {cfg.name!r}; choose adafactor or adamw.")
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
    from jax.sharding import PartitionSpec

    def split(x):
        rows = x.shape[0] // num_microbatches
        x = x.reshape((rows, num_microbatches) + x.shape[1:]).swapaxes(0, 1)
        if batch_axes is None:  # no mesh: nothing to constrain
            return x
        return jax.lax.with_sharding_constraint(
            x, PartitionSpec(None, batch_axes, *([None] * (x.ndim - 2))))
    return jax.tree.map(split, batch)


def accumulate_gradients(loss_and_grad, params, batch, num_microbatches: int, batch_axes):
    """Sums ``loss_and_grad(params, microbatch, index) -> ((objective, metrics), grads)``
    over ``num_microbatches`` slices of ``batch`` with a scan, so activation memory
    is that of one microbatch.

    Objectives are normalised by the whole batch (see ``objectives``), so the sum
    of the microbatch gradients is the gradient of the whole batch. Per-token
    metrics are averaged weighted by ``num_target_tokens``; that count is summed.
    """
    if num_microbatches == 1:
        return loss_and_grad(params, batch, 0)
    micro = split_microbatches(batch, num_microbatches, batch_axes)

    def body(carry, inputs):
        index, microbatch = inputs
        (objective, metrics), grads = loss_and_grad(params, microbatch, index)
        tokens = metrics["num_target_tokens"]
        weighted = {k: (v if k == "num_target_tokens" else v * tokens) for k, v in metrics.items()}
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
    metrics = {k: (v if k == "num_target_tokens" else v / tokens) for k, v in sums.items()}
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    return (objective, metrics), grads
