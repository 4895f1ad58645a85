"""Structures that learn from preference pairs (``config.preference``): a decoder policy
trained by DPO against a frozen reference, or by SimPO or ORPO without one
(``PreferenceStructure``), and a reward model, a decoder with a scalar head trained by
the Bradley-Terry loss (``RewardStructure``). Both read the rows of
``data.preference.PairFeatureConverter``: a chosen and a rejected row per pair, the
same prompt in front of each.

The losses are ``objectives.preference``'s, averaged over the batch's pairs (a pair
of padding only, as evaluation's last batch holds, is no pair); with optimizer
microbatches each slice divides by the whole batch's pairs, so the gradient is the
whole batch's. What is logged each step: the loss, the chosen and rejected rewards
(DPO: β times the policy's log-ratio to the reference; SimPO and ORPO: β times the
average log-probability; a reward model: its scalars), their margin, and the
preference ``accuracy`` (the share of pairs whose chosen reward is the larger);
``num_target_tokens`` counts pairs, so evaluation's sums average over pairs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from t5x_like.data.preference import PairFeatureConverter
from t5x_like.errors import UserError
from t5x_like.models import peft_modules
from t5x_like.models.heads import RewardModel
from t5x_like.objectives import preference as losses
from t5x_like.structures import families, mode_structures
from t5x_like.structures.base import Structure, dropout_rngs
from t5x_like.structures.decoder import start_id
from t5x_like.structures.head import check_head_features

SIDES = ("chosen", "rejected")


def _shifted_left(values, fill=0):
    """``values[:, 1:]`` with ``fill`` appended: what each position predicts."""
    pad = jnp.full((values.shape[0], 1), fill, values.dtype)
    return jnp.concatenate([values[:, 1:], pad], axis=1)


def _pairs(batch) -> jax.Array:
    """1 for each row of the batch that holds a pair (both responses have tokens)."""
    return ((batch["chosen_response"].sum(-1) > 0)
            & (batch["rejected_response"].sum(-1) > 0)).astype(jnp.float32)


class _PairStructure(Structure):
    """What the two structures share: the pair rows, their shapes, and the FLOPs of a
    forward pass over both rows."""

    distillable = False
    generates_after_prompt = False
    rows_per_example = 2

    def __init__(self, body: Structure, settings, model):
        super().__init__(model)
        self.body = body
        self.settings = settings

    def feature_converter(self, task_feature_lengths, pack=False):
        if pack:
            raise UserError("Preference pairs are batched, not packed (both rows of a pair "
                            "share a prompt); set --config.data.pack=False.")
        return PairFeatureConverter(start_id=start_id(self.body.model.config))

    def model_feature_lengths(self, task_feature_lengths):
        lengths = dict(task_feature_lengths)
        width = int(lengths["inputs"]) + int(lengths["targets"])
        features = {f"{side}_{part}": width for side in SIDES
                    for part in ("tokens", "mask", "response")}
        # and the model's own first input, at the row width, for ``init``
        features.update({name: width for name in type(self.model).init_features})
        return features

    def abstract_batch(self, task_feature_lengths, batch_size, sharding=None):
        lengths = dict(task_feature_lengths)
        width = int(lengths["inputs"]) + int(lengths["targets"])
        batch = {f"{side}_{part}": jax.ShapeDtypeStruct((batch_size, width), jnp.int32,
                                                        sharding=sharding)
                 for side in SIDES for part in ("tokens", "mask", "response")}
        batch["margin"] = jax.ShapeDtypeStruct((batch_size,), jnp.float32, sharding=sharding)
        return batch

    def _rows_flops(self, model, lengths, rows: float) -> float:
        width = int(lengths["inputs"]) + int(lengths["targets"])
        return rows * self.body.forward_flops_per_sequence(model, {"targets": width})

    def predict_batch(self, params, batch, *, rng=None, **decode):
        raise UserError(f"A {self.name} run trains on preference pairs; generate with the "
                        "checkpoint as a plain decoder (--config.preference.objective=).")


class PreferenceStructure(_PairStructure):
    """A decoder policy trained on pairs: ``dpo`` (against the frozen reference the train
    step receives as ``frozen_params``), ``simpo`` or ``orpo``."""

    name = "preference"

    def __init__(self, body: Structure, settings):
        super().__init__(body, settings, body.model)

    @property
    def needs_reference(self) -> bool:
        return self.settings.objective == "dpo"

    def apply_model(self, model, params, batch, rng=None, deterministic=True, **options):
        """The body decoder's logits over one side's rows (``batch`` holds
        ``decoder_input_tokens``), read causally."""
        return self.body.apply_model(model, params, batch, rng, deterministic, **options)

    def side_log_probs(self, model, params, batch, side: str, rng=None):
        """``(summed log-prob of the response [rows], its token count [rows], every
        position's log-prob of the row's next token [rows, length])``."""
        tokens = batch[f"{side}_tokens"]
        targets = _shifted_left(tokens)
        weights = _shifted_left(batch[f"{side}_response"]).astype(jnp.float32)
        logits = self.apply_model(model, params, {"decoder_input_tokens": tokens}, rng,
                                  deterministic=rng is None)
        per_token = losses.per_token_log_probs(logits, targets)
        return (per_token * weights).sum(-1), weights.sum(-1), per_token

    def loss_fn(self, loss_config, reference: Structure | None = None):
        """``(model, params, batch, rng, normalizer=None, num_sequences=None,
        frozen_params=None) -> (objective, metrics)``; DPO reads the reference
        structure's model with ``frozen_params``."""
        settings = self.settings
        objective_name = settings.objective

        def loss_fn(model, params, batch, rng, normalizer=None, num_sequences=None,
                    frozen_params=None):
            pairs = _pairs(batch)
            rng_chosen, rng_rejected = ((None, None) if rng is None
                                        else tuple(jax.random.split(rng)))
            chosen, chosen_count, chosen_tokens = self.side_log_probs(
                model, params, batch, "chosen", rng_chosen)
            rejected, rejected_count, _ = self.side_log_probs(
                model, params, batch, "rejected", rng_rejected)
            extra = {}
            if objective_name == "dpo":
                if frozen_params is None:
                    raise ValueError("DPO needs the reference's params (frozen_params).")
                frozen = jax.lax.stop_gradient(frozen_params)
                ref_chosen = reference.side_log_probs(reference.model, frozen, batch, "chosen")[0]
                ref_rejected = reference.side_log_probs(reference.model, frozen, batch,
                                                        "rejected")[0]
                per_pair, chosen_reward, rejected_reward = losses.dpo_losses(
                    chosen, rejected, ref_chosen, ref_rejected, beta=settings.beta,
                    loss_type=settings.loss_type, label_smoothing=settings.label_smoothing,
                    chosen_lengths=chosen_count, rejected_lengths=rejected_count)
            else:
                chosen_mean = chosen / jnp.maximum(chosen_count, 1.0)
                rejected_mean = rejected / jnp.maximum(rejected_count, 1.0)
                if objective_name == "simpo":
                    per_pair, chosen_reward, rejected_reward = losses.simpo_losses(
                        chosen_mean, rejected_mean, beta=settings.beta,
                        gamma=settings.simpo_gamma, label_smoothing=settings.label_smoothing)
                else:  # orpo
                    per_pair, chosen_reward, rejected_reward, log_odds = losses.orpo_terms(
                        chosen_mean, rejected_mean, beta=settings.beta)
                    extra["log_odds_ratio"] = _mean(log_odds, pairs)
            rows = jnp.maximum(pairs.sum(), 1.0) if num_sequences is None else num_sequences
            objective = (per_pair * pairs).sum() / rows
            if objective_name == "orpo":
                # ORPO's NLL term over the chosen rows' tokens, as TRL's ORPO (prompt and
                # response: every real token after the start), a mean over the batch's
                # tokens (config validation keeps ORPO to one microbatch).
                weights = _shifted_left(batch["chosen_mask"]).astype(jnp.float32)
                nll = -(chosen_tokens * weights).sum() / jnp.maximum(weights.sum(), 1.0)
                extra["nll_loss"] = nll
                objective = objective + nll
            metrics = {**losses.pair_metrics(chosen_reward, rejected_reward, pairs),
                       "loss": _mean(per_pair, pairs) + extra.get("nll_loss", 0.0),
                       "logps_chosen": _mean(chosen, pairs),
                       "logps_rejected": _mean(rejected, pairs),
                       "num_target_tokens": pairs.sum(), **extra}
            return objective, metrics
        return loss_fn

    def forward_flops_per_sequence(self, model, lengths):
        """Per pair: the policy's two rows (trained: 3x a forward), and for DPO the
        reference's forward over both rows, counted as 2/3 of a row so that train's 3x
        gives one forward per row."""
        rows = 2.0 + (2.0 / 3.0 if self.needs_reference else 0.0)
        return self._rows_flops(model, lengths, rows)


