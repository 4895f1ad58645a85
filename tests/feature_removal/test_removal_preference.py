"""Removals of the preference and RL features. The checks are TRL's own trainers on the
same tiny Llama and batch (losses and gradients), and a DPO run through ``train``
whose reference is compared with a snapshot taken before it."""

import hashlib
import json

import numpy as np
import pytest
from removals import Removal, existing, proving_tests
from test_ppo import reward_model  # noqa: F401  (the reward model PPO's value model starts from)
from test_ppo_parity import setting  # noqa: F401  (TRL 1.12's PPO results, the PPO checks')
from test_preference_parity import models  # noqa: F401  (the fixture the TRL checks read)
from test_preference_training import dpo_config, sft_run  # noqa: F401
from test_rl import arithmetic_sft  # noqa: F401  (the SFT run the dynamic-sampling check trains from)

from t5x_like import train
from t5x_like.objectives import ppo
from t5x_like.objectives import preference as losses
from t5x_like.structures import preference as preference_structures


def _digest(folder) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def dpo_moves_away_from_a_frozen_reference(request):
    """DPO through ``train`` from an SFT checkpoint: step 1's loss is ln 2 (the policy is
    its reference), later steps' implicit rewards part (the reference stays where it
    was), and the reference checkpoint's files are byte for byte what they were before
    the run."""
    sft = request.getfixturevalue("sft_run")
    before = _digest(sft)
    workdir = request.getfixturevalue("tmp_path") / "dpo"
    train.run(dpo_config(sft, **{"evals.held_out.every_steps": 0}), str(workdir), quiet=True)
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").open()]
    assert records[0]["loss"] == pytest.approx(np.log(2.0), abs=1e-5)
    assert abs(records[-1]["rewards_margin"]) > 1e-4, records[-1]
    assert abs(records[-1]["rewards_chosen"]) > 1e-4, records[-1]
    assert _digest(sft) == before


def _reference_is_the_policy(monkeypatch):
    """DPO's reference log-probabilities read the params being trained."""
    original = preference_structures.PreferenceStructure.loss_fn

    def loss_fn(self, loss_config, reference=None):
        inner = original(self, loss_config, reference)

        def without_reference(model, params, batch, rng, normalizer=None, num_sequences=None,
                              frozen_params=None):
            return inner(model, params, batch, rng, normalizer, num_sequences,
                         frozen_params=params)
        return without_reference
    monkeypatch.setattr(preference_structures.PreferenceStructure, "loss_fn", loss_fn)


def _no_length_normalisation(monkeypatch):
    """Each side's log-probability count reads 1: SimPO and ORPO use sums, not means."""
    original = preference_structures.PreferenceStructure.side_log_probs

    def side_log_probs(self, model, params, batch, side, rng=None):
        logps, count, tokens = original(self, model, params, batch, side, rng)
        return logps, count * 0 + 1, tokens
    monkeypatch.setattr(preference_structures.PreferenceStructure, "side_log_probs",
                        side_log_probs)


def _keywords_fixed(module, name: str, **fixed):
    """A removal: ``module.name`` called with ``fixed`` keyword arguments, whatever its
    caller passes (a loss whose clip, KL term or normalisation is taken out)."""
    def remove(monkeypatch):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, **kw: original(*a, **{**kw, **fixed}))
    return remove


_grpo_without_clipping = _keywords_fixed(losses, "grpo_loss", epsilon_low=np.inf,
                                         epsilon_high=np.inf)
_gspo_ratios_per_token = _keywords_fixed(losses, "grpo_loss", ratio_level="token")
_grpo_without_kl = _keywords_fixed(losses, "grpo_loss", beta=0.0)


def _dynamic_sampling_keeps_every_group(monkeypatch):
    from t5x_like.modes import rl
    monkeypatch.setattr(rl, "has_signal", lambda rewards: True)


_ppo_without_policy_clipping = _keywords_fixed(ppo, "ppo_loss", epsilon=np.inf)
_ppo_without_value_clipping = _keywords_fixed(ppo, "ppo_loss", value_epsilon=np.inf)
_ppo_without_kl_penalty = _keywords_fixed(ppo, "rollout_targets", kl_coef=0.0)
_ppo_without_missing_eos_penalty = _keywords_fixed(ppo, "rollout_targets",
                                                   missing_eos_penalty=0.0)


