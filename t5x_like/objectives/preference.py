"""Learning from preferences: pure functions of per-sequence log-probabilities (or a
reward model's scalars) for a batch of pairs, a chosen and a rejected response to the
same prompt. Each returns per-pair losses and what is logged of them; the structure
(``structures/preference.py``) computes the log-probabilities and averages.

The arithmetic is TRL's (``DPOTrainer``, ``CPOTrainer`` for SimPO, ``ORPOTrainer``,
``RewardTrainer``, ``GRPOTrainer``), which the tests compare against on the same model
and batch:

- DPO (Rafailov et al. 2023): ``Δ = (log π(y_w) - log π_ref(y_w)) - (log π(y_l) -
  log π_ref(y_l))``, summed over the response tokens; ``sigmoid``: ``-log σ(βΔ)``, with
  label smoothing ε the conservative cDPO ``-(1-ε) log σ(βΔ) - ε log σ(-βΔ)``; ``robust``
  (Chowdhury et al. 2024): ``(-(1-ε) log σ(βΔ) + ε log σ(-βΔ)) / (1-2ε)``; ``ipo``
  (Azar et al. 2023): ``(Δ' - 1/(2β))²`` with each log-ratio divided by its response's
  token count (as TRL and the IPO authors do); ``hinge`` (SLiC): ``relu(1 - βΔ)``. The
  implicit rewards are ``β`` times each log-ratio.
- SimPO (Meng et al. 2024): no reference; ``-log σ(β (avg log π(y_w) - avg log π(y_l))
  - γ)`` over per-token averages, smoothed as cDPO.
- ORPO (Hong et al. 2024): no reference; the chosen NLL plus ``-β log σ(log odds(y_w) -
  log odds(y_l))`` where ``odds(y) = p(y) / (1 - p(y))`` of the per-token average.
- Bradley-Terry reward modelling (InstructGPT): ``-log σ(r_w - r_l - margin)``, plus
  ``c · (r_w + r_l)²`` to centre the rewards (Eisenstein et al. 2023).
- GRPO (Shao et al. 2024): group-normalised advantages and the clipped ratio with a
  KL estimate to the reference per token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# The run spec (a lower layer, config/run.py) lists the same names for its choices;
# tests/test_run_spec.py holds the two lists equal.
DPO_LOSSES = ("sigmoid", "robust", "ipo", "hinge")


def per_token_log_probs(logits, targets) -> jax.Array:
    """``log p(target)`` at each position ``[batch, length]`` (float32): the target's logit
    less the log-sum-exp, one pass over the logits."""
    logits = logits.astype(jnp.float32)
    target = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return target - jax.nn.logsumexp(logits, axis=-1)


def _smoothed(logits, label_smoothing: float):
    """cDPO's conservative loss of a preference logit: the label is right with
    probability ``1 - label_smoothing``."""
    return (-(1.0 - label_smoothing) * jax.nn.log_sigmoid(logits)
            - label_smoothing * jax.nn.log_sigmoid(-logits))


def dpo_losses(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, *,
               beta: float, loss_type: str = "sigmoid", label_smoothing: float = 0.0,
               chosen_lengths=None, rejected_lengths=None):
    """``(per-pair losses, chosen rewards, rejected rewards)`` of DPO and its variants
    (``DPO_LOSSES``); log-probabilities are sums over each response's tokens, and
    ``*_lengths`` (token counts) are needed by ``ipo`` alone."""
    chosen_ratio = chosen_logps - ref_chosen_logps
    rejected_ratio = rejected_logps - ref_rejected_logps
    delta = chosen_ratio - rejected_ratio
    if loss_type == "sigmoid":
        losses = _smoothed(beta * delta, label_smoothing)
    elif loss_type == "robust":
        losses = ((-(1.0 - label_smoothing) * jax.nn.log_sigmoid(beta * delta)
                   + label_smoothing * jax.nn.log_sigmoid(-beta * delta))
                  / (1.0 - 2.0 * label_smoothing))
    elif loss_type == "ipo":
        mean_delta = (chosen_ratio / jnp.maximum(chosen_lengths, 1.0)
                      - rejected_ratio / jnp.maximum(rejected_lengths, 1.0))
        losses = (mean_delta - 1.0 / (2.0 * beta)) ** 2
    elif loss_type == "hinge":
        losses = jax.nn.relu(1.0 - beta * delta)
    else:
        raise ValueError(f"Unknown DPO loss {loss_type!r}; one of {DPO_LOSSES}.")
    return losses, beta * chosen_ratio, beta * rejected_ratio


def simpo_losses(chosen_mean_logps, rejected_mean_logps, *, beta: float, gamma: float,
                 label_smoothing: float = 0.0):
    """``(per-pair losses, chosen rewards, rejected rewards)`` of SimPO, from per-token
    average log-probabilities; the rewards are ``β`` times them (as TRL logs)."""
    logits = (chosen_mean_logps - rejected_mean_logps) - gamma / beta
    return (_smoothed(beta * logits, label_smoothing), beta * chosen_mean_logps,
            beta * rejected_mean_logps)


def log1mexp(x) -> jax.Array:
    """``log(1 - exp(x))`` for ``x < 0``, stable on both sides of ``-log 2``."""
    return jnp.where(x < -0.6931471805599453, jnp.log1p(-jnp.exp(x)),
                     jnp.log(-jnp.expm1(jnp.minimum(x, -1e-30))))


def orpo_terms(chosen_mean_logps, rejected_mean_logps, *, beta: float):
    """``(per-pair odds-ratio losses, chosen rewards, rejected rewards, log odds)``: the
    loss is ``-β log σ(log odds ratio)``, to add to the chosen responses' NLL."""
    log_odds = ((chosen_mean_logps - rejected_mean_logps)
                - (log1mexp(chosen_mean_logps) - log1mexp(rejected_mean_logps)))
    return (-beta * jax.nn.log_sigmoid(log_odds), beta * chosen_mean_logps,
            beta * rejected_mean_logps, log_odds)


