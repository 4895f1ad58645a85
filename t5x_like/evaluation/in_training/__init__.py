"""Evaluations during training, built by kind from ``config.evals`` (big_vision's
evaluators): the loop asks each one whether it is due and calls it; it never knows
the kinds. A kind is one module here and one line in ``KINDS``; a kind of your own
registers with ``register`` from your ``--module`` (its settings class joins the
spec's, ``config.evals``).

Each kind has two halves: ``prepare`` runs while the run resolves, before the workdir
lock and any compile (a missing mixture, an uninstalled package, a harness task that
does not load are refused there); the evaluator itself is built once the train state
exists and returns flat metrics at the steps its ``every_steps`` names.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from t5x_like.config import register_eval_spec
from t5x_like.config.evals import EvalSpec
from t5x_like.evaluation.in_training.base import TrainingEvaluator
from t5x_like.evaluation.in_training.benchmark import BenchmarkEvaluator
from t5x_like.evaluation.in_training.harness import HarnessEvaluator
from t5x_like.evaluation.in_training.held_out import HeldOutLossEvaluator


@dataclasses.dataclass
class Context:
    """What evaluators read from the run once its state exists: the spec, the trainer
    (mesh, eval step), the vocabulary the run asked for (None: each task's own), the
    held-out streams and this process's rows of them, and the progress printer."""

    spec: Any
    trainer: Any
    vocabulary: Any
    eval_streams: Any
    host_batches: Any
    num_streams: int
    progress: Any


__all__ = ["Context", "KINDS", "TrainingEvaluator", "build", "register"]

# The built-in kinds; a training mode registers its own with its record (online RL's
# ``rollouts``: ``modes.rl``).
KINDS: dict[str, type] = {cls.KIND: cls for cls in (
    HeldOutLossEvaluator, BenchmarkEvaluator, HarnessEvaluator)}


def register(evaluator_class: type) -> None:
    """A kind of your own: ``evaluator_class`` with ``KIND``, ``SPEC`` (an ``EvalSpec``
    subclass of its settings), ``prepare(name, settings, spec, vocabulary)`` and, built
    as ``evaluator_class(name, settings, prepared, context)``, ``evaluate(params, step)
    -> dict`` of metrics."""
    spec = getattr(evaluator_class, "SPEC", None)
    if not (isinstance(spec, type) and issubclass(spec, EvalSpec) and spec.KIND
            == getattr(evaluator_class, "KIND", None)):
        raise TypeError(f"{evaluator_class!r} needs KIND and an EvalSpec subclass SPEC with "
                        "the same KIND.")
    register_eval_spec(spec)
    KINDS[evaluator_class.KIND] = evaluator_class


def build(spec, prepared: dict, context: Context) -> list:
    """The evaluators of the run, in the order ``config.evals`` lists them (``prepared``
    holds the ones turned on); a held-out evaluation turned off is said once."""
    for name, settings in spec.evals.items():
        if settings.kind == HeldOutLossEvaluator.KIND and not settings.enabled:
            context.progress.message(
                f"Held-out evaluation is off (evals.{name}.every_steps=0).")
    return [KINDS[spec.evals[name].kind](name, spec.evals[name], found, context)
            for name, found in prepared.items()]
