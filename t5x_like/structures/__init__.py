"""One object per model structure: what train, eval, infer, flops and plan ask of a family.

T5X's ``EncoderDecoderModel`` / ``DecoderOnlyModel`` idea. A structure owns:

- ``feature_converter(lengths, pack)`` and ``model_feature_lengths(lengths)``: how
  task features become the model's batch;
- ``apply_model(model, params, batch, rng)``: the one call of the family's model with
  its own signature, and ``loss_fn(loss_config)``: those outputs through the family's
  pure objective (``objectives/``), ``(model, params, batch, rng, normalizer=None,
  num_sequences=None) -> (objective, metrics)``;
- ``score_batch(params, batch)``: per-example summed log-likelihood of the targets
  given the inputs, over the positions the loss weights mark (``[batch]``);
- ``predict_batch(params, batch, ...)``: generated token ids through
  ``decoding.py`` (greedy, sampling or beam search);
- ``forward_flops_per_sequence(model, lengths)``: model FLOPs for MFU (``flops.py``);
- evaluation length limits, text framing, and the other questions the code once
  asked family names (``base.Structure``).

Which structure (and spec, module, sharding rules, converter) a ``model.family`` has
is the family registry's (``families.py``): a family registers in one place, and a
plug-in family from a user's ``--module`` the same way. Nothing else branches on
family names (``tests/test_architecture.py`` asks the registry what to look for).
"""

from __future__ import annotations

import functools

from t5x_like.config import spec_of
from t5x_like.config.families import (
    BartSpec,
    BilmSpec,
    DecoderSpec,
    ElectraSpec,
    EncoderSpec,
    T5Spec,
)
from t5x_like.errors import ConfigError
from t5x_like.models.bart import BartEncoderDecoder
from t5x_like.models.bilm import Bilm
from t5x_like.models.decoder import DecoderOnly
from t5x_like.models.electra import Electra
from t5x_like.models.encoder import EncoderOnly
from t5x_like.models.t5 import EncoderDecoder
from t5x_like.structures import families
from t5x_like.structures.base import DECODE_DEFAULTS, Structure
from t5x_like.structures.bilm import BilmStructure
from t5x_like.structures.decoder import DecoderStructure
from t5x_like.structures.electra import ElectraStructure
from t5x_like.structures.encoder import EncoderStructure
from t5x_like.structures.families import Family, build_model
from t5x_like.structures.seq2seq import EncoderDecoderStructure

__all__ = ["DECODE_DEFAULTS", "BilmStructure", "DecoderStructure", "ElectraStructure",
           "EncoderDecoderStructure", "EncoderStructure", "Family", "Structure",
           "build_model", "check_run", "distillable_families", "families",
           "for_config", "structure_class"]

# The built-in families: spec, Flax module, structure.
for _family in (Family("encoder_decoder", T5Spec, EncoderDecoder, EncoderDecoderStructure),
                Family("bart", BartSpec, BartEncoderDecoder, EncoderDecoderStructure),
                Family("decoder", DecoderSpec, DecoderOnly, DecoderStructure),
                Family("encoder", EncoderSpec, EncoderOnly, EncoderStructure),
                Family("electra", ElectraSpec, Electra, ElectraStructure),
                Family("bilm", BilmSpec, Bilm, BilmStructure)):
    families.register(_family)


def structure_class(family: str) -> type[Structure]:
    return families.get(family).structure


def distillable_families() -> tuple[str, ...]:
    return tuple(sorted(name for name, family in families.FAMILIES.items()
                        if family.structure.distillable))


def check_run(spec) -> None:
    """What the family's structure can do, checked against the run: preference tuning
    and RL for structures that continue a prompt, distillation for some structures."""
    generates = structure_class(spec.model.family).generates_after_prompt
    for key, value in (("preference.objective", spec.preference.objective),
                       ("rl.algorithm", spec.rl.algorithm)):
        if value and not generates:
            raise ConfigError(f"{key}={value!r} trains a decoder policy (or a reward model on "
                              f"one) on prompts and their responses; model.family="
                              f"{spec.model.family!r} does not continue a prompt. Start from a "
                              "decoder checkpoint.")
    if spec.distill.teacher and not structure_class(spec.model.family).distillable:
        raise ConfigError(f"distill works with model.family in {distillable_families()}; "
                          f"{spec.model.family!r} is not one of them.")
    _check_head_features(spec)


