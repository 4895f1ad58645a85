"""Knowledge distillation's terms (Hinton et al. 2015; Sanh et al. 2019), per position;
``t5x_like/modes/distill.py`` weighs them against the student's own objective."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def soft_target_loss(student_logits, teacher_logits, temperature: float) -> jax.Array:
    """Per position: T² · KL(softmax(t/T) || softmax(s/T)); its gradient in the student's
    logits is T · (softmax(s/T) - softmax(t/T)), zero when the two agree."""
    t = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
    s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
    return temperature ** 2 * (jnp.exp(t) * (t - s)).sum(axis=-1)


def cosine_loss(student_hidden, teacher_hidden) -> jax.Array:
    """Per position: 1 - cos(student, teacher)."""
    s = student_hidden.astype(jnp.float32)
    t = teacher_hidden.astype(jnp.float32)
    cos = (s * t).sum(-1) / jnp.maximum(
        jnp.linalg.norm(s, axis=-1) * jnp.linalg.norm(t, axis=-1), 1e-8)
    return 1.0 - cos
