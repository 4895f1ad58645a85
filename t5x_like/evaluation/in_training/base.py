"""What every evaluator during training shares."""

from __future__ import annotations

from typing import ClassVar


class TrainingEvaluator:
    """An evaluator of ``config.evals.<name>``: ``prepare`` (while the run resolves) and
    ``evaluate`` (when due); subclasses set ``KIND``, ``SPEC`` and the metric spelling
    of the evaluator the old ``config.eval`` made (``DEFAULT_NAME``, ``DEFAULT_PREFIX``)."""

    KIND: ClassVar[str] = ""
    SPEC: ClassVar[type] = None
    DEFAULT_NAME: ClassVar[str] = ""
    DEFAULT_PREFIX: ClassVar[str] = ""
    #: what the hang watchdog and goodput say it is doing
    DOING: ClassVar[str] = "evaluation"

    def __init__(self, name: str, settings, prepared, context):
        self.name, self.settings, self.prepared, self.context = name, settings, prepared, context

    @classmethod
    def prepare(cls, name: str, settings, spec, vocabulary):
        return None

    def due(self, step: int) -> bool:
        return self.settings.due(step, self.context.spec.num_train_steps)

    @property
    def prefix(self) -> str:
        """Metric names: the old spelling (``eval_loss``, ``bench/...``) for the evaluator
        ``config.eval`` made, ``<name>/...`` for the others."""
        return self.DEFAULT_PREFIX if self.name == self.DEFAULT_NAME else f"{self.name}/"

    def evaluate(self, params, step: int) -> dict:
        """``{metric: value}`` at ``step``; the loop names them (``metrics``)."""
        raise NotImplementedError

    def metrics(self, params, step: int) -> dict:
        """What the loop logs: ``evaluate``'s metrics under this evaluator's prefix, so
        two evaluators of one kind never write the same name."""
        return {f"{self.prefix}{key}": value
                for key, value in self.evaluate(params, step).items()}
