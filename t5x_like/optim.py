"""Optimizers and learning-rate schedules (optax), built from the ``optimizer`` config."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def learning_rate_schedule(cfg, num_train_steps: int) -> optax.Schedule:
    """Linear warmup to ``learning_rate``, then constant, 1/sqrt(step), linear or cosine decay."""
    peak = cfg.learning_rate
    warmup = max(int(cfg.warmup_steps), 0)
    decay_steps = max(num_train_steps - warmup, 1)
    if cfg.schedule == "constant":
        after = optax.constant_schedule(peak)
    elif cfg.schedule == "rsqrt":
        # T5: lr = peak * sqrt(warmup / step) after warmup, continuous at the boundary.
        base = max(warmup, 1)
        after = lambda count: peak * jnp.sqrt(base / (count + base))
    elif cfg.schedule == "linear":
        after = optax.linear_schedule(peak, 0.0, decay_steps)
    elif cfg.schedule == "cosine":
        after = optax.cosine_decay_schedule(peak, decay_steps)
    else:
        raise ValueError(f"Unknown optimizer.schedule {cfg.schedule!r}.")
    if warmup == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])


def _decay_mask(params):
    """Weight decay only on matrices: norms' scales and biases (1-D) are skipped."""
    return jax.tree.map(lambda p: p.ndim > 1, params)


def make_optimizer(cfg, num_train_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    schedule = learning_rate_schedule(cfg, num_train_steps)
    if cfg.name == "adafactor":
        # T5's defaults: factored second moments, parameter scaling, update clipping at 1.
        tx = optax.adafactor(learning_rate=schedule, multiply_by_parameter_scale=True,
                             clipping_threshold=1.0, decay_rate=0.8,
                             weight_decay_rate=cfg.weight_decay or None)
    elif cfg.name == "adamw":
        tx = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay,
                         mask=_decay_mask)
    else:
        raise ValueError(f"Unknown optimizer.name {cfg.name!r}; choose adafactor or adamw.")
    if cfg.grad_clip_norm and cfg.grad_clip_norm > 0:
        tx = optax.chain(optax.clip_by_global_norm(cfg.grad_clip_norm), tx)
    return tx, schedule
