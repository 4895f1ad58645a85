"""Knowledge distillation (Hinton et al. 2015; DistilBERT, Sanh et al. 2019): a frozen
teacher runs inside the jitted train step beside the student.

``config.distill``:

- ``teacher``: a pretrained folder (``convert import``), a run's workdir or one of its
  step folders, of the same vocabulary; empty: no distillation;
- ``temperature`` T, and the weights of the three terms (Sanh et al.: 5 / 2 / 1):
  ``soft_weight`` (T² x the KL divergence of the student's softened distribution from
  the teacher's: soft-target cross entropy less the teacher's entropy, so the same
  gradient), ``hard_weight`` (the student's own objective: masked LM or LM) and
  ``cosine_weight`` (1 - cosine of the final hidden states, which needs one width);
- ``student_init``: ``teacher_layers`` starts the student from the teacher, its
  layers taken evenly spaced with the first and last kept (12 -> 6: 0, 2, 4, 7, 9,
  11, DistilBERT's choice), everything else copied; ``fresh`` initialises it.

The teacher's parameters are an argument of the step (``Trainer.attach_teacher``),
sharded by their logical axes like the student's, with no optimizer state and no
gradient; checkpoints hold the student alone. Evaluation scores the student's own
objective. Encoders distil over every real token, decoders and encoder-decoders over
the target positions.
"""

from __future__ import annotations

import re

import jax
import numpy as np

from t5x_like.errors import ConfigError, UserError


def enabled(config) -> bool:
    distill = config.get("distill")
    return bool(distill is not None and distill.teacher)


# -- the teacher ---------------------------------------------------------------------------

def teacher_model_config(config) -> tuple[dict, dict | None]:
    """``(teacher model config, its run's fingerprint or None)`` read from
    ``distill.teacher``, without loading parameters."""
    from t5x_like import checkpoints
    try:
        source = checkpoints.resolve(config.distill.teacher)
    except UserError as e:
        raise ConfigError(f"distill.teacher: {e}") from None
    steps = source.steps()
    if not steps:
        raise ConfigError(f"distill.teacher={config.distill.teacher!r} holds no complete "
                          "checkpoint yet.")
    saved = source.saved_config(steps[-1])
    return dict(saved["model"]), saved.get("fingerprint")


def check_teacher(config, teacher_model: dict, teacher_fingerprint: dict | None,
                  student_vocabulary) -> None:
    """One message for each teacher the student cannot learn from."""
    from t5x_like import structures
    from t5x_like.run_guard import vocabulary_identity
    teacher = config.distill.teacher
    if teacher_model.get("family") not in structures.distillable_families():
        raise ConfigError(f"distill.teacher={teacher!r} is a {teacher_model.get('family')!r} "
                          f"model; teachers are one of {structures.distillable_families()}.")
    if (structures.structure_class(teacher_model["family"]).name
            != structures.structure_class(config.model.family).name):
        raise ConfigError(f"distill.teacher={teacher!r} is a {teacher_model['family']!r} model "
                          f"and the student a {config.model.family!r}; the two must read the "
                          "same batches (both encoders, both decoders or both encoder-decoders).")
    if teacher_model["vocab_size"] != config.model.vocab_size:
        raise ConfigError(
            f"distill.teacher={teacher!r} has another vocabulary: {teacher_model['vocab_size']} "
            f"entries against the student's model.vocab_size={config.model.vocab_size}. "
            "Soft targets compare the two distributions entry by entry; use a teacher "
            "trained with the student's vocabulary.")
    if teacher_fingerprint:
        ours = vocabulary_identity(student_vocabulary)
        theirs = {k: v for k, v in teacher_fingerprint.items() if k.startswith("vocabulary.")}
        differs = {k: (theirs[k], ours.get(k)) for k in theirs if theirs[k] != ours.get(k)}
        if differs:
            detail = ", ".join(f"{k} {a!r} vs {b!r}" for k, (a, b) in sorted(differs.items()))
            raise ConfigError(
                f"distill.teacher={teacher!r} was trained with another vocabulary than task "
                f"{config.task!r} uses ({detail}; teacher vs student). Token ids would mean "
                "different pieces; distil on a task of the teacher's vocabulary.")
    if config.distill.cosine_weight and teacher_model["d_model"] != config.model.d_model:
        raise ConfigError(
            f"distill.cosine_weight={config.distill.cosine_weight} compares hidden states, but "
            f"the teacher is {teacher_model['d_model']} wide and the student "
            f"{config.model.d_model}; give the student the teacher's d_model or set "
            "--config.distill.cosine_weight=0.")


def load_teacher(config, mesh, student_vocabulary):
    """``(teacher structure, host params)``, checked against the student."""
    import ml_collections

    from t5x_like import checkpoints, structures
    teacher_model, fingerprint = teacher_model_config(config)
    check_teacher(config, teacher_model, fingerprint, student_vocabulary)
    teacher_config = ml_collections.ConfigDict(config.to_dict())
    teacher_config.model = ml_collections.ConfigDict(teacher_model)
    teacher_config.init_from = config.distill.teacher
    params, _ = checkpoints.base_params(config.distill.teacher, teacher_config, mesh)
    return structures.for_config(teacher_config), params


# -- the student's starting point -----------------------------------------------------------

