"""The frozen reference of DPO (``preference.reference``), of GRPO's KL term
(``rl.reference`` with ``rl.beta`` > 0) and of PPO's KL penalty, by default the ``init_from`` the policy starts
from: found and checked when the run resolves (its config only), loaded when the loop
starts, and handed to the train and eval steps as frozen params
(``Trainer.attach_frozen``): placed by its logical axes on the run's mesh, so sharded
as the policy is (FSDP included), run forward only, never updated, never saved.

A reference must read the policy's token ids: a decoder of the same vocabulary size,
trained (when it is a run of this framework) with the same tokenizer. Its size may
differ from the policy's.
"""

from __future__ import annotations

import dataclasses

from t5x_like import structures
from t5x_like.checkpoints import param_sources
from t5x_like.config import model_spec_of
from t5x_like.errors import UserError
from t5x_like.modes.registry import Frozen, Mode, register
from t5x_like.resilience.resume_fingerprint import vocabulary_differences
from t5x_like.structures import preference as preference_structures


@dataclasses.dataclass(frozen=True)
class ReferenceSource:
    """The reference read: where its params are, its model spec, and its run's
    fingerprint (None for a pretrained folder)."""

    path: str
    model: object
    fingerprint: dict | None


def needed(spec) -> bool:
    """DPO's reference, GRPO's with a KL term (``rl.beta``), PPO's (its KL penalty)."""
    return (spec.preference.objective == "dpo" or bool(spec.rl.algorithm and spec.rl.beta)
            or spec.rl.algorithm == "ppo")


def _key(spec) -> str:
    """The config key naming the reference."""
    if spec.preference.reference:
        return "preference.reference"
    return "rl.reference" if spec.rl.reference else "init_from (the reference)"


def reference_path(spec) -> str:
    return spec.preference.reference or spec.rl.reference or spec.init_from


def reference_source(spec) -> ReferenceSource:
    """The reference's checkpoint and model, read without loading parameters."""
    path = reference_path(spec)
    _, _, saved = param_sources.newest_saved(path, _key(spec))
    return ReferenceSource(path, model_spec_of(saved["model"]), saved.get("fingerprint"))


def check_reference(spec, reference: ReferenceSource, vocabulary) -> None:
    """One message for each reference the policy cannot be compared with."""
    path, model, key = reference.path, reference.model, _key(spec)
    if not structures.structure_class(model.family).generates_after_prompt:
        raise UserError(f"{key}={path!r} is a {model.family!r} model; the reference is a "
                        "decoder (the SFT model the policy starts from).")
    if model.vocab_size != spec.model.vocab_size:
        raise UserError(
            f"{key}={path!r} has {model.vocab_size} vocabulary entries and the "
            f"policy model.vocab_size={spec.model.vocab_size}: their log-probabilities would "
            "be of different tokens. Use a reference trained with the policy's tokenizer "
            "(its SFT checkpoint).")
    if reference.fingerprint:
        differs = list(vocabulary_differences(reference.fingerprint, vocabulary))
        if differs:
            raise UserError(
                f"{key}={path!r} was trained with another tokenizer than task "
                f"{spec.task!r} uses ({', '.join(differs)} differ): its log-probabilities are "
                "of other pieces. Use a reference trained with the policy's tokenizer.")


def reference_spec(spec, reference: ReferenceSource):
    """The run spec the reference is built and read with: the run's objective on the
    reference's own model (no PEFT), its checkpoint as ``init_from``."""
    return spec.replace(model=reference.model, init_from=reference.path,
                        peft=type(spec.peft)(), head=type(spec.head)())


def planned_reference(spec):
    """The reference the planner compiles with: the policy's own model without PEFT (the
    usual case, DPO from the SFT model it starts from; no checkpoint is read)."""
    return reference_structure(spec.replace(peft=type(spec.peft)()))


def load_reference(spec, reference: ReferenceSource, mesh):
    """``(reference structure, host params)``: the run's structure on the reference's
    decoder, whose log-probabilities the policy's loss reads."""
    plain = reference_spec(spec, reference)
    params, _ = param_sources.base_params(reference.path, plain, mesh)
    return reference_structure(plain), params


def reference_structure(plain):
    """The structure the reference is read with (``Structure.reference``: PPO's leaves its
    value model out), of ``reference_spec``'s spec."""
    return structures.for_config(plain).reference()


# -- the reference's record, and the preference mode's ------------------------------------

def _resolved_reference(spec, vocabulary, trainer) -> ReferenceSource:
    """The reference's config read and checked against the policy (its params are read
    when the loop starts)."""
    reference = reference_source(spec)
    check_reference(spec, reference, vocabulary)
    return reference


def _attached_reference(spec, reference: ReferenceSource, trainer, structure):
    """The frozen reference in the train and eval steps (the policy's loss reads its
    log-probabilities)."""
    reference_structure, params = load_reference(spec, reference, trainer.mesh)
    trainer.attach_frozen(reference_structure.model, params,
                          structure.loss_fn(spec.loss, reference=reference_structure),
                          in_evaluation=True)
    return params


def _planned_reference(spec, trainer, structure) -> None:
    reference = planned_reference(spec)
    trainer.attach_frozen(reference.model, None, structure.loss_fn(spec.loss,
                                                                   reference=reference))


def _in_preference_mode(spec) -> bool:
    return bool(spec.preference.objective)


REFERENCE = Frozen("reference", needed, _resolved_reference, _attached_reference,
                   planned=_planned_reference)
MODE = register(Mode("preference", _in_preference_mode, structure=preference_structures.MODE,
                     frozen=(REFERENCE,)))
