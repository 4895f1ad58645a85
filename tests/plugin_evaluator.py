# plugin_evaluator.py: an evaluator kind of your own, registered from your module.
"""The global L2 norm of the parameters as an evaluator kind (``param_norm``), with a
setting of its own (``every_steps``; ``squared`` reports the sum of squares). Load it
with ``--module=plugin_evaluator`` and name one: ``--config.evals.norm.kind=param_norm``."""

from typing import ClassVar

import jax
import jax.numpy as jnp

from t5x_like.config.evals import EvalSpec
from t5x_like.config.sections import field, section
from t5x_like.evaluation import in_training


@section
class ParamNormSpec(EvalSpec):
    """The parameters' global norm, every ``every_steps`` steps and at the last."""

    every_steps: int = field(100, minimum=-1)
    squared: bool = False

    KIND: ClassVar[str] = "param_norm"


class ParamNormEvaluator(in_training.TrainingEvaluator):
    KIND, SPEC = "param_norm", ParamNormSpec

    def evaluate(self, params, step):
        total = sum(jnp.sum(jnp.square(leaf.astype(jnp.float32)))
                    for leaf in jax.tree.leaves(params))
        total = float(jax.device_get(total))
        return {"param_norm": total if self.settings.squared else total ** 0.5}


in_training.register(ParamNormEvaluator)