def _mean(values, weights):
    return (values * weights).sum() / jnp.maximum(weights.sum(), 1.0)


class RewardStructure(_PairStructure):
    """A reward model: the body decoder's final hidden state at each row's last token
    through a scalar head (``models.heads.RewardModel``), trained with the Bradley-Terry
    loss (``margin`` from the rows, ``preference.center_rewards``)."""

    name = "reward"
    evaluation_mode = "pairs"
    exported_head = "sequence_classifier"  # TRL's reward and value models' class

    def __init__(self, body: Structure, settings):
        super().__init__(body, settings, RewardModel(body.model))

    def apply_model(self, model, params, batch, rng=None, deterministic=True):
        """Rewards ``[rows]`` of ``batch``'s ``tokens`` (with ``mask``: 1 on real tokens)."""
        return model.apply({"params": params}, batch["tokens"], batch["mask"],
                           deterministic=deterministic, rngs=dropout_rngs(rng, deterministic))

    def rewards(self, params, tokens, mask) -> jax.Array:
        return self.apply_model(self.model, params, {"tokens": tokens, "mask": mask})

    def scoring_rows(self, prompt_ids, response_ids, task_feature_lengths) -> dict:
        """``{"tokens", "mask"}`` of one prompt and response, laid out as the pairs' rows
        the model trained on (``rewards`` scores them): what ``infer`` scores a text with."""
        converter = self.feature_converter(task_feature_lengths)
        row = converter.convert_example({"prompt": prompt_ids, "chosen": response_ids,
                                         "rejected": response_ids}, task_feature_lengths)
        return {"tokens": row["chosen_tokens"], "mask": row["chosen_mask"]}

    def loss_fn(self, loss_config, reference=None):
        center = float(self.settings.center_rewards)

        def loss_fn(model, params, batch, rng, normalizer=None, num_sequences=None,
                    frozen_params=None):
            pairs = _pairs(batch)
            rng_chosen, rng_rejected = ((None, None) if rng is None
                                        else tuple(jax.random.split(rng)))
            chosen = self.apply_model(model, params, {"tokens": batch["chosen_tokens"],
                                                      "mask": batch["chosen_mask"]},
                                      rng_chosen, deterministic=rng is None)
            rejected = self.apply_model(model, params, {"tokens": batch["rejected_tokens"],
                                                        "mask": batch["rejected_mask"]},
                                        rng_rejected, deterministic=rng is None)
            per_pair = losses.bradley_terry_losses(chosen, rejected, batch.get("margin"), center)
            rows = jnp.maximum(pairs.sum(), 1.0) if num_sequences is None else num_sequences
            metrics = {**losses.pair_metrics(chosen, rejected, pairs),
                       "loss": _mean(per_pair, pairs), "num_target_tokens": pairs.sum()}
            return (per_pair * pairs).sum() / rows, metrics
        return loss_fn

    def forward_flops_per_sequence(self, model, lengths):
        return self._rows_flops(model.replace(vocab_size=0), lengths, 2.0)


