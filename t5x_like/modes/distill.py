"""Knowledge distillation (Hinton et al. 2015; DistilBERT, Sanh et al. 2019): a frozen
teacher runs inside the jitted train step beside the student.

``distill`` (the run spec's section):

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

The teacher's parameters are an argument of the step (``Trainer.attach_frozen``),
sharded by their logical axes like the student's, with no optimizer state and no
gradient; checkpoints hold the student alone. Evaluation scores the student's own
objective. Encoders distil over every real token, decoders and encoder-decoders over
the target positions.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np
from flax import traverse_util

from t5x_like import objectives, structures
from t5x_like.checkpoints import param_sources
from t5x_like.config import model_spec_of
from t5x_like.engine import trainer as trainer_lib
from t5x_like.errors import UserError
from t5x_like.modes.registry import Frozen, Mode, register
from t5x_like.resilience.resume_fingerprint import vocabulary_differences
from t5x_like.structures import distillation


def enabled(spec) -> bool:
    return bool(spec.distill.teacher)


@dataclasses.dataclass(frozen=True)
class TeacherSource:
    """``distill.teacher`` read: where its params are, its model spec and its run's
    fingerprint (None for a pretrained folder)."""

    path: str
    source: object
    step: int
    model: object
    fingerprint: dict | None


def teacher_source(spec) -> TeacherSource:
    """``distill.teacher``'s checkpoint and model, read without loading parameters."""
    path = spec.distill.teacher
    source, step, saved = param_sources.newest_saved(path, "distill.teacher")
    return TeacherSource(path, source, step, model_spec_of(saved["model"]),
                         saved.get("fingerprint"))


def check_teacher(spec, teacher: TeacherSource, student_vocabulary) -> None:
    """One message for each teacher the student cannot learn from."""
    path, model, student = teacher.path, teacher.model, spec.model
    if model.family not in distillation.distillable_families():
        raise UserError(f"distill.teacher={path!r} is a {model.family!r} model; teachers are "
                        f"one of {distillation.distillable_families()}.")
    if (structures.structure_class(model.family).name
            != structures.structure_class(student.family).name):
        raise UserError(f"distill.teacher={path!r} is a {model.family!r} model and the "
                        f"student a {student.family!r}; the two must read the same batches "
                        "(both encoders, both decoders or both encoder-decoders).")
    if model.vocab_size != student.vocab_size:
        raise UserError(
            f"distill.teacher={path!r} has another vocabulary: {model.vocab_size} entries "
            f"against the student's model.vocab_size={student.vocab_size}. Soft targets compare "
            "the two distributions entry by entry; use a teacher trained with the student's "
            "vocabulary.")
    if teacher.fingerprint:
        differs = vocabulary_differences(teacher.fingerprint, student_vocabulary)
        if differs:
            detail = ", ".join(f"{k} {a!r} vs {b!r}" for k, (a, b) in differs.items())
            raise UserError(
                f"distill.teacher={path!r} was trained with another vocabulary than task "
                f"{spec.task!r} uses ({detail}; teacher vs student). Token ids would mean "
                "different pieces; distil on a task of the teacher's vocabulary.")
    if spec.distill.cosine_weight and model.d_model != student.d_model:
        raise UserError(
            f"distill.cosine_weight={spec.distill.cosine_weight} compares hidden states, but "
            f"the teacher is {model.d_model} wide and the student {student.d_model}; give the "
            "student the teacher's d_model or set --config.distill.cosine_weight=0.")


def teacher_spec(spec, teacher: TeacherSource):
    """The run spec the teacher is built and read with: the student's run, the teacher's
    model, its checkpoint as ``init_from``."""
    return spec.replace(model=teacher.model, init_from=teacher.path,
                        peft=type(spec.peft)(), head=type(spec.head)())


def load_teacher(spec, teacher: TeacherSource, mesh):
    """``(teacher structure, host params)``."""
    params, _ = param_sources.base_params(teacher.path, teacher_spec(spec, teacher), mesh)
    return structures.for_config(teacher_spec(spec, teacher)), params


def check_student_init(teacher: TeacherSource, student_shapes) -> None:
    """The student's start from the teacher's layers (``student_init='teacher_layers'``),
    checked on shapes alone: every student parameter has its teacher parameter, of its
    shape."""
    teacher_shapes = trainer_lib.parameter_shapes(teacher.model)
    student_from_teacher(teacher_shapes, student_shapes, shapes_only=True)


