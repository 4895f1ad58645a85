"""lm-evaluation-harness tasks on the training params (Levanter's in-loop harness):
its table on the console, ``harness/<task>/<metric>`` in the metrics file."""

from __future__ import annotations

from t5x_like.config.evals import HarnessSpec
from t5x_like.evaluation.in_training.base import TrainingEvaluator

# Imports inside functions: keep JAX out of the commands' start-up: this module is imported
# before the config is read, and what needs JAX loads after it.


class HarnessEvaluator(TrainingEvaluator):
    KIND = "harness"
    SPEC = HarnessSpec
    DEFAULT_NAME, DEFAULT_PREFIX = "harness", "harness/"
    DOING = "lm-evaluation-harness"

    @classmethod
    def prepare(cls, name, settings, spec, vocabulary):
        """A decoder, lm-eval installed, and every task found and its datasets loaded
        (the harness scores language models)."""
        from t5x_like.evaluation import harness_tasks
        harness_tasks.check_decoder(spec, "the harness evaluator",
                                    "Use a benchmark evaluator for its tasks.")
        harness_tasks.check_installed("the harness evaluator")
        names = harness_tasks.task_names(settings.tasks, "tasks")
        return harness_tasks.load(names, settings.include_path)

    def __init__(self, name, settings, prepared, context):
        from t5x_like.data import get_task_or_mixture
        from t5x_like.evaluation import harness_model, loaded_lm
        super().__init__(name, settings, prepared, context)
        spec = context.spec
        vocabulary = context.vocabulary or get_task_or_mixture(spec.task).vocabulary
        loaded = loaded_lm.from_params(spec, context.trainer, None, vocabulary, 0,
                                       settings.batch_size, spec.seed, "training")
        self.lm = harness_model.T5xLikeLM(loaded=loaded, max_gen_toks=settings.max_gen_toks)

    def evaluate(self, params, step: int) -> dict:
        from t5x_like.evaluation import harness_tasks
        self.lm.loaded.params = params
        fewshot = self.settings.num_fewshot
        out = harness_tasks.evaluate(self.lm, self.prepared,
                                     include_path=self.settings.include_path,
                                     num_fewshot=None if fewshot < 0 else fewshot,
                                     limit=self.settings.limit)
        self.context.progress.message(f"step {step}: lm-evaluation-harness\n"
                                      f"{harness_tasks.format_table(out)}")
        return harness_tasks.scalars(out, prefix="")