@functools.lru_cache(maxsize=32)
def _pair_structure(model_spec, preference, peft_settings) -> Structure:
    """A preference objective's structure on a decoder body read causally: the policy
    (PEFT on the body, so LoRA trains the policy) or the reward model (PEFT on the
    whole, as on a head)."""
    if preference.objective != "reward_model":
        return PreferenceStructure(families.structure_for(model_spec, "causal", peft_settings),
                                   preference)
    structure = RewardStructure(families.structure_for(model_spec, "causal",
                                                       peft_modules.PeftSettings()), preference)
    structure.model = peft_modules.with_peft(structure.model, peft_settings)
    return structure


def _in_preference_mode(spec) -> bool:
    return bool(spec.preference.objective)


def _wrap(spec, peft_settings) -> Structure:
    return _pair_structure(spec.model, spec.preference, peft_settings)


def _check(spec, family_structure) -> None:
    key = f"preference.objective={spec.preference.objective!r}"
    mode_structures.check_continues_prompts(spec, family_structure, key)
    if spec.preference.objective == "reward_model":
        check_head_features(spec, key)


def _as_trained_model(spec):
    """A policy trained from preferences (DPO, SimPO, ORPO) is a decoder that read its
    rows causally; a reward model stays one (its head is part of its model)."""
    if spec.preference.objective == "reward_model":
        return spec
    return spec.replace(preference=type(spec.preference)(),
                        data=spec.data.replace(prefix_attention="causal"))


MODE = mode_structures.register(mode_structures.ModeStructure(
    "preference", _in_preference_mode, wrap=_wrap, check=_check,
    as_trained_model=_as_trained_model))