# -- the student's starting point -----------------------------------------------------------

def evenly_spaced(teacher_layers: int, student_layers: int) -> list[int]:
    """Teacher layer for each student layer, first and last kept (12 -> 6: 0 2 4 7 9 11)."""
    if student_layers > teacher_layers:
        raise UserError(f"The student has {student_layers} layers and the teacher "
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


def student_from_teacher(teacher_params: dict, student_params: dict,
                         shapes_only: bool = False) -> dict:
    """The student's parameter tree (``student_params``: arrays or abstract shapes) filled
    from the teacher's (host arrays; with ``shapes_only`` abstract shapes, to check the
    mapping before anything is read): evenly spaced layers of each stack, every other
    parameter copied (an embedding table with fewer rows takes the first ones); shapes
    must otherwise agree (same widths)."""
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
            raise UserError(f"student_init='teacher_layers': the teacher has no parameter "
                            f"{'/'.join(source)} for the student's {'/'.join(key)}; teacher "
                            "and student must share the layout (loop or scanned layers, "
                            "heads). Use --config.distill.student_init=fresh.")
        taken = teacher[source] if shapes_only else np.asarray(teacher[source])
        if index is not None:
            taken = (jax.ShapeDtypeStruct((len(index), *taken.shape[1:]), taken.dtype)
                     if shapes_only else taken[index])
        if (key[-1] == "embedding" and taken.shape[1:] == tuple(value.shape[1:])
                and taken.shape[0] > value.shape[0]):
            taken = (jax.ShapeDtypeStruct(value.shape, taken.dtype) if shapes_only
                     else taken[:value.shape[0]])  # a smaller table (DistilBERT's token types)
        if tuple(taken.shape) != tuple(value.shape):
            raise UserError(f"student_init='teacher_layers': {'/'.join(key)} is "
                            f"{tuple(value.shape)} in the student and {tuple(taken.shape)} in "
                            "the teacher; the student needs the teacher's widths (d_model, "
                            "d_ff, heads). Use --config.distill.student_init=fresh.")
        out[key] = taken
    return traverse_util.unflatten_dict(out)


# -- the objective --------------------------------------------------------------------------

def make_loss_fn(student, teacher, loss_config, distill_config):
    """The train/eval loss: with ``frozen_params`` (the teacher's; training) the three
    distillation terms; without (evaluation) the student's own objective, the number to
    compare."""
    own = student.loss_fn(loss_config)
    temperature = float(distill_config.temperature)
    weights = {k: float(distill_config[k]) for k in ("soft_weight", "hard_weight",
                                                     "cosine_weight")}
    label_smoothing = float(loss_config.label_smoothing)

    def loss_fn(model, params, batch, rng, normalizer=None, num_sequences=None,
                frozen_params=None):
        if frozen_params is None:
            return own(model, params, batch, rng, normalizer=normalizer,
                       num_sequences=num_sequences)
        deterministic = rng is None
        taught = teacher.forward(teacher.model, jax.lax.stop_gradient(frozen_params), batch)
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


# -- the mode's record ----------------------------------------------------------------------

def _resolved_teacher(spec, vocabulary, trainer) -> TeacherSource:
    """The teacher's config read and checked against the student, and the student's start
    from its layers checked on shapes (its params are read when the loop starts)."""
    teacher = teacher_source(spec)
    check_teacher(spec, teacher, vocabulary)
    if spec.distill.student_init == "teacher_layers":
        check_student_init(teacher, trainer.abstract_state.params)
    return teacher


def _attached_teacher(spec, teacher: TeacherSource, trainer, structure):
    """The teacher in the train step, its soft targets in the loss; its host params (the
    student may start from its layers)."""
    teacher_structure, params = load_teacher(spec, teacher, trainer.mesh)
    trainer.attach_frozen(teacher_structure.model, params, make_loss_fn(
        structure, teacher_structure, spec.loss, spec.distill))
    return params


def _student_start(spec, attached: dict, trainer):
    if spec.distill.student_init != "teacher_layers":
        return None
    params = student_from_teacher(attached["teacher"], trainer.abstract_state.params)
    return params, (f"Student initialised from the teacher {spec.distill.teacher} "
                    "(evenly spaced layers).")


TEACHER = Frozen("teacher", enabled, _resolved_teacher, _attached_teacher)
MODE = register(Mode("distill", enabled, structure=distillation.MODE, frozen=(TEACHER,),
                     start_from=_student_start))