def _ppo_advantages_are_one_step(monkeypatch):
    """GAE's lambda 0: each advantage is its own TD error."""
    original = ppo.generalized_advantages
    monkeypatch.setattr(ppo, "generalized_advantages",
                        lambda rewards, values, gamma, lam: original(rewards, values, gamma, 0.0))


def _ppo_advantages_not_whitened(monkeypatch):
    original = ppo.masked_whiten
    monkeypatch.setattr(ppo, "masked_whiten", lambda values, mask, shift_mean=True: (
        values if shift_mean else original(values, mask, shift_mean)))


def _value_model_starts_fresh(monkeypatch):
    from t5x_like.modes import rl
    monkeypatch.setattr(rl, "value_model_params", lambda spec, flat_params, mesh: flat_params)


def _ppo_minibatches_unshuffled(monkeypatch):
    """Every epoch takes the rollout's rows in their order: the same minibatches."""
    from t5x_like.modes import rl

    def part(self, step):
        if self.minibatches == 1:
            return None
        index = (step - self.sampled_at) % self.minibatches
        size = len(self.last.batch["tokens"]) // self.minibatches
        return rl.minibatch(self.last.batch, np.arange(index * size, (index + 1) * size))
    monkeypatch.setattr(rl.RolloutBatches, "part", part)


def _ppo_minibatch_value_weights_kept(monkeypatch):
    """A minibatch keeps its rows' value weights, shares of the whole rollout's."""
    from t5x_like.modes import rl
    monkeypatch.setattr(rl, "minibatch",
                        lambda batch, rows: {key: value[rows] for key, value in batch.items()})


def _rollouts_never_use_the_engine(monkeypatch):
    """``rl.sampler=engine`` samples with the static sampler."""
    from t5x_like.modes import rl
    monkeypatch.setattr(rl.Rollouts, "_engine_sample", rl.Rollouts._static_sample)


DYNAMIC_SAMPLING = existing(
    "test_rl.py::test_dynamic_sampling_refills_groups_without_signal_and_resumes_exactly")
SIMPO = existing("test_preference_parity.py::test_simpo_equals_trl_cpo_trainer")
ORPO = existing("test_preference_parity.py::test_orpo_equals_trl_orpo_trainer")
GRPO_TWO_ITERATIONS = existing(
    "test_rl.py::test_grpo_loss_and_gradients_equal_trl_over_two_iterations",
    loss_type="dapo", beta=0.04, level="token")
GSPO_TWO_ITERATIONS = existing(
    "test_rl.py::test_grpo_loss_and_gradients_equal_trl_over_two_iterations",
    loss_type="dapo", beta=0.04, level="sequence")
PPO_K1 = existing("test_ppo_parity.py::test_ppo_targets_losses_and_step_equal_trl", case="k1")
PPO_K3 = existing("test_ppo_parity.py::test_ppo_targets_losses_and_step_equal_trl",
                  case="k3_whitened")
ENGINE_ROLLOUTS = existing("test_rl.py::test_engine_rollouts_are_the_static_samplers_greedy_tokens")
PPO_MINIBATCHES = existing("test_ppo_parity.py::test_ppo_minibatch_steps_equal_trl")
PPO_SHUFFLE = existing("test_ppo.py::test_ppo_minibatches_are_a_fresh_shuffle_each_epoch")
VALUE_MODEL_START = existing("test_ppo.py::test_the_value_model_starts_from_the_reward_model")