def bradley_terry_losses(chosen_rewards, rejected_rewards, margin=None,
                         center_coefficient: float = 0.0):
    """Per-pair ``-log σ(r_w - r_l - margin) + c (r_w + r_l)²``."""
    difference = chosen_rewards - rejected_rewards
    if margin is not None:
        difference = difference - margin
    losses = -jax.nn.log_sigmoid(difference)
    if center_coefficient:
        losses = losses + center_coefficient * (chosen_rewards + rejected_rewards) ** 2
    return losses


def pair_metrics(chosen_rewards, rejected_rewards, weights) -> dict:
    """The means over real pairs (``weights`` 1) of what preference training logs: the
    chosen and rejected rewards, their margin, and the preference accuracy (how often
    the chosen response's reward is the larger)."""
    count = jnp.maximum(weights.sum(), 1.0)

    def mean(values):
        return (values * weights).sum() / count
    return {"rewards_chosen": mean(chosen_rewards), "rewards_rejected": mean(rejected_rewards),
            "rewards_margin": mean(chosen_rewards - rejected_rewards),
            "accuracy": mean((chosen_rewards > rejected_rewards).astype(jnp.float32))}


# -- GRPO -----------------------------------------------------------------------------------

def group_advantages(rewards, group_size: int, scale: str = "group") -> jax.Array:
    """Each completion's reward less its group's mean (the ``group_size`` completions of
    one prompt, consecutive), divided by the group's standard deviation (``group``, the
    unbiased estimate, + 1e-4 as TRL) or the batch's (``batch``) or not (``none``, Dr.
    GRPO's recommendation)."""
    grouped = rewards.reshape(-1, group_size)
    mean = grouped.mean(axis=1, keepdims=True)
    advantages = (grouped - mean).reshape(-1)
    if scale == "none":
        return advantages
    if scale == "group":
        std = jnp.sqrt(((grouped - mean) ** 2).sum(axis=1, keepdims=True)
                       / max(group_size - 1, 1))
        std = jnp.broadcast_to(std, grouped.shape).reshape(-1)
    elif scale == "batch":
        std = jnp.std(rewards, ddof=1) if rewards.size > 1 else jnp.zeros(())
    else:
        raise ValueError(f"Unknown advantage scale {scale!r}; group, batch or none.")
    return advantages / (std + 1e-4)


