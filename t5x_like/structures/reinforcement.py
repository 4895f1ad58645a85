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
from t5x_like.objectives import preference as losses
from t5x_like.structures import families, mode_structures
from t5x_like.structures.base import Structure


class RolloutStructure(Structure):
    """A decoder policy trained by GRPO on rollout rows (see the module docstring)."""

    name = "rollouts"
    distillable = False
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


@functools.lru_cache(maxsize=32)
def _policy(model_spec, rl, peft_settings, completion_length: int) -> Structure:
    """Online RL's policy: a decoder (PEFT on it) read causally; ``completion_length``
    (``task_feature_lengths.targets``) is Dr. GRPO's constant normaliser."""
    return RolloutStructure(families.structure_for(model_spec, "causal", peft_settings), rl,
                            completion_length)


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
