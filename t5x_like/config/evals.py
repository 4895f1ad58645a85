"""Evaluations during training, by name: ``config.evals.<name>`` is one evaluator, its
``kind`` saying which (big_vision's ``config.evals``). Each kind's settings are a
section here; what runs them is ``t5x_like.evaluation.in_training``, whose registry
line builds the evaluator for a kind.

``every_steps``: N > 0 runs every N steps and at the last step; -1 at the last step
only; 0 never (the evaluator is off).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from t5x_like.config.sections import FrozenMap, Section, field, join, section, suggest
from t5x_like.errors import ConfigError

# How generations are decoded (``eval --sampler``, ``rl.sampler``, ``benchmark.sampler``):
# static padded batches, or the continuous-batching engine (``generation/engine.py``).
SAMPLERS = ("static", "engine")


@section
class EvalSpec(Section):
    kind: str
    every_steps: int = field(minimum=-1)

    KIND: ClassVar[str] = ""

    @property
    def enabled(self) -> bool:
        """Whether the evaluator runs at all (``every_steps=0`` turns it off)."""
        return self.every_steps != 0

    def due(self, step: int, last_step: int) -> bool:
        if not self.enabled:
            return False
        return step == last_step or (self.every_steps > 0 and step % self.every_steps == 0)


@section
class HeldOutLossSpec(EvalSpec):
    """The loss and accuracy (and the objective's other sums) on the training task's
    validation split, read once, every example (``batches``: at most this many)."""

    every_steps: int = field(200, minimum=-1)
    batches: int = field(8, minimum=1)

    KIND: ClassVar[str] = "held_out_loss"


@section
class BenchmarkSpec(EvalSpec):
    """A task or mixture with metrics (``python -m t5x_like.eval``'s evaluator) on the
    training params, in the run's vocabulary; ``mixture`` "" turns it off (as the old
    ``eval.mixture=""`` did)."""

    every_steps: int = field(-1, minimum=-1)
    mixture: str = ""
    max_examples: int = field(0, minimum=0, doc="per task; 0: the whole split")
    split: str = "validation"
    batch_size: int = field(0, minimum=0, doc="0: the run's batch_size")
    max_decode_length: int = field(0, minimum=0, doc="0: task_feature_lengths.targets")
    sampler: str = field("static", choices=SAMPLERS, doc=(
        "how generation tasks decode: static batches, or engine (the continuous-batching "
        "engine: decoders, one process, greedy)"))

    KIND: ClassVar[str] = "benchmark"

    @property
    def enabled(self) -> bool:
        return super().enabled and bool(self.mixture)


@section
class HarnessSpec(EvalSpec):
    """lm-evaluation-harness tasks (decoders; the ``lm_eval`` extra): comma-separated
    names of its catalogue or of the YAML files under ``include_path`` ("" turns it off)."""

    every_steps: int = field(-1, minimum=-1)
    tasks: str = ""
    include_path: str = ""
    num_fewshot: int = field(-1, minimum=-1, doc="-1: each task's own")
    limit: int = field(0, minimum=0, doc="examples per task; 0: all")
    max_gen_toks: int = field(256, minimum=1)
    batch_size: int = field(0, minimum=0, doc="0: the run's batch_size")

    KIND: ClassVar[str] = "harness"

    @property
    def enabled(self) -> bool:
        return super().enabled and bool(self.tasks.strip(","))


@section
class RolloutsSpec(EvalSpec):
    """Online RL's evaluation (``rl.py``): greedy completions of ``batches`` batches of the
    task's validation prompts, their mean reward (and each reward's); with ``samples`` >
    1 also the mean of the best of that many sampled completions per prompt
    (best-of-n)."""

    every_steps: int = field(200, minimum=-1)
    batches: int = field(8, minimum=1)
    samples: int = field(1, minimum=1)

    KIND: ClassVar[str] = "rollouts"


# kind -> its settings; a kind of your own registers with
# t5x_like.evaluation.in_training.register (its settings and its evaluator together).
EVAL_SPECS: dict[str, type[EvalSpec]] = {
    cls.KIND: cls for cls in (HeldOutLossSpec, BenchmarkSpec, HarnessSpec, RolloutsSpec)}


def register_eval_spec(spec_class: type[EvalSpec]) -> None:
    if not (isinstance(spec_class, type) and issubclass(spec_class, EvalSpec)
            and spec_class.KIND):
        raise TypeError(f"{spec_class!r} is not an EvalSpec subclass with KIND set.")
    EVAL_SPECS[spec_class.KIND] = spec_class


def eval_spec_class(kind, key: str) -> type[EvalSpec]:
    if kind not in EVAL_SPECS:
        raise ConfigError(f"{key}.kind={kind!r} is not an evaluator kind; choose one of "
                          f"{sorted(EVAL_SPECS)}.{suggest(str(kind), EVAL_SPECS)}")
    return EVAL_SPECS[kind]


def evals_from_mapping(data: Mapping, path: str = "evals") -> FrozenMap:
    """``{name: settings}`` -> ``{name: EvalSpec}``, each by its ``kind``."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"Config key {path!r} is a section of named evaluators, e.g. "
                          f"--config.{path}.held_out.every_steps=200.")
    out = {}
    for name, settings in data.items():
        key = join(path, name)
        if isinstance(settings, EvalSpec):
            out[name] = settings
            continue
        if not isinstance(settings, Mapping) or "kind" not in settings:
            raise ConfigError(f"{key} needs a kind: --config.{key}.kind=KIND with KIND one of "
                              f"{sorted(EVAL_SPECS)}.")
        out[name] = eval_spec_class(settings["kind"], key).from_mapping(settings, key)
    return FrozenMap(out)


def default_evals() -> FrozenMap:
    return FrozenMap(held_out=HeldOutLossSpec(kind=HeldOutLossSpec.KIND))
