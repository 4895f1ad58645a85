"""Evaluation set up from a run config: the lengths to evaluate at, the lengths the
model cannot take (refused before anything compiles), and the evaluator on a
trainer's mesh. Shared by ``eval``, ``infer`` and the evaluation inside ``train``.
"""

from __future__ import annotations

# Imports inside functions: keep JAX out of the commands' start-up: this module is imported
# before the config is read, and what needs JAX loads after it.


def eval_lengths(config, args=None) -> dict[str, int]:
    lengths = dict(config.task_feature_lengths)
    if args is not None:
        if args.inputs_length:
            lengths["inputs"] = args.inputs_length
        if args.targets_length:
            lengths["targets"] = args.targets_length
    return lengths


def check_lengths(config, lengths: dict[str, int], tasks, few_shot: bool = False) -> None:
    """Lengths the model cannot take, refused before anything is compiled (the model's
    structure knows its limits: ``Structure.check_eval_lengths``)."""
    from t5x_like import structures
    from t5x_like.config import spec_of
    spec = spec_of(config)
    structures.structure_class(spec.model.family).check_eval_lengths(spec, lengths, tasks,
                                                                     few_shot)


def build_evaluator(config, trainer, name: str, settings, lengths=None, vocabulary=None,
                    weights=None):
    """The evaluator for a run config on the trainer's mesh (used by ``train`` too);
    ``vocabulary`` re-tokenizes the tasks (a checkpoint's own tokenizer); ``weights``
    (``int8_weights.weights_for``): the structure and param shardings it runs, else the
    float model's."""
    from t5x_like import structures
    from t5x_like.evaluation import evaluator
    structure = weights.structure if weights else structures.for_config(config)
    shardings = weights.shardings if weights else trainer.state_shardings.params
    return evaluator.Evaluator(structure, trainer.mesh, trainer.rules, shardings, name,
                               lengths or dict(config.task_feature_lengths), settings,
                               vocabulary=vocabulary,
                               pipeline_settings=trainer.pipeline_settings)
