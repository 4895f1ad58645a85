"""Evaluation set up from a run config: the lengths to evaluate at, the lengths the
model cannot take (refused before anything compiles), and the evaluator on a
trainer's mesh. Shared by ``eval``, ``infer`` and the evaluation inside ``train``.
"""

from __future__ import annotations

from t5x_like.errors import UserError


def eval_lengths(config, args=None) -> dict[str, int]:
    lengths = dict(config.task_feature_lengths)
    if args is not None:
        if args.inputs_length:
            lengths["inputs"] = args.inputs_length
        if args.targets_length:
            lengths["targets"] = args.targets_length
    return lengths


def check_lengths(config, lengths: dict[str, int], tasks, few_shot: bool = False) -> None:
    """Lengths the model cannot take, refused before anything is compiled: a decoder
    trained without inputs asked to read a task's inputs (few-shot scoring reads them
    as text in its own window), or more tokens than its learned positions."""
    from t5x_like import models
    structure = models.structure(config.model.family)
    with_inputs = [t.name for t in tasks if "inputs" in t.output_features]
    if structure == "decoder" and with_inputs and "inputs" not in lengths and not few_shot:
        raise UserError(
            f"Task {with_inputs[0]!r} has inputs, and this decoder's lengths "
            f"{lengths} have none; give both, e.g. --inputs_length=128 --targets_length=32 "
            f"(their sum at most model.max_length={config.model.get('max_length')}).")
    limit = config.model.get("max_length")
    if structure == "decoder" and config.model.get("position_embedding") == "rotary":
        limit = None
    total = (sum(lengths.values()) if structure == "decoder"
             else lengths.get("inputs", 0) if structure == "encoder" else 0)
    if limit and total > limit:
        raise UserError(
            f"Lengths {lengths} need {total} positions, but the model has "
            f"max_length={limit} learned positions; lower --inputs_length/--targets_length "
            f"so they sum to at most {limit}.")


def build_evaluator(config, trainer, name: str, settings, lengths=None, vocabulary=None):
    """The evaluator for a run config on the trainer's mesh (used by ``train`` too);
    ``vocabulary`` re-tokenizes the tasks (a checkpoint's own tokenizer)."""
    from t5x_like import structures
    from t5x_like.evaluation import evaluator
    return evaluator.Evaluator(structures.for_config(config), trainer.mesh, trainer.rules,
                               trainer.state_shardings.params, name,
                               lengths or dict(config.task_feature_lengths), settings,
                               vocabulary=vocabulary)
