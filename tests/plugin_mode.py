# plugin_mode.py: a training mode of your own, registered from your module.
"""Fine-tuning anchored to the model it starts from: the run's own objective plus
``beta`` times the KL divergence of the trained model's next-token distribution from
a frozen copy of its starting point (an anchor against forgetting, as RLHF's KL
penalty is). Its settings are a section of the run spec (``config.modes.anchor``),
checked like every other; the anchor is a frozen model found and checked when the run
resolves, loaded when the loop starts, run forward only inside the train step.
Evaluation scores the run's own objective. Load it with ``--module=plugin_mode``;
nothing in t5x_like/ changes."""

import jax
import jax.numpy as jnp

from t5x_like import modes, objectives, structures
from t5x_like.checkpoints import param_sources
from t5x_like.config import model_spec_of
from t5x_like.config.mode_specs import register_mode_spec
from t5x_like.config.sections import FrozenMap, Section, field, section
from t5x_like.errors import UserError


@section
class AnchorSpec(Section):
    """``config.modes.anchor``: the KL weight, and the run to stay near ("" : init_from)."""

    beta: float = field(0.1, minimum=0.0)
    reference: str = ""


def _in_anchor_mode(spec) -> bool:
    return "anchor" in spec.modes


def _anchor_path(spec) -> str:
    return spec.modes["anchor"].reference or spec.init_from


def _check(spec) -> None:
    if not _anchor_path(spec):
        raise UserError("modes.anchor keeps the model near the one it starts from, and "
                        "init_from is empty; set --config.init_from=RUN (or "
                        "--config.modes.anchor.reference=RUN).")


def _resolve(spec, vocabulary, trainer):
    """The anchor's model, read from its checkpoint's config (no arrays yet)."""
    path = _anchor_path(spec)
    _, _, saved = param_sources.newest_saved(path, "modes.anchor.reference")
    model = model_spec_of(saved["model"])
    if model.vocab_size != spec.model.vocab_size:
        raise UserError(f"modes.anchor.reference={path!r} has {model.vocab_size} vocabulary "
                        f"entries and the model {spec.model.vocab_size}; anchor to a model "
                        "of the same tokenizer.")
    return path, model


def _anchored_loss(structure, anchor, loss_config, beta: float):
    own = structure.loss_fn(loss_config)

    def loss_fn(model, params, batch, rng, normalizer=None, num_sequences=None,
                frozen_params=None):
        objective, metrics = own(model, params, batch, rng, normalizer=normalizer,
                                 num_sequences=num_sequences)
        if frozen_params is None:  # evaluation: the run's own objective
            return objective, metrics
        learned = structure.forward(model, params, batch, rng=rng, deterministic=rng is None,
                                    hidden=False)
        fixed = anchor.forward(anchor.model, jax.lax.stop_gradient(frozen_params), batch,
                               hidden=False)
        log_p = jax.nn.log_softmax(learned["logits"].astype(jnp.float32))
        log_q = jax.nn.log_softmax(fixed["logits"].astype(jnp.float32))
        kl = jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)
        kl_objective, kl_mean = objectives.row_mean_objective(kl, learned["positions"],
                                                              num_sequences)
        return objective + beta * kl_objective, {**metrics, "kl_to_anchor": kl_mean}
    return loss_fn


def _attach(spec, source, trainer, structure):
    """The anchor's params on the run's mesh, in every train step's loss."""
    path, model = source
    anchor_spec = spec.replace(model=model, init_from=path, peft=type(spec.peft)(),
                               modes=FrozenMap())
    params, _ = param_sources.base_params(path, anchor_spec, trainer.mesh)
    anchor = structures.for_config(anchor_spec)
    trainer.attach_frozen(anchor.model, params, _anchored_loss(
        structure, anchor, spec.loss, spec.modes["anchor"].beta))
    return params


register_mode_spec("anchor", AnchorSpec)
modes.register(modes.Mode(
    "anchor", _in_anchor_mode, check=_check,
    frozen=(modes.Frozen("anchor", _in_anchor_mode, _resolve, _attach),)))