def _check_head_features(spec) -> None:
    """A fine-tuning head or a reward model reads its body's ``head_features`` (the final
    hidden states, and a pooled vector where the body has one): a family's module without
    that method is refused here, naming what to add, rather than failing inside the model."""
    reads = ("head.kind", spec.head.kind) if spec.head.kind else (
        ("preference.objective", "reward_model")
        if spec.preference.objective == "reward_model" else None)
    module = families.get(spec.model.family).module
    if reads and not hasattr(module, "head_features"):
        raise ConfigError(
            f"{reads[0]}={reads[1]!r} reads the body's final hidden states, and "
            f"model.family={spec.model.family!r}'s module {module.__module__}."
            f"{module.__qualname__} has no head_features method; add "
            "`head_features(self, input_tokens, token_type_ids=None, deterministic=True) -> "
            "(hidden [batch, length, d_model], pooled or None)` to it (models/decoder.py has "
            "one), or train without a head.")


@functools.lru_cache(maxsize=32)
def _cached(model_spec, prefix_attention: str, peft_settings) -> Structure:
    from t5x_like.models import peft_modules as peft
    family = families.get(model_spec.family)
    model = peft.with_peft(family.build_model(model_spec), peft_settings)
    return family.structure.for_model(model, prefix_attention)


def for_config(config) -> Structure:
    """The structure (with its model) a run spec (or config) describes: ``model``, and
    ``data.prefix_attention`` for decoders; with ``head.kind`` set, a fine-tuning head on
    that body (``structures.head``). ``peft``'s added modules (LoRA, adapters, prefixes,
    prompts) join the outermost model (``models.peft_modules``)."""
    from t5x_like.models import peft_modules as peft
    spec = spec_of(config)
    settings = peft.PeftSettings.from_config(spec.peft)
    if spec.preference.objective:
        return _cached_preference(spec.model, spec.preference, settings)
    if spec.rl.algorithm:
        completion_length = int(dict(spec.task_feature_lengths).get("targets", 0))
        return _cached_rollouts(spec.model, spec.rl, settings, completion_length)
    if not spec.head.kind:
        return _cached(spec.model, spec.data.prefix_attention, settings)
    body = _cached(spec.model, spec.data.prefix_attention, peft.PeftSettings())
    return _cached_head(body, spec.head, spec.task, settings)


@functools.lru_cache(maxsize=32)
def _cached_preference(model_spec, preference, peft_settings) -> Structure:
    """A preference objective's structure on a decoder body read causally: the policy
    (PEFT on the body, so LoRA trains the policy) or the reward model (PEFT on the
    whole, as on a head)."""
    from t5x_like.models import peft_modules as peft
    from t5x_like.structures.preference import PreferenceStructure, RewardStructure
    if preference.objective != "reward_model":
        return PreferenceStructure(_cached(model_spec, "causal", peft_settings), preference)
    structure = RewardStructure(_cached(model_spec, "causal", peft.PeftSettings()), preference)
    structure.model = peft.with_peft(structure.model, peft_settings)
    return structure


@functools.lru_cache(maxsize=32)
def _cached_rollouts(model_spec, rl, peft_settings, completion_length: int) -> Structure:
    """Online RL's policy: a decoder (PEFT on it) read causally; ``completion_length``
    (``task_feature_lengths.targets``) is Dr. GRPO's constant normaliser."""
    from t5x_like.structures.reinforcement import RolloutStructure
    return RolloutStructure(_cached(model_spec, "causal", peft_settings), rl, completion_length)


@functools.lru_cache(maxsize=32)
def _cached_head(body: Structure, head, task_name: str, peft_settings) -> Structure:
    from t5x_like.data import get_task_or_mixture
    from t5x_like.models import peft_modules as peft
    from t5x_like.structures.head import HeadStructure
    vocabulary = get_task_or_mixture(task_name).vocabulary
    structure = HeadStructure(body, head, head.labels, vocabulary)
    structure.model = peft.with_peft(structure.model, peft_settings)
    return structure
