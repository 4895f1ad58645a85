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
A training mode (a head, distillation, preference pairs, online RL) wraps the family's
structure the same way, through its registered half here (``mode_structures.py``); ``for_config``
and ``check_run`` ask the active modes and name none.
"""

from __future__ import annotations

import importlib
import pkgutil

from t5x_like.config import spec_of
from t5x_like.config.model_specs import (
    BartSpec,
    BilmSpec,
    DecoderSpec,
    ElectraSpec,
    EncoderSpec,
    T5Spec,
)
from t5x_like.models import peft_modules
from t5x_like.models.bart import BartEncoderDecoder
from t5x_like.models.bilm import Bilm
from t5x_like.models.decoder import DecoderOnly
from t5x_like.models.electra import Electra
from t5x_like.models.encoder import EncoderOnly
from t5x_like.models.t5 import EncoderDecoder
from t5x_like.structures import families, mode_structures
from t5x_like.structures.base import DECODE_DEFAULTS, Structure
from t5x_like.structures.bilm import BilmStructure
from t5x_like.structures.decoder import DecoderStructure
from t5x_like.structures.electra import ElectraStructure
from t5x_like.structures.encoder import EncoderStructure
from t5x_like.structures.families import Family, build_model
from t5x_like.structures.seq2seq import EncoderDecoderStructure

__all__ = ["DECODE_DEFAULTS", "BilmStructure", "DecoderStructure", "ElectraStructure",
           "EncoderDecoderStructure", "EncoderStructure", "Family", "Structure",
           "build_model", "check_run", "families", "for_config",
           "mode_structures", "structure_class"]

# The built-in families: spec, Flax module, structure.
for _family in (Family("encoder_decoder", T5Spec, EncoderDecoder, EncoderDecoderStructure),
                Family("bart", BartSpec, BartEncoderDecoder, EncoderDecoderStructure),
                Family("decoder", DecoderSpec, DecoderOnly, DecoderStructure),
                Family("encoder", EncoderSpec, EncoderOnly, EncoderStructure),
                Family("electra", ElectraSpec, Electra, ElectraStructure),
                Family("bilm", BilmSpec, Bilm, BilmStructure)):
    families.register(_family)

# The folder is the registry of the training modes' structural halves (as big_vision's
# evaluators are a folder): every module here loads with the package, and a mode's half
# registers its ``MODE`` as it loads, so a new mode adds its file and no line here.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def structure_class(family: str) -> type[Structure]:
    return families.get(family).structure


def check_run(spec) -> None:
    """What the family's structure can do, checked against the run's modes (each active
    mode's ``check``), and that at most one of them wraps the model."""
    family_structure = structure_class(spec.model.family)
    for mode in mode_structures.active(spec):
        if mode.check is not None:
            mode.check(spec, family_structure)
    mode_structures.wrapping(spec)


def for_config(config) -> Structure:
    """The structure (with its model) a run spec (or config) describes: the family's, for
    ``model`` and ``data.prefix_attention`` (decoders), wrapped by the run's mode where it
    has one (a fine-tuning head, a preference objective, an RL policy: ``mode_structures.py``).
    ``peft``'s added modules (LoRA, adapters, prefixes, prompts) join the model the mode
    says."""
    spec = spec_of(config)
    settings = peft_modules.PeftSettings.from_config(spec.peft)
    mode = mode_structures.wrapping(spec)
    if mode is not None:
        return mode.wrap(spec, settings)
    return families.structure_for(spec.model, spec.data.prefix_attention, settings)
