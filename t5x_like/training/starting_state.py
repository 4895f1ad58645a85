"""The state a training run starts from, once it holds its workdir: the newest
checkpoint that restores (damaged newer ones moved aside), else the params of
``init_from``, else what the run's mode starts from (``modes.start_from``: a
distillation student from its teacher's layers), else a fresh init. Every setting was
checked when the run resolved (``preflight.resolve_training``)."""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
from flax import traverse_util

from t5x_like import errors, modes, structures
from t5x_like.checkpoints import checkpoint_store, param_sources
from t5x_like.checkpoints.param_sources import peft_partial
from t5x_like.engine import trainer as trainer_lib
from t5x_like.models import peft_modules
from t5x_like.resilience import resume_fingerprint
from t5x_like.resilience.holding import chief_log


@dataclasses.dataclass
class Start:
    """``state``; ``data_state`` (the input streams' position, None: from the start);
    ``peft_base`` (the identity of the base a partial-saving PEFT run needs); ``message``
    (one line on where the run starts); ``restore_s`` (time spent reading checkpoints)."""

    state: Any
    data_state: dict | None = None
    peft_base: dict | None = None
    message: str = ""
    restore_s: float = 0.0


def open_checkpointer(spec, workdir, is_chief: bool) -> checkpoint_store.Checkpointer:
    return checkpoint_store.Checkpointer(workdir / "checkpoints", keep=spec.checkpoint.keep,
                                      keep_every=spec.checkpoint.keep_every_steps,
                                      log=chief_log(is_chief),
                                      local_dir=spec.checkpoint.local_dir or None)


def start(resolved, checkpointer, attached: dict | None = None) -> Start:
    """Where the run starts (see the module docstring); ``attached``: the host params of
    the modes' frozen models, by name."""
    spec, trainer = resolved.spec, resolved.trainer
    if resolved.resume is not None:
        began = time.monotonic()
        restored = checkpointer.restore_newest(functools.partial(
            _restore_step, checkpointer, resolved))
        if restored is not None:
            return dataclasses.replace(_resumed(restored, checkpointer),
                                       restore_s=time.monotonic() - began)
    if spec.init_from:
        state, base = pretrained_state(spec, trainer)
        return Start(state, peft_base=base,
                     message=f"Initialised params from {spec.init_from} (optimizer state fresh).")
    started = modes.start_from(spec, attached or {}, trainer)
    if started is not None:
        params, message = started
        return Start(trainer.state_from_params(params), message=message)
    return Start(trainer.init_state(spec.seed))


def _resumed(restored, checkpointer) -> Start:
    saved, state, data_state, changed = restored.value
    lines = []
    if changed:
        lines.append("Resuming with intended changes (checkpoint.allow_resume_changes): "
                     f"{', '.join(changed)}"
                     + ("; the input stream starts over" if data_state is None else ""))
    lines.append(f"Resumed from {checkpointer.restored_folder(restored.step)} at step "
                 f"{restored.step}.")
    return Start(state, data_state, saved.get(peft_partial.IDENTITY_KEY), "\n".join(lines))


def _restore_step(checkpointer, resolved, step: int):
    """One checkpoint step, checked against the run's fingerprint (the newest was checked
    when the run resolved; an older one, reached past a damaged step, is checked here),
    restored onto the trainer: ``(saved config, state, data state or None, changed
    keys)``. Refusals are ``UserError``s (not damage); any other exception means the step
    is unreadable."""
    spec, trainer = resolved.spec, resolved.trainer
    saved = checkpointer.restore_config(step)
    if not isinstance(saved, dict):
        raise ValueError(f"config item is {type(saved).__name__}, not a JSON object")
    changed = resume_fingerprint.check_resume(saved, resolved.fingerprint,
                                     spec.checkpoint.allow_resume_changes)
    where = str(checkpointer.step_folder(step))
    try:
        if any(key.startswith("optimizer.") for key in changed):
            # An intended optimizer change: the params and step carry over, the optimizer
            # state starts fresh (restored first in the layout it was saved in).
            saved_spec = param_sources.config_from_saved(saved)
            old, data_state = param_sources.restore_state(
                checkpointer, step, trainer_lib.build_trainer(saved_spec, trainer.mesh), saved,
                saved_spec, where)
            state = trainer.state_from_params(jax.device_get(old.params)).replace(step=old.step)
        else:
            state, data_state = param_sources.restore_state(checkpointer, step, trainer, saved,
                                                          spec, where)
    except errors.UserError:
        raise  # a refusal (the PEFT base is gone or changed), not damage
    except Exception as e:  # noqa: BLE001
        model_changes = [k for k in changed if k.startswith(("model.", "head.", "peft."))]
        if model_changes:  # not damage: the allowed change does not fit the saved arrays
            raise errors.UserError(
                f"checkpoint.allow_resume_changes lets {', '.join(model_changes)} change, but "
                f"the checkpoint's arrays do not fit the changed model "
                f"({checkpoint_store.one_line(e)}). Only changes that keep every parameter's shape "
                "can resume; use a new --workdir with init_from to start from these weights "
                "otherwise.") from None
        raise
    if any(key.split(".")[0] in ("task", "task_feature_lengths", "vocabulary")
           for key in changed):
        data_state = None  # another input stream: it starts from its beginning
    return saved, state, data_state, changed


def pretrained_state(spec, trainer):
    """``(step-0 state, PEFT base identity or None)`` from pretrained params, for
    fine-tuning or continued pretraining: a params-only folder (``convert import``), or a
    training workdir / checkpoint step (its newest step's params; the optimizer state is
    left behind). What the base lacks starts fresh: a new head, LoRA and adapters."""
    params, step = param_sources.base_params(spec.init_from, spec, trainer.mesh)
    identity = (peft_partial.base_identity(spec.init_from, step, params)
                if peft_partial.saves_partial(spec) else None)
    if "backbone" in trainer.abstract_state.params and "backbone" not in params:
        params = {"backbone": params}  # a pretrained body under a new head
    expected = traverse_util.flatten_dict(peft_modules.plain_dicts(trainer.abstract_state.params))
    given = traverse_util.flatten_dict(peft_modules.plain_dicts(params))
    structure = structures.for_config(spec)
    given = modes.init_params(spec, structure.params_from_pretrained(given), trainer.mesh)
    missing = [key for key in expected if key not in given]
    if missing and all(structure.starts_fresh(key) or peft_modules.is_peft_param(key)
                       for key in missing):
        fresh = traverse_util.flatten_dict(peft_modules.plain_dicts(jax.device_get(
            trainer.init_state(spec.seed).params)))
        given.update(peft_modules.prompts_from_table({key: fresh[key] for key in missing},
                                                     given))
    params = traverse_util.unflatten_dict(given)
    try:
        return trainer.state_from_params(params), identity
    except ValueError as e:
        raise errors.UserError(f"init_from={spec.init_from!r}: {e}") from None
