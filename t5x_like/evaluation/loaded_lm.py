"""A decoder checkpoint loaded to answer language-model requests: scores of
continuations and generated tokens, on the mesh its config names, with its tokenizer and
the window requests are cut to. lm-evaluation-harness's ``t5x_like`` model
(``harness_model``), training's harness evaluator and ``t5xl serve`` answer through it;
it needs no lm-eval.

Rows are cut to a few widths (``bucket``: powers of two and 1.5 times them), so short
requests do not pay for the model's whole window and few programs compile.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from t5x_like import cli_flags, resolving, structures
from t5x_like.checkpoints import int8_weights, param_sources
from t5x_like.engine import partitioning
from t5x_like.engine import trainer as trainer_lib
from t5x_like.errors import UserError
from t5x_like.evaluation import evaluator, harness_tasks

MIN_WIDTH = 16


@dataclasses.dataclass
class LoadedModel:
    """What answers requests: the model runner on its mesh, its params, the tokenizer
    and the window (``max_length``) rows are cut to."""
    runner: evaluator.ModelRunner
    params: Any
    vocabulary: Any
    max_length: int
    description: str = ""
    #: the ids an exported tokenizer adds before a text (``evaluator.text_prefix``): what
    #: lm-eval's ``hf`` model puts first with its defaults, so ours does too
    prefix: tuple[int, ...] = ()


def load(checkpoint: str, *, step: int | None = None, vocabulary: str = "checkpoint",
         batch_size: int = 0, max_length: int = 0, seed: int = 0, module: str = "",
         weights: str = "", check_family: Callable | None = None,
         sampler: str = "static") -> LoadedModel:
    """A decoder checkpoint on the mesh its config names, with its own tokenizer (or
    ``vocabulary``: a tokenizer path), refused with a ``UserError`` before any
    compilation when it cannot answer language-model requests (``check_family(config,
    checkpoint)``; the harness's refusal by default). The built-in tasks (and
    ``module``'s) are registered first: a run's tokenizer may be its training task's.
    ``weights`` ``int8``: its attention and MLP kernels read in int8 (``int8_weights``).
    ``sampler``: how its generations are decoded (``EvalSettings.sampler``)."""

    cli_flags.import_modules([module] if module else [])

    source = param_sources.resolve(checkpoint)
    steps = source.steps()
    if not steps:
        raise UserError(f"{source.path} holds no complete checkpoint; train first or name one "
                        "that does.")
    if step is not None and step not in steps:
        raise UserError(f"step={step}: {source.path} holds steps {steps}; pick one of those.")
    step = steps[-1] if step is None else step
    config = resolving.resolve_checkpoint(source, step).spec
    if weights not in ("", "int8"):
        raise UserError(f"weights={weights!r}: give weights=int8 (int8 attention and "
                        "MLP kernels) or leave it out (the checkpoint's own weights).")
    if weights:
        config = config.replace(quantization=config.quantization.replace(weights=weights))
    if check_family is None:
        harness_tasks.check_decoder(config, checkpoint,
                                    "Evaluate it with `t5xl eval` on a task or mixture.")
    else:
        check_family(config, checkpoint)
    structures.structure_class(config.model.family).check_sampler(sampler, 1)
    tokenizer = resolving.resolve_checkpoint(source, step, vocabulary=vocabulary or "checkpoint",
                                        vocabulary_flag="vocabulary").asked_vocabulary
    resolving.check_fits(config, tokenizer, "lm-eval's requests")
    _, trainer = trainer_lib.build_on_devices(config)
    weights = int8_weights.weights_for(config, structures.for_config(config), trainer)
    params = weights.restore(source, step, trainer)
    return from_params(config, trainer, params, tokenizer, max_length, batch_size, seed,
                       f"{source.path} step {step}", weights, sampler)


def refuse_unless_language_model(command: str) -> Callable:
    """A ``load`` check for ``command``: a family whose structure does not answer
    language-model requests (encoders, encoder-decoders here) is refused in one line."""
    def check(config, checkpoint: str) -> None:
        if not structures.structure_class(config.model.family).scores_choices_as_lm_eval:
            raise UserError(f"{checkpoint} is a {config.model.family!r} model; {command} takes "
                            "decoder language models (GPT, Llama-style, imported ones).")
    return check


def from_params(config, trainer, params, vocabulary, max_length: int = 0, batch_size: int = 0,
                seed: int = 0, description: str = "", weights=None,
                sampler: str = "static") -> LoadedModel:
    """A model already on ``trainer``'s mesh (training's own params, between steps);
    ``max_length`` 0 is the model's positions (else its task lengths' sum);
    ``batch_size`` 0 is the config's, -1 one row per data-parallel device (a server
    answering one request at a time); ``seed`` seeds sampling (``do_sample``);
    ``weights`` (``int8_weights.weights_for``): the structure and shardings ``params`` are
    for, else the float model's."""
    positions = getattr(config.model, "positions", None)
    window = max_length or getattr(positions, "max_length", 0) or sum(
        config.task_feature_lengths.values())
    if batch_size < 0:
        batch_size = math.prod(trainer.mesh.shape[axis] for axis in
                               partitioning.batch_axes(trainer.rules) if axis in trainer.mesh.shape)
    settings = evaluator.EvalSettings(batch_size=batch_size or config.batch_size, seed=seed,
                                      sampler=sampler)
    weights = weights or int8_weights.FloatWeights(structures.for_config(config), trainer)
    runner = evaluator.ModelRunner(weights.structure, trainer.mesh, trainer.rules,
                                   weights.shardings, dict(config.task_feature_lengths), settings,
                                   trainer.pipeline_settings)
    return LoadedModel(runner, params, vocabulary, int(window), description,
                       evaluator.text_prefix(weights.structure, vocabulary))


def bucket(length: int, limit: int) -> int:
    """The row width for ``length`` tokens: the smallest of 16, 24, 32, 48, 64, 96, ...
    (powers of two and 1.5 times them) that holds it, at most ``limit``: rows are at
    most a third padding, and a window of N tokens compiles about 2 log2(N) programs."""
    width = MIN_WIDTH
    while width < length:
        width = width * 3 // 2 if width & (width - 1) == 0 else width * 4 // 3
    return min(width, limit)
