"""The structure of online RL (``config.rl``): a decoder policy updated on its own
rollouts. A rollout batch (``rl.py`` builds it, one row per sampled completion) holds
``tokens`` (the start id, the prompt, the completion: ``1 + inputs + targets``),
``completion_loss_weights`` (1 at each position whose next token is the completion's)
and ``advantages`` (one per row); with ``rl.iterations`` > 1 also ``old_log_probs``
``[rows, width - 1]``, the sampling policy's log-probability of each next token. The
model reads ``tokens[:, :-1]``, so a row takes the positions of a prefix-LM row of the
same lengths.

GRPO's loss (``objectives.preference.grpo_loss``). With one update per rollout (TRL's
default ``num_iterations=1``) the old policy is the current one: its log-probabilities
under ``stop_gradient``, so the ratio is 1 and its gradient is the policy gradient. With
``rl.iterations`` = μ > 1 each rollout batch serves μ updates and the old policy is the
one that sampled it: ``old_log_probs``, computed when the batch was sampled, so from the
second update on the ratio moves away from 1 and the clip acts (TRL's
``old_per_token_logps``). The KL term reads the frozen reference's (``frozen_params``)
when ``rl.beta`` > 0; all at the sampling temperature.
``dapo`` and ``bnpo`` divide by the batch's completion tokens: the trainer's
normalizer over microbatches, so microbatches add up to the whole batch's loss; ``grpo``
and ``dr_grpo`` scale a microbatch by its share of the batch's rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from t5x_like.errors import UserError
from t5x_like.models.heads import PolicyAndValue, ValueModel
from t5x_like.objectives import ppo
from t5x_like.objectives import preference as losses
from t5x_like.structures import families, mode_structures
from t5x_like.structures.base import Structure


class RolloutStructure(Structure):
    """A decoder policy trained by GRPO on rollout rows (see the module docstring)."""

    name = "rollouts"
    distillable = False
    decodes_with_engine = True  # its policy, a decoder (``engine_decoder``)
    weights_feature = "completion_loss_weights"
    targets_feature = "tokens"

    def __init__(self, body: Structure, settings, completion_length: int = 0):
        super().__init__(body.model)
        self.body = body
        self.settings = settings
        self.completion_length = completion_length  # dr_grpo's constant normaliser

    @property
    def keeps_old_log_probs(self) -> bool:
        """Whether rollout batches carry their sampling policy's log-probabilities: only
        when a batch serves several updates (with one, they equal the current policy's)."""
        return self.settings.iterations > 1

    @property
    def samples_per_prompt(self) -> int:
        """Completions sampled of each prompt (``rl.samples_per_prompt``)."""
        return self.settings.samples_per_prompt

    @property
    def policy_model(self):
        """The decoder that samples the rollouts (``policy_params`` of the params)."""
        return self.model

    def policy_params(self, params):
        return params

    @property
    def needs_reference(self) -> bool:
        return bool(self.settings.beta)

    def width(self, task_feature_lengths) -> int:
        lengths = dict(task_feature_lengths)
        return 1 + int(lengths["inputs"]) + int(lengths["targets"])

    def feature_converter(self, task_feature_lengths, pack=False):
        """The prompt rows: the body decoder's prefix-LM rows read causally (each prompt
        is what precedes its first target position, as ``predict_batch`` reads it)."""
        return self.body.feature_converter(task_feature_lengths, pack)

    def model_feature_lengths(self, task_feature_lengths):
        width = self.width(task_feature_lengths)
        return {"tokens": width, "completion_loss_weights": width - 1,
                **{name: width - 1 for name in type(self.model).init_features}}

    def abstract_batch(self, task_feature_lengths, batch_size, sharding=None):
        width = self.width(task_feature_lengths)
        return {"tokens": jax.ShapeDtypeStruct((batch_size, width), jnp.int32, sharding=sharding),
                "completion_loss_weights": jax.ShapeDtypeStruct((batch_size, width - 1),
                                                                jnp.float32, sharding=sharding),
                "advantages": jax.ShapeDtypeStruct((batch_size,), jnp.float32, sharding=sharding),
                **({"old_log_probs": jax.ShapeDtypeStruct((batch_size, width - 1), jnp.float32,
                                                          sharding=sharding)}
                   if self.keeps_old_log_probs else {})}

    def apply_model(self, model, params, batch, rng=None, deterministic=True, **options):
        return self.body.apply_model(model, params, batch, rng, deterministic, **options)

    def token_log_probs(self, model, params, tokens, rng=None) -> jax.Array:
        """Each position's log-probability of the row's next token ``[rows, width - 1]``
        under the distribution the completions were sampled from: the logits divided by
        ``rl.temperature`` (as TRL's GRPO reads them, for the policy and the reference)."""
        logits = self.apply_model(model, params, {"decoder_input_tokens": tokens[:, :-1]}, rng,
                                  deterministic=rng is None)
        return losses.per_token_log_probs(logits.astype(jnp.float32) / self.settings.temperature,
                                          tokens[:, 1:])

    def loss_fn(self, loss_config, reference: Structure | None = None):
        settings = self.settings

        def loss_fn(model, params, batch, rng, normalizer=None, num_sequences=None,
                    frozen_params=None):
            mask = batch["completion_loss_weights"]
            logps = self.token_log_probs(model, params, batch["tokens"], rng)
            ref_logps = None
            if settings.beta:
                if frozen_params is None:
                    raise ValueError("GRPO with rl.beta > 0 needs the reference's params.")
                ref_logps = reference.token_log_probs(
                    reference.model, jax.lax.stop_gradient(frozen_params), batch["tokens"])
            old_logps = (batch["old_log_probs"] if self.keeps_old_log_probs
                         else jax.lax.stop_gradient(logps))
            loss, metrics = losses.grpo_loss(
                logps, old_logps, ref_logps, batch["advantages"], mask,
                beta=settings.beta, epsilon_low=settings.epsilon,
                epsilon_high=settings.epsilon_upper, aggregation=settings.loss_type,
                num_tokens=normalizer, max_completion_length=self.completion_length,
                ratio_level=settings.ratio_level)
            if settings.loss_type in ("grpo", "dr_grpo") and num_sequences is not None:
                loss = loss * mask.shape[0] / num_sequences  # a microbatch's share of rows
            logged = loss
            if num_sequences is not None:
                # A microbatch: the objectives sum to the batch's loss, and the trainer
                # averages metrics weighted by tokens (``normalizer``: the batch's), so
                # the microbatch logs its objective per token of its own, and GSPO's
                # clip rates (shares of this microbatch's completions) its share of the
                # batch's completions per token of its own.
                per_own_token = normalizer / jnp.maximum(mask.sum(), 1.0)
                logged = loss * per_own_token
                if settings.ratio_level == "sequence":
                    share = per_own_token * mask.shape[0] / num_sequences
                    metrics = {k: (v * share if k.startswith("clip_ratio") else v)
                               for k, v in metrics.items()}
            metrics = {**metrics, "loss": logged, "num_target_tokens": mask.sum()}
            return loss, metrics
        return loss_fn

    def predict_batch(self, params, batch, *, rng=None, **decode):
        return self.body.predict_batch(params, batch, rng=rng, **decode)

    def engine_decoder(self, params):
        return self.body.engine_decoder(params)

    def engine_prompts(self, batch):
        return self.body.engine_prompts(batch)

    def score_batch(self, params, batch):
        raise UserError("An RL run's checkpoint scores as a plain decoder: evaluate it with "
                        "--config.rl.algorithm= (the policy is a decoder).")

    def forward_flops_per_sequence(self, model, lengths):
        """Per completion and step: the update's forward (train counts 3x), the rollout's
        sampling (one forward over the row, counted as 1/3 so train's 3x gives it once;
        once per ``rl.iterations`` steps, as is the forward of its old log-probabilities
        when kept) and the reference's forward when beta > 0 (every step)."""
        width = self.width(lengths) - 1
        rollout = (2.0 if self.keeps_old_log_probs else 1.0) / self.settings.iterations
        extra = (rollout + (1.0 if self.needs_reference else 0.0)) / 3.0
        return (1.0 + extra) * self.body.forward_flops_per_sequence(model, {"targets": width})


class PpoStructure(RolloutStructure):
    """A decoder policy and its value model trained by PPO (``objectives.ppo``) on rollout
    rows: one parameter tree ``{"policy", "value"}`` (``models.heads.PolicyAndValue``),
    the value model a tower of its own, as TRL's ``PPOTrainer`` has it (a shared trunk
    would let the value loss's gradient move the policy, and a reward model's checkpoint
    could not start the value model). A rollout batch holds, beside ``tokens`` and
    ``completion_loss_weights``, the sampling policy's ``old_log_probs`` and the value
    model's ``old_values`` ``[rows, width - 1]``, the GAE ``advantages`` (whitened) and
    ``returns`` per position, and ``value_weights`` (the value positions, each divided
    by the batch's count of them: a slice of the batch sums to its share).

    ``settings``: the run's ``rl`` section (``epsilon`` is PPO's clip range,
    ``value_epsilon`` the value's, ``vf_coef`` the value loss's weight)."""

    name = "ppo"
    keeps_helpers = True  # the value model: eval, infer and export read the policy alone

    def __init__(self, body: Structure, value_body: Structure, settings,
                 completion_length: int = 0):
        super().__init__(body, settings, completion_length)
        # A clone: the same module instance in both towers would be one shared trunk.
        self.model = PolicyAndValue(body.model, ValueModel(value_body.model.clone()))

    @property
    def keeps_old_log_probs(self) -> bool:
        return True  # the ratio's denominator, from the first epoch on

    @property
    def policy_model(self):
        return self.model.policy

    def policy_params(self, params):
        return params["policy"]

    def trained_params(self, params):
        return params["policy"]

    def predict_batch(self, params, batch, *, rng=None, **decode):
        return self.body.predict_batch(params["policy"], batch, rng=rng, **decode)

    def engine_decoder(self, params):
        return self.body.engine_decoder(params["policy"])

    def reference(self) -> Structure:
        """The reference is a decoder: the policy's structure without the value model."""
        return RolloutStructure(self.body, self.settings, self.completion_length)

    def params_from_pretrained(self, flat_params: dict) -> dict:
        """``init_from`` (the SFT decoder) starts the policy and the value model's trunk
        (its head starts fresh); a ``rl.value_model`` (by default ``rl.reward_model``)
        replaces the value model's when the run starts (``modes.rl``)."""
        return {**{("policy", *key): value for key, value in flat_params.items()},
                **{("value", "backbone", *key): value for key, value in flat_params.items()}}

    def starts_fresh(self, key: tuple) -> bool:
        return tuple(key[:2]) == ("value", "head")

    def abstract_batch(self, task_feature_lengths, batch_size, sharding=None):
        width = self.width(task_feature_lengths)
        per_position = jax.ShapeDtypeStruct((batch_size, width - 1), jnp.float32,
                                            sharding=sharding)
        return {"tokens": jax.ShapeDtypeStruct((batch_size, width), jnp.int32, sharding=sharding),
                **{name: per_position for name in ROLLOUT_FEATURES}}

    def model_feature_lengths(self, task_feature_lengths):
        width = self.width(task_feature_lengths)
        return {"tokens": width, **{name: width - 1 for name in ROLLOUT_FEATURES},
                **{name: width - 1 for name in type(self.model).init_features}}

    def token_log_probs(self, model, params, tokens, rng=None) -> jax.Array:
        """The policy's log-probabilities (see ``RolloutStructure.token_log_probs``) from
        the joint ``params``."""
        return super().token_log_probs(model.policy, params["policy"], tokens, rng)

    def values(self, model, params, tokens, rng=None) -> jax.Array:
        """The value model's prediction at each of ``tokens[:, :-1]``'s positions."""
        return model.value.apply({"params": params["value"]}, tokens[:, :-1],
                                 deterministic=rng is None,
                                 rngs=None if rng is None else {"dropout": rng})

    def loss_fn(self, loss_config, reference: Structure | None = None):
        settings = self.settings

        def loss_fn(model, params, batch, rng, normalizer=None, num_sequences=None,
                    frozen_params=None):
            policy_rng, value_rng = (None, None) if rng is None else jax.random.split(rng)
            weights = batch["completion_loss_weights"]
            loss, metrics = ppo.ppo_loss(
                self.token_log_probs(model, params, batch["tokens"], policy_rng),
                batch["old_log_probs"], batch["advantages"],
                self.values(model, params, batch["tokens"], value_rng), batch["old_values"],
                batch["returns"], weights, batch["value_weights"],
                epsilon=settings.epsilon, value_epsilon=settings.value_epsilon,
                vf_coef=settings.vf_coef, num_tokens=normalizer)
            metrics = {**metrics, "loss": loss}
            if num_sequences is not None:
                # A microbatch: its loss and metrics are its shares of the whole batch's
                # (over the batch's tokens and value positions); the trainer averages
                # metrics weighted by each microbatch's tokens, so each is logged per
                # token of its own, and the average is the whole batch's.
                per_own_token = normalizer / jnp.maximum(weights.sum(), 1.0)
                metrics = {key: value * per_own_token for key, value in metrics.items()}
            return loss, {**metrics, "num_target_tokens": weights.sum()}
        return loss_fn

    def forward_flops_per_sequence(self, model, lengths):
        """Per completion and step: the update's forward of both towers (the value
        tower counted as the policy's trunk, without the vocabulary projection), and once
        per ``rl.iterations`` steps the rollout's sampling and its forwards of the policy,
        the reference and the value model (each counted 1/3, as train's 3x counts them
        once)."""
        width = self.width(lengths) - 1
        policy = self.body.forward_flops_per_sequence(model, {"targets": width})
        value = self.body.forward_flops_per_sequence(model.replace(vocab_size=0),
                                                     {"targets": width})
        rollout = (3.0 * policy + value) / self.settings.iterations / 3.0
        return policy + value + rollout


# What a PPO rollout batch holds per position beside its tokens (PpoStructure).
ROLLOUT_FEATURES = ("completion_loss_weights", "old_log_probs", "old_values", "advantages",
                    "returns", "value_weights")


@functools.lru_cache(maxsize=32)
def _policy(model_spec, rl, peft_settings, completion_length: int) -> Structure:
    """Online RL's policy: a decoder (PEFT on it) read causally; ``completion_length``
    (``task_feature_lengths.targets``) is Dr. GRPO's constant normaliser and where PPO's
    score sits on a completion without EOS. PPO's value model is a tower of the policy's
    architecture (no PEFT)."""
    body = families.structure_for(model_spec, "causal", peft_settings)
    if rl.algorithm == "ppo":
        return PpoStructure(body, families.structure_for(model_spec, "causal",
                                                         type(peft_settings)()),
                            rl, completion_length)
    return RolloutStructure(body, rl, completion_length)


def _in_rl_mode(spec) -> bool:
    return bool(spec.rl.algorithm)


def _wrap(spec, peft_settings) -> Structure:
    completion_length = int(dict(spec.task_feature_lengths).get("targets", 0))
    return _policy(spec.model, spec.rl, peft_settings, completion_length)


def _check(spec, family_structure) -> None:
    mode_structures.check_continues_prompts(spec, family_structure, f"rl.algorithm={spec.rl.algorithm!r}")


def _as_trained_model(spec):
    """An RL policy is a decoder that read its rows causally."""
    return spec.replace(rl=type(spec.rl)(), data=spec.data.replace(prefix_attention="causal"))


MODE = mode_structures.register(mode_structures.ModeStructure(
    "rl", _in_rl_mode, wrap=_wrap, check=_check, as_trained_model=_as_trained_model))
