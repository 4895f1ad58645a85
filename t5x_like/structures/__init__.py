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
- ``forward_flops_per_sequence(lengths)``: model FLOPs for MFU (``flops.py``);
- its part of config validation, evaluation length limits, text framing, and the
  other questions the code once asked family names (``base.Structure``).

Adding a family means its model module (registered in ``models.FAMILIES``), its
structure, and one line in ``FAMILY_STRUCTURES``; nothing else branches on family
names (``tests/test_architecture.py`` counts the places that do).
"""

from __future__ import annotations

import functools

import numpy as np

from t5x_like.errors import ConfigError
from t5x_like.structures.base import DECODE_DEFAULTS, Structure
from t5x_like.structures.bilm import BilmStructure
from t5x_like.structures.decoder import DecoderStructure
from t5x_like.structures.electra import ElectraStructure
from t5x_like.structures.encoder import EncoderStructure
from t5x_like.structures.seq2seq import EncoderDecoderStructure

__all__ = ["DECODE_DEFAULTS", "BilmStructure", "DecoderStructure", "ElectraStructure",
           "EncoderDecoderStructure", "EncoderStructure", "EXAMPLE_CONFIGS", "FAMILY_STRUCTURES",
           "Structure", "distillable_families",
           "for_config", "structure_class", "validate_config"]

# The one registry from a config's model.family to its structure. A new family adds its
# model module (models.FAMILIES: config dataclass and Flax module), its structure, and a
# line here.
FAMILY_STRUCTURES: dict[str, type[Structure]] = {
    "encoder_decoder": EncoderDecoderStructure,
    "bart": EncoderDecoderStructure,
    "decoder": DecoderStructure,
    "encoder": EncoderStructure,
    "electra": ElectraStructure,
    "bilm": BilmStructure,
}
# Families whose encoder takes a soft prompt (peft.prompt) in front of its input.
SOFT_PROMPT_FAMILIES = ("encoder", "encoder_decoder")
# A config that starts each family, named when a model key belongs to another family.
EXAMPLE_CONFIGS = {"encoder_decoder": "configs/quickstart.py", "bart": "configs/bart_base.py",
                   "decoder": "configs/pretrain/gpt2_tiny.py",
                   "encoder": "configs/pretrain/bert_tiny.py",
                   "electra": "configs/pretrain/electra_tiny.py",
                   "bilm": "configs/pretrain/elmo_tiny.py"}


def distillable_families() -> tuple[str, ...]:
    return tuple(sorted(f for f, cls in FAMILY_STRUCTURES.items() if cls.distillable))


def validate_config(config) -> None:
    """The family's and its structure's part of config validation (``config_lib.validate``
    calls it once the family is known to exist)."""
    family = config.model.family
    from t5x_like import models
    try:  # the family config's own checks (experts, layer types)
        models.family_config(config.model.to_dict())
    except ValueError as e:
        raise ConfigError(str(e)) from None
    structure_class(family).validate_config(config)
    if config.peft.prompt.length and family not in SOFT_PROMPT_FAMILIES:
        raise ConfigError(
            f"peft.prompt puts a soft prompt in front of the input of a BERT-style "
            f"encoder or T5's encoder; it is not built for model.family={family!r}. Use prefix "
            "tuning, which works with cached decoding: "
            "--config.peft.prompt.length=0 --config.peft.prefix.length=10.")
    distill = config.get("distill")
    if distill is not None and distill.teacher and not structure_class(family).distillable:
        raise ConfigError(f"distill works with model.family in {distillable_families()}; "
                          f"{family!r} is not one of them.")


def structure_class(family: str) -> type[Structure]:
    if family not in FAMILY_STRUCTURES:
        raise ConfigError(f"Unknown model.family {family!r}; available: {sorted(FAMILY_STRUCTURES)}.")
    return FAMILY_STRUCTURES[family]


@functools.lru_cache(maxsize=32)
def _cached(family_items: tuple, prefix_attention: str, peft_settings) -> Structure:
    from t5x_like.models import peft
    model_config = dict(family_items)
    cls = structure_class(model_config["family"])
    model = peft.with_peft(cls.build_model(model_config), peft_settings)
    if cls is DecoderStructure:
        return cls(model, prefix_attention)
    return cls(model)


def for_config(config) -> Structure:
    """The structure (with its model) a run config describes (``config.model``, and
    ``config.prefix_attention`` for decoders); with ``config.head.kind`` set, a
    fine-tuning head on that body (``models.head_structure``). ``config.peft``'s added
    modules (LoRA, adapters, prefixes, prompts) join the outermost model (``models.peft``)."""
    from t5x_like.models import peft
    model_config = dict(config.model)
    if model_config.get("mlp_activations") is not None:
        model_config["mlp_activations"] = tuple(model_config["mlp_activations"])
    prefix_attention = config.get("prefix_attention", "bidirectional")
    settings = peft.PeftSettings.from_config(config.get("peft"))
    head = dict(config.get("head") or {})
    model_items = tuple(sorted((k, _hashable(v)) for k, v in model_config.items()))
    if not head.get("kind"):
        return _cached(model_items, prefix_attention, settings)
    body = _cached(model_items, prefix_attention, peft.PeftSettings())
    return _cached_head(body, tuple(sorted((k, _hashable(v)) for k, v in head.items())),
                        config.task, settings)


@functools.lru_cache(maxsize=32)
def _cached_head(body: Structure, head_items: tuple, task_name: str,
                 peft_settings) -> Structure:
    from t5x_like.data import get_task_or_mixture
    from t5x_like.models import peft
    from t5x_like.structures.head import HeadStructure
    head = dict(head_items)  # config_lib.validate has refused encoder-decoder bodies
    vocabulary = get_task_or_mixture(task_name).vocabulary
    structure = HeadStructure(body, head, head.get("labels", ()), vocabulary)
    structure.model = peft.with_peft(structure.model, peft_settings)
    return structure


def _hashable(value):
    return tuple(value) if isinstance(value, (list, tuple, np.ndarray)) else value