REMOVALS = [
    Removal("DPO reference", "DPO's reference log-probs read the policy being trained",
            "a DPO run's rewards part from 0 after step 1 (loss ln 2 there); the reference's "
            "files unchanged against a snapshot taken before", _reference_is_the_policy,
            dpo_moves_away_from_a_frozen_reference),
    Removal("SimPO length normalisation", "every response's token count reads 1 (sums)",
            "loss and rewards equal TRL's CPOTrainer (loss_type=simpo)",
            _no_length_normalisation, SIMPO[1], holds_in=SIMPO[0]),
    Removal("ORPO length normalisation", "every response's token count reads 1 (sums)",
            "loss, log-odds and rewards equal TRL's ORPOTrainer",
            _no_length_normalisation, ORPO[1], holds_in=ORPO[0]),
    Removal("GRPO clipping", "`grpo_loss` with epsilon infinite (the ratio never clipped)",
            "loss and every gradient equal TRL's GRPOTrainer on the second update of a "
            "rollout (ratio away from 1, TRL's clip_ratio > 0)", _grpo_without_clipping,
            GRPO_TWO_ITERATIONS[1], holds_in=GRPO_TWO_ITERATIONS[0]),
    Removal("GRPO KL penalty", "`grpo_loss` with beta 0", "the same TRL comparison at beta "
            "0.04 (loss, gradients, the logged KL)", _grpo_without_kl,
            GRPO_TWO_ITERATIONS[1], holds_in=GRPO_TWO_ITERATIONS[0]),
    Removal("GSPO sequence-level ratios", "`grpo_loss` gives every token its own ratio",
            "loss and every gradient equal TRL's GRPOTrainer with importance_sampling_level "
            "sequence on the second update of a rollout", _gspo_ratios_per_token,
            GSPO_TWO_ITERATIONS[1], holds_in=GSPO_TWO_ITERATIONS[0]),
    Removal("DAPO dynamic sampling", "every group counts as one with signal (none dropped)",
            "a run whose reward is constant for half the prompts refills their groups from "
            "more prompts (sampling rounds > 1) and trains on fewer groups without signal "
            "than the same run without it", _dynamic_sampling_keeps_every_group,
            DYNAMIC_SAMPLING[1], holds_in=DYNAMIC_SAMPLING[0]),
    Removal("PPO policy clipping", "`ppo_loss` with epsilon infinite",
            "the policy loss, its clip fraction and every policy gradient equal TRL 1.12's "
            "PPOTrainer on a rollout sampled by another policy (ratio away from 1)",
            _ppo_without_policy_clipping, PPO_K1[1], holds_in=PPO_K1[0]),
    Removal("PPO value clipping", "`ppo_loss` with value_epsilon infinite",
            "the value loss, its clip fraction and every value-model gradient equal TRL's, "
            "rollout values off the current ones", _ppo_without_value_clipping, PPO_K1[1],
            holds_in=PPO_K1[0]),
    Removal("PPO KL penalty in the reward", "`rollout_targets` with kl_coef 0",
            "advantages, returns and the logged KL and non-score reward equal TRL's",
            _ppo_without_kl_penalty, PPO_K1[1], holds_in=PPO_K1[0]),
    Removal("PPO missing-EOS penalty", "`rollout_targets` with missing_eos_penalty 0",
            "the logged scores, advantages and returns equal TRL's with missing_eos_penalty 1 "
            "(two of the eight completions have no EOS)", _ppo_without_missing_eos_penalty,
            PPO_K3[1], holds_in=PPO_K3[0]),
    Removal("PPO GAE", "GAE's lambda read as 0 (one-step TD errors)",
            "advantages and returns equal TRL's (lambda 0.95)", _ppo_advantages_are_one_step,
            PPO_K1[1], holds_in=PPO_K1[0]),
    Removal("PPO advantage whitening", "`masked_whiten` of the advantages returns them as they are",
            "advantages equal TRL's", _ppo_advantages_not_whitened, PPO_K1[1],
            holds_in=PPO_K1[0]),
    Removal("PPO value model from the reward model", "the value model keeps the policy's trunk "
            "and a fresh head", "PPO's start holds the reward model's trunk and head as its "
            "value model", _value_model_starts_fresh, VALUE_MODEL_START[1],
            holds_in=VALUE_MODEL_START[0]),
    Removal("PPO minibatch value weights", "a minibatch keeps its value positions' shares of "
            "the whole rollout", "the losses and both towers' change over an epoch of two "
            "minibatch steps equal TRL's PPOTrainer with num_mini_batches 2",
            _ppo_minibatch_value_weights_kept, PPO_MINIBATCHES[1], holds_in=PPO_MINIBATCHES[0]),
    Removal("RL rollouts through the engine", "`rl.sampler=engine` samples with the static "
            "sampler", "the engine's greedy completions equal the static sampler's and the "
            "engine stepped", _rollouts_never_use_the_engine, ENGINE_ROLLOUTS[1],
            holds_in=ENGINE_ROLLOUTS[0]),
    Removal("PPO minibatch shuffle", "every epoch takes the rollout's rows in order",
            "each epoch's minibatches partition the rollout in a different order",
            _ppo_minibatches_unshuffled, PPO_SHUFFLE[1], holds_in=PPO_SHUFFLE[0]),
]

globals().update(proving_tests(REMOVALS))
