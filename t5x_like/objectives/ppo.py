"""PPO for language models (Schulman et al. 2017; Ziegler et al. 2019; InstructGPT,
Ouyang et al. 2022): pure functions of per-token arrays over a batch of rollout rows.
The structure (``structures/reinforcement.py``) computes the log-probabilities and the
values; the rollout side computes the targets once per rollout batch
(``rollout_targets``), the update reads them (``ppo_loss``).

The arithmetic and its conventions are TRL's ``PPOTrainer`` (``trl.experimental.ppo``,
TRL 1.12, the last to ship it, the oracle of ``tests/test_ppo_parity.py``):

- the reward of a completion is the scorer's number, placed on one position, plus
  ``-kl_coef`` times a per-token KL estimate to the reference (``k1``: ``log π -
  log π_ref``; ``k3``: ``(r - 1) - log r`` with ``r = π_ref / π``) on every completion
  token: the KL penalty folded into the reward, as InstructGPT does;
- the score sits on the position after the completion's last token (its EOS), which
  the value model also predicts (the state after the whole completion), or on the last
  token when the completion fills every position it may;
- values count on the completion's positions and that one more (``value_mask``);
- GAE (Schulman et al. 2016) with ``gamma`` and ``lam`` over the positions, the returns
  ``advantages + values``, then the advantages whitened over the batch's completion
  tokens (unbiased variance), 0 elsewhere;
- the losses: the clipped policy loss ``max(-A r, -A clip(r, 1 ± ε))`` averaged over
  completion tokens, the clipped value loss ``0.5 max((v - R)², (clip(v, v_old ± ε_v) -
  R)²)`` averaged over value positions, ``loss = policy + vf_coef · value``.

Positions here are a rollout row's logit positions (``tokens[:, :-1]``, the one at
``p`` predicting ``tokens[p + 1]``); ``weights`` marks the completion's (1 where the
next token is the completion's), which start right after the prompt.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

KL_ESTIMATORS = ("k1", "k3")


def kl_estimate(logps, ref_logps, estimator: str = "k1") -> jax.Array:
    """Per-token KL(π ‖ π_ref) estimate from the sampled tokens' log-probabilities
    (Schulman's k1 and k3, http://joschu.net/blog/kl-approx.html)."""
    log_ratio = ref_logps - logps
    if estimator == "k1":
        return -log_ratio
    if estimator == "k3":
        return jnp.expm1(log_ratio) - log_ratio
    raise ValueError(f"Unknown KL estimator {estimator!r}; one of {KL_ESTIMATORS}.")


def completion_spans(weights, completion_length: int):
    """``(value mask, score position one-hot)`` ``[rows, positions]`` of rollout rows'
    completion ``weights``: the completion's positions and the one after it (cut at
    ``completion_length`` positions), and where the score goes (the one after the
    completion, or its last when it has all ``completion_length``)."""
    weights = weights.astype(jnp.float32)
    positions = jnp.arange(weights.shape[1])[None, :]
    start = jnp.argmax(weights > 0, axis=1)[:, None]
    count = weights.sum(axis=1).astype(jnp.int32)[:, None]
    offset = positions - start
    value_mask = (offset >= 0) & (offset < jnp.minimum(count + 1, completion_length))
    has_completion = count > 0
    score_at = jnp.minimum(count, completion_length - 1)
    score_hot = (offset == score_at) & has_completion
    return value_mask.astype(jnp.float32) * has_completion, score_hot.astype(jnp.float32)


def masked_mean(values, mask) -> jax.Array:
    return (values * mask).sum() / mask.sum()


def masked_whiten(values, mask, shift_mean: bool = True) -> jax.Array:
    """``values`` less their masked mean, over their masked unbiased standard deviation
    (``1e-8`` added to the variance; one value alone has variance 0, where TRL raises),
    the mean added back without ``shift_mean``."""
    mean = masked_mean(values, mask)
    count = mask.sum()
    bessel = jnp.where(count > 1.0, count / jnp.maximum(count - 1.0, 1.0), 1.0)
    variance = masked_mean((values - mean) ** 2, mask) * bessel
    whitened = (values - mean) * jax.lax.rsqrt(variance + 1e-8)
    return whitened if shift_mean else whitened + mean


def generalized_advantages(rewards, values, gamma: float, lam: float) -> jax.Array:
    """GAE over the positions (the last one's next value is 0): ``A_p = δ_p + γλ A_{p+1}``
    with ``δ_p = r_p + γ v_{p+1} - v_p``."""
    next_values = jnp.concatenate([values[:, 1:], jnp.zeros_like(values[:, :1])], axis=1)
    deltas = rewards + gamma * next_values - values

    def back(carry, delta):
        advantage = delta + gamma * lam * carry
        return advantage, advantage

    _, advantages = jax.lax.scan(back, jnp.zeros_like(deltas[:, 0]), deltas.T, reverse=True)
    return advantages.T


def rollout_targets(scores, logps, ref_logps, values, weights, *, completion_length: int,
                    kl_coef: float, kl_estimator: str = "k1", gamma: float = 1.0,
                    lam: float = 0.95, whiten_rewards: bool = False, has_eos=None,
                    missing_eos_penalty: float = 0.0):
    """What a rollout batch's updates read, from the sampling policy's ``logps``, the
    reference's ``ref_logps``, the value model's ``values`` (all ``[rows, positions]``)
    and each completion's score ``[rows]`` (less ``missing_eos_penalty`` where
    ``has_eos`` is 0: a completion cut off before its EOS, TRL's option):
    ``{"advantages", "returns", "value_mask"}`` and what is logged of the rollout (the KL
    summed over each completion, the non-score reward, the scores and their sum; means
    over rows)."""
    weights = weights.astype(jnp.float32)
    if missing_eos_penalty:
        scores = scores - missing_eos_penalty * (1.0 - has_eos.astype(jnp.float32))
    value_mask, score_hot = completion_spans(weights, completion_length)
    kl = kl_estimate(logps, ref_logps, kl_estimator) * weights
    non_score = -kl_coef * kl
    rewards = non_score + scores[:, None] * score_hot
    if whiten_rewards:
        rewards = masked_whiten(rewards, value_mask, shift_mean=False) * value_mask
    values = values * value_mask
    advantages = generalized_advantages(rewards, values, gamma, lam)
    returns = advantages + values
    advantages = masked_whiten(advantages, weights) * weights
    metrics = {"kl": kl.sum(axis=1).mean(), "non_score_reward": non_score.sum(axis=1).mean(),
               "scores": scores.mean(),
               "rlhf_reward": non_score.sum(axis=1).mean() + scores.mean()}
    return {"advantages": advantages, "returns": returns, "value_mask": value_mask}, metrics


def value_shares(value_mask) -> jax.Array:
    """Each value position's share of the batch's (``value_mask`` over its count): what
    the value loss weighs positions by, so a slice of the batch sums to its part."""
    value_mask = value_mask.astype(jnp.float32)
    return value_mask / jnp.maximum(value_mask.sum(), 1.0)


def ppo_loss(logps, old_logps, advantages, values, old_values, returns, weights,
             value_weights, *, epsilon: float, value_epsilon: float, vf_coef: float,
             num_tokens=None):
    """``(loss, metrics)``: the clipped policy loss over the completion tokens
    (``weights``; ``num_tokens`` their count in the whole batch, when this is a slice
    of it) plus ``vf_coef`` times the clipped value loss over the value positions, each
    weighed by its share of the whole batch's (``value_weights``, ``value_shares``)."""
    weights = weights.astype(jnp.float32)
    tokens = jnp.maximum(weights.sum(), 1.0) if num_tokens is None else num_tokens
    in_value = (value_weights > 0).astype(jnp.float32)
    log_ratio = (logps - old_logps) * weights
    ratio = jnp.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon)
    policy_loss = (jnp.maximum(unclipped, clipped) * weights).sum() / tokens
    values = values * in_value
    values_clipped = jnp.clip(values, old_values - value_epsilon, old_values + value_epsilon)
    value_losses = (values - returns) ** 2
    value_losses_clipped = (values_clipped - returns) ** 2
    value_loss = 0.5 * (jnp.maximum(value_losses, value_losses_clipped) * value_weights).sum()
    metrics = {
        "policy_loss": policy_loss, "value_loss": value_loss,
        "clip_fraction": ((clipped > unclipped) * weights).sum() / tokens,
        "value_clip_fraction": ((value_losses_clipped > value_losses) * value_weights).sum(),
        "approx_kl": 0.5 * ((log_ratio ** 2) * weights).sum() / tokens,
        "ratio": (ratio * weights).sum() / tokens,
    }
    return policy_loss + vf_coef * value_loss, metrics
