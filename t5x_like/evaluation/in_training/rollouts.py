"""Online RL's evaluation during training: the rewards of greedy completions of the
task's validation prompts (``rl.Rollouts.evaluate``), best-of-n with ``samples``."""

from __future__ import annotations

from t5x_like.config.evals import RolloutsSpec
from t5x_like.errors import UserError
from t5x_like.evaluation.in_training.base import TrainingEvaluator


class RolloutsEvaluator(TrainingEvaluator):
    """Mean reward (each reward's too) of greedy completions of at most ``batches``
    batches of validation prompts, and with ``samples`` > 1 the best of that many sampled
    completions per prompt; every process runs the same number of batches."""

    KIND = "rollouts"
    SPEC = RolloutsSpec
    DEFAULT_NAME, DEFAULT_PREFIX = "held_out", "eval_"
    DOING = "rollout evaluation"

    @classmethod
    def prepare(cls, name, settings, spec, vocabulary):
        if not spec.rl.algorithm:
            raise UserError("kind='rollouts' scores completions with rl.rewards; set "
                            "rl.algorithm (or use kind='held_out_loss').")
        return None

    def __init__(self, name, settings, prepared, context):
        import numpy as np

        from t5x_like import structures
        from t5x_like.data import pipeline
        from t5x_like.engine import partitioning
        from t5x_like.modes import rl
        super().__init__(name, settings, prepared, context)
        spec = context.spec
        self.batch_size = spec.batch_size  # one greedy completion per prompt: a batch of rows
        first_row = next(iter(context.eval_streams(shard_index=0,
                                                   num_shards=context.num_streams)))
        self.padding = {key: np.zeros_like(value) for key, value in first_row.items()}
        vocabulary = context.vocabulary
        if vocabulary is None:
            from t5x_like.data import get_task_or_mixture
            vocabulary = get_task_or_mixture(spec.task).vocabulary
        self.rollouts = rl.Rollouts(spec, context.trainer, structures.for_config(spec),
                                    vocabulary, None)
        self.num_batches = partitioning.max_over_processes(pipeline.count_batches(
            self._batches(), limit=settings.batches))

    def _batches(self):
        return self.context.host_batches(self.context.eval_streams, self.padding,
                                         batch_size=self.batch_size)

    def due(self, step: int) -> bool:
        return self.num_batches > 0 and super().due(step)

    def evaluate(self, params, step: int) -> dict:
        batches = self._batches()
        metrics = self.rollouts.evaluate(params, _filled(batches, batches.padding_batch()),
                                         self.num_batches,
                                         samples=self.settings.samples, step=step)
        self.context.progress.message(
            f"step {step}: held-out reward {metrics.get('reward', 0.0):.4f} over "
            f"{int(metrics['prompts'])} prompts")
        return metrics


def _filled(batches, padding):
    """``batches``, then padding batches: a process whose streams ended keeps stepping."""
    yield from batches
    while padding is not None:
        yield padding
