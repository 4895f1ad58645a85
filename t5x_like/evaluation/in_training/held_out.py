"""The held-out loss: the training objective on the task's validation split."""

from __future__ import annotations

from t5x_like.config.evals import HeldOutLossSpec
from t5x_like.evaluation.in_training.base import TrainingEvaluator

# Imports inside functions: keep JAX out of the commands' start-up: this module is imported
# before the config is read, and what needs JAX loads after it.


class HeldOutLossEvaluator(TrainingEvaluator):
    """Loss and accuracy (and the objective's other sums) per target token on the
    validation split, read once, every example, its last batch filled with padding
    rows (weighed 0); every process runs the same number of batches, the most any
    process has (at most ``batches``). Off, said once, when the task has no validation
    examples."""

    KIND = "held_out_loss"
    SPEC = HeldOutLossSpec
    DEFAULT_NAME, DEFAULT_PREFIX = "held_out", "eval_"
    DOING = "held-out evaluation"

    def __init__(self, name, settings, prepared, context):
        import numpy as np

        from t5x_like.data import dataset_providers, get_task_or_mixture, pipeline
        from t5x_like.engine import partitioning
        super().__init__(name, settings, prepared, context)
        self.num_batches, self.padding = 0, None
        missing = dataset_providers.missing_validation(get_task_or_mixture(context.spec.task))
        if missing:
            context.progress.message(f"Held-out evaluation is off: {'; '.join(missing)}.")
            return
        first_row = next(iter(context.eval_streams(shard_index=0,
                                                   num_shards=context.num_streams)))
        self.padding = {key: np.zeros_like(value) for key, value in first_row.items()}
        self.num_batches = partitioning.max_over_processes(pipeline.count_batches(
            context.host_batches(context.eval_streams, self.padding), limit=settings.batches))

    def due(self, step: int) -> bool:
        return self.num_batches > 0 and super().due(step)

    def evaluate(self, params, step: int) -> dict:
        import jax

        from t5x_like.engine import partitioning
        context = self.context
        batches = context.host_batches(context.eval_streams, self.padding)
        totals = None
        for _ in range(self.num_batches):
            local = next(batches, None)  # None: this process's streams have ended
            batch = partitioning.global_batch(
                batches.padding_batch() if local is None else local, context.trainer.mesh,
                context.trainer.rules)
            out = context.trainer.eval_step(params, batch)
            totals = out if totals is None else jax.tree.map(lambda a, b: a + b, totals, out)
        totals = jax.device_get(totals)
        tokens = max(float(totals["num_target_tokens"]), 1.0)
        metrics = {"loss": float(totals["loss_sum"]) / tokens,
                   "accuracy": float(totals["correct_sum"]) / tokens}
        metrics.update({name[:-len("_sum")]: float(value) / tokens
                        for name, value in totals.items()
                        if name.endswith("_sum") and name not in ("loss_sum", "correct_sum")})
        context.progress.message(f"step {step}: held-out loss {metrics['loss']:.4f}, "
                                 f"accuracy {metrics['accuracy']:.3f}")
        return metrics