def evenly_spaced(teacher_layers: int, student_layers: int) -> list[int]:
    """Teacher layer for each student layer, first and last kept (12 -> 6: 0 2 4 7 9 11)."""
    if student_layers > teacher_layers:
        raise ConfigError(f"The student has {student_layers} layers and the teacher "
                          f"{teacher_layers}; student_init='teacher_layers' takes a subset. "
                          "Use fewer student layers or --config.distill.student_init=fresh.")
    if student_layers == 1:
        return [0]
    step = (teacher_layers - 1) / (student_layers - 1)
    return [int(np.floor(i * step + 0.5)) for i in range(student_layers)]


_LAYER = re.compile(r"^layers_(\d+)$")


def _stack_sizes(flat: dict) -> dict[tuple, int]:
    """Layers per stack (``("encoder",)`` -> 6): loop layers ``layers_i`` or a scanned
    ``layers`` whose leaves stack the layers on their first axis."""
    sizes: dict[tuple, int] = {}
    for key, value in flat.items():
        for depth, part in enumerate(key):
            match = _LAYER.match(part)
            if match:
                sizes[key[:depth]] = max(sizes.get(key[:depth], 0), int(match.group(1)) + 1)
            elif part == "layers":
                sizes[key[:depth]] = int(value.shape[0])
    return sizes


def student_from_teacher(teacher_params: dict, student_params: dict) -> dict:
    """The student's parameter tree (``student_params``: arrays or abstract shapes) filled
    from the teacher's (host arrays): evenly spaced layers of each stack, every other
    parameter copied (an embedding table with fewer rows takes the first ones); shapes
    must otherwise agree (same widths)."""
    from flax import traverse_util
    teacher = traverse_util.flatten_dict(teacher_params)
    student = traverse_util.flatten_dict(student_params)
    teacher_sizes, student_sizes = _stack_sizes(teacher), _stack_sizes(student)
    maps = {stack: evenly_spaced(teacher_sizes.get(stack, 0), count)
            for stack, count in student_sizes.items()}
    out = {}
    for key, value in student.items():
        source, index = key, None
        for depth, part in enumerate(key):
            match = _LAYER.match(part)
            if match and key[:depth] in maps:
                layer = maps[key[:depth]][int(match.group(1))]
                source = key[:depth] + (f"layers_{layer}",) + key[depth + 1:]
            elif part == "layers" and key[:depth] in maps:
                index = np.asarray(maps[key[:depth]])
        if source not in teacher:
            raise ConfigError(f"student_init='teacher_layers': the teacher has no parameter "
                              f"{'/'.join(source)} for the student's {'/'.join(key)}; teacher "
                              "and student must share the layout (loop or scanned layers, "
                              "heads). Use --config.distill.student_init=fresh.")
        taken = np.asarray(teacher[source])
        if index is not None:
            taken = taken[index]
        if (key[-1] == "embedding" and taken.shape[1:] == tuple(value.shape[1:])
                and taken.shape[0] > value.shape[0]):
            taken = taken[:value.shape[0]]  # a smaller table (DistilBERT's one token type)
        if taken.shape != tuple(value.shape):
            raise ConfigError(f"student_init='teacher_layers': {'/'.join(key)} is "
                              f"{tuple(value.shape)} in the student and {taken.shape} in the "
                              "teacher; the student needs the teacher's widths (d_model, "
                              "d_ff, heads). Use --config.distill.student_init=fresh.")
        out[key] = taken
    return traverse_util.unflatten_dict(out)


# -- the objective --------------------------------------------------------------------------

def make_loss_fn(student, teacher, loss_config, distill_config):
    """The train/eval loss: with ``teacher_params`` (training) the three distillation
    terms; without (evaluation) the student's own objective, the number to compare."""
    from t5x_like import objectives
    own = student.loss_fn(loss_config)
    temperature = float(distill_config.temperature)
    weights = {k: float(distill_config[k]) for k in ("soft_weight", "hard_weight",
                                                     "cosine_weight")}
    label_smoothing = float(loss_config.label_smoothing)

    def loss_fn(model, params, batch, rng, normalizer=None, num_sequences=None,
                teacher_params=None):
        if teacher_params is None:
            return own(model, params, batch, rng, normalizer=normalizer,
                       num_sequences=num_sequences)
        deterministic = rng is None
        taught = teacher.forward(teacher.model, jax.lax.stop_gradient(teacher_params), batch)
        learned = student.forward(model, params, batch, rng=rng, deterministic=deterministic)
        hard, token_metrics = objectives.token_objective(
            learned["logits"], learned["targets"], learned["weights"], z_loss=0.0,
            label_smoothing=label_smoothing, normalizer=normalizer)
        positions = learned["positions"]
        soft_objective, soft = objectives.row_mean_objective(objectives.soft_target_loss(
            learned["logits"], taught["logits"], temperature), positions, num_sequences)
        cos_objective, cos = objectives.row_mean_objective(objectives.cosine_loss(
            learned["hidden"], taught["hidden"]), positions, num_sequences)
        objective = (weights["hard_weight"] * hard + weights["soft_weight"] * soft_objective
                     + weights["cosine_weight"] * cos_objective)
        metrics = {"loss": token_metrics["loss"], "accuracy": token_metrics["accuracy"],
                   "num_target_tokens": token_metrics["num_target_tokens"],
                   "soft_target_loss": soft, "cosine_loss": cos,
                   "distill_objective": (weights["hard_weight"] * token_metrics["loss"]
                                         + weights["soft_weight"] * soft
                                         + weights["cosine_weight"] * cos)}
        return objective, metrics
    return loss_fn
