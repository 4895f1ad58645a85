"""A task or mixture with metrics, evaluated on the training params (``eval``'s
evaluator, on the run's mesh, in the run's vocabulary)."""

from __future__ import annotations

from t5x_like.config.evals import BenchmarkSpec
from t5x_like.evaluation.in_training.base import TrainingEvaluator

# Imports inside functions: keep JAX out of the commands' start-up: this module is imported
# before the config is read, and what needs JAX loads after it.


class BenchmarkEvaluator(TrainingEvaluator):
    KIND = "benchmark"
    SPEC = BenchmarkSpec
    DEFAULT_NAME, DEFAULT_PREFIX = "benchmark", "bench/"
    DOING = "benchmark evaluation"

    @classmethod
    def prepare(cls, name, settings, spec, vocabulary):
        """The mixture exists and its metrics' packages are installed."""
        from t5x_like.evaluation import evaluator
        evaluator.check_metrics_installed(evaluator.leaf_tasks(settings.mixture))
        return None

    def __init__(self, name, settings, prepared, context):
        from t5x_like.evaluation import evaluator, runner
        super().__init__(name, settings, prepared, context)
        spec = context.spec
        eval_settings = evaluator.EvalSettings(
            split=settings.split, max_examples=settings.max_examples,
            batch_size=settings.batch_size or spec.batch_size,
            max_decode_length=settings.max_decode_length, seed=spec.seed,
            sampler=settings.sampler)
        self.evaluator = runner.build_evaluator(spec, context.trainer, settings.mixture,
                                                eval_settings, dict(spec.task_feature_lengths),
                                                context.vocabulary)

    def evaluate(self, params, step: int) -> dict:
        from t5x_like.evaluation import evaluator as evaluator_lib
        from t5x_like.evaluation import results as result_files
        results = self.evaluator.evaluate(params)
        self.context.progress.message(result_files.format_table(step, results))
        record = {f"{res.task}/{k}": v for res in results
                  for k, v in res.metrics.items()}
        mean = evaluator_lib.average(results)
        if mean is not None:
            record["average"] = mean
        return record