GRPO_AGGREGATIONS = ("grpo", "bnpo", "dapo", "dr_grpo")
GRPO_RATIO_LEVELS = ("token", "sequence")


def grpo_loss(logps, old_logps, ref_logps, advantages, mask, *, beta: float,
              epsilon_low: float = 0.2, epsilon_high: float = 0.2,
              aggregation: str = "dapo", num_tokens=None, max_completion_length: int = 0,
              ratio_level: str = "token"):
    """``(loss, metrics)`` of GRPO on completions ``[batch, length]``: per token
    ``-min(r A, clip(r, 1-ε_low, 1+ε_high) A) + β KL`` with ``r = exp(log π - log π_old)``
    and the k3 estimate ``KL = exp(ref - log π) - (ref - log π) - 1`` (``ref_logps`` None
    or ``beta`` 0: no KL term). ``aggregation`` (TRL's ``loss_type``): ``grpo`` averages
    each completion over its tokens then the batch; ``bnpo`` and ``dapo`` divide the sum
    by the token count (``num_tokens``: the whole batch's, when microbatched);
    ``dr_grpo`` (Liu et al. 2025) by the constant ``rows x max_completion_length``, so a
    completion's length does not weigh its tokens.

    ``old_logps`` are the sampling policy's: ``stop_gradient(logps)`` when each rollout
    takes one update (``r`` is 1, its gradient the policy gradient), the rollout's own
    when it takes several (``r`` moves away from 1 and the clip acts).

    ``ratio_level`` (TRL's ``importance_sampling_level``): ``token`` gives each token its
    own ratio; ``sequence`` (GSPO, Zheng et al. 2025) one per completion, the exponent of
    its tokens' mean log-ratio, clipped whole, so one unlikely token does not clip alone;
    the clip rates then count completions, not tokens."""
    log_ratio = logps - old_logps
    if ratio_level == "token":
        log_weights = log_ratio
    elif ratio_level == "sequence":
        log_weights = ((log_ratio * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1.0))[:, None]
    else:
        raise ValueError(f"Unknown GRPO ratio level {ratio_level!r}; one of {GRPO_RATIO_LEVELS}.")
    ratio = jnp.exp(log_weights)
    clipped = jnp.clip(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    advantages = advantages[:, None]
    per_token = -jnp.minimum(ratio * advantages, clipped * advantages)
    kl = None
    if beta and ref_logps is not None:
        kl = jnp.exp(ref_logps - logps) - (ref_logps - logps) - 1.0
        per_token = per_token + beta * kl
    tokens = jnp.maximum(mask.sum(), 1.0)
    if aggregation == "grpo":
        loss = ((per_token * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1.0)).mean()
    elif aggregation in ("bnpo", "dapo"):
        loss = (per_token * mask).sum() / (tokens if num_tokens is None else num_tokens)
    elif aggregation == "dr_grpo":
        if max_completion_length < 1:
            raise ValueError("dr_grpo divides by the completions' maximum length; pass "
                             "max_completion_length.")
        loss = (per_token * mask).sum() / (mask.shape[0] * max_completion_length)
    else:
        raise ValueError(f"Unknown GRPO aggregation {aggregation!r}; one of {GRPO_AGGREGATIONS}.")

    def token_mean(values):
        return (values * mask).sum() / tokens

    def clip_rate(clipped_where):  # of the tokens, or of the completions (one ratio each)
        values = clipped_where.astype(jnp.float32)
        return values.mean() if ratio_level == "sequence" else token_mean(values)
    low = (ratio < 1.0 - epsilon_low) & (advantages < 0)
    high = (ratio > 1.0 + epsilon_high) & (advantages > 0)
    metrics = {"clip_ratio_low": clip_rate(low), "clip_ratio_high": clip_rate(high),
               "clip_ratio_region": clip_rate(low | high),
               "num_completion_tokens": mask.sum()}
    if kl is not None:
        metrics["kl"] = token_mean(kl)
    return loss, metrics
