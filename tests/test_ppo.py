"""PPO through ``train`` (InstructGPT's road, in miniature): an SFT decoder, a reward model
trained from it on preference pairs, then PPO against that reward model: the value model
starts from the reward model, the run logs PPO's losses and its KL penalty, resumes
exactly, and what reads its checkpoint (``init_from``, ``eval``, ``convert export``)
gets the policy alone. Its refusals are one line each."""

import jax
import numpy as np
import pytest
from conftest import set_keys
from flax import traverse_util
from test_preference_training import decoder_config
from test_rl import (  # noqa: F401  (arithmetic_sft: the fixture)
    ONE_LAYER,
    arithmetic_sft,
    one_step_whole_and_in_two_microbatches,
    records,
    rl_config,
)

from t5x_like import errors, structures, train
from t5x_like.checkpoints import param_sources
from t5x_like.config import spec_of
from t5x_like.engine import partitioning
from t5x_like.modes import rl


@pytest.fixture(scope="module")
def reward_model(arithmetic_sft, tmp_path_factory):  # noqa: F811
    """A reward model of the SFT decoder's architecture, trained from it on pairs."""
    workdir = tmp_path_factory.mktemp("reward_model")
    train.run(decoder_config(**{**ONE_LAYER, "task": "embedded_austen_cloze_preference",
                                "task_feature_lengths": {"inputs": 16, "targets": 4},
                                "init_from": str(arithmetic_sft),
                                "preference.objective": "reward_model", "num_train_steps": 2,
                                "evals.held_out.every_steps": 0}), str(workdir), quiet=True)
    return workdir


def ppo_config(sft, reward, **overrides):
    return rl_config(sft, **{"rl.algorithm": "ppo", "rl.beta": 0.0, "rl.reward_model": str(reward),
                             "rl.rewards": ("exact_answer", "text_length"), "rl.iterations": 2,
                             "rl.kl_coef": 0.1, "optimizer.learning_rate": 0.01,
                             "checkpoint.every_steps": 2, **overrides})


def flat(params) -> dict:
    return traverse_util.flatten_dict(jax.device_get(params))


@pytest.mark.slow
def test_ppo_trains_against_a_reward_model_resumes_exactly_and_exports_the_policy(
        arithmetic_sft, reward_model, tmp_path):  # noqa: F811
    config = ppo_config(arithmetic_sft, reward_model)
    straight = tmp_path / "straight"
    train.run(config, str(straight), quiet=True)
    logged = records(straight)
    assert [r["step"] for r in logged] == [1, 2, 3, 4]
    sampled, reused = logged[0::2], logged[1::2]
    for key in ("reward", "rewards/reward_model", "rewards/text_length", "kl",
                "non_score_reward", "rlhf_reward", "scores", "rollout_seconds"):
        assert all(key in r for r in sampled), key
        assert not any(key in r for r in reused), key
    for key in ("policy_loss", "value_loss", "clip_fraction", "value_clip_fraction", "approx_kl"):
        assert all(np.isfinite(r[key]) for r in logged), key
    assert "groups_without_signal" not in logged[0]  # one completion a prompt: no groups
    assert all(r["approx_kl"] < 1e-9 for r in sampled)  # each batch's first epoch: ratio 1
    assert max(r["approx_kl"] for r in reused) > 0.0  # the second reads the moved policy
    assert logged[0]["rlhf_reward"] == pytest.approx(
        logged[0]["scores"] + logged[0]["non_score_reward"], rel=1e-5)

    interrupted = tmp_path / "interrupted"
    train.run(ppo_config(arithmetic_sft, reward_model, num_train_steps=2), str(interrupted),
              quiet=True)
    train.run(config, str(interrupted), quiet=True)
    resumed = records(interrupted)
    for key in ("loss", "policy_loss", "value_loss", "grad_norm"):
        assert [r[key] for r in resumed] == [r[key] for r in logged], key
    for key in ("reward", "kl", "scores"):
        assert [r[key] for r in resumed[0::2]] == [r[key] for r in sampled], key

    # A reader of the run's checkpoint gets the policy, a decoder like the SFT model.
    decoder_spec = spec_of(decoder_config(**{**ONE_LAYER, "task": "embedded_arithmetic"}))
    mesh = partitioning.make_mesh({"data": 1}, jax.devices()[:1])
    policy, _ = param_sources.base_params(str(straight), decoder_spec, mesh)
    sft, _ = param_sources.base_params(str(arithmetic_sft), decoder_spec, mesh)
    assert set(flat(policy)) == set(flat(sft))
    assert any(not np.array_equal(flat(policy)[k], flat(sft)[k]) for k in flat(sft))  # trained
    further = tmp_path / "further"  # and a run starts from it
    train.run(rl_config(straight, **{"num_train_steps": 1, "checkpoint.every_steps": 1}),
              str(further), quiet=True)
    assert records(further)[0]["step"] == 1


@pytest.mark.slow
def test_ppo_minibatches_split_each_rollout_and_resume_exactly(arithmetic_sft, reward_model,  # noqa: F811
                                                               tmp_path):
    """``rl.num_mini_batches`` 2 x ``rl.iterations`` 2: a rollout of twice the batch serves
    4 updates of half of it each, the epoch's two minibatches together its whole; the
    second minibatch reads the policy the first moved; a run resumes between rollouts."""
    def config_for(steps):
        return ppo_config(arithmetic_sft, reward_model, **{
            "rl.num_mini_batches": 2, "num_train_steps": steps, "checkpoint.every_steps": 4})
    config = config_for(8)
    straight = tmp_path / "straight"
    train.run(config, str(straight), quiet=True)
    logged = records(straight)
    assert [r["step"] for r in logged] == list(range(1, 9))
    assert [("reward" in r) for r in logged] == [True, False, False, False] * 2
    rollout_rows = 2 * config.batch_size
    for first in (0, 4):  # each rollout's 4 updates: 2 epochs of 2 minibatches
        tokens = [r["num_target_tokens"] for r in logged[first:first + 4]]
        whole = logged[first]["completion_length"] * rollout_rows
        assert tokens[0] + tokens[1] == pytest.approx(whole)
        assert tokens[2] + tokens[3] == pytest.approx(whole)
    assert logged[0]["approx_kl"] < 1e-9  # sampled by the policy the first update reads
    assert logged[1]["approx_kl"] > 0.0  # the second minibatch: after the first's update

    interrupted = tmp_path / "interrupted"
    train.run(config_for(4), str(interrupted), quiet=True)
    train.run(config, str(interrupted), quiet=True)
    for key in ("loss", "policy_loss", "value_loss", "grad_norm", "num_target_tokens"):
        assert [r[key] for r in records(interrupted)] == [r[key] for r in logged], key


def test_ppo_minibatches_are_a_fresh_shuffle_each_epoch():
    """``RolloutBatches.part``: each epoch's minibatches partition the rollout's rows, in a
    different order each epoch and the same order for the same seed and rollout step
    (what exact resume needs); each minibatch's value weights sum to 1 (its own count);
    with one minibatch every update reads the whole rollout."""
    rows, minibatches = 16, 4
    value_mask = np.zeros((rows, 6), np.float32)
    value_mask[np.arange(rows), np.arange(rows) % 6] = 1.0
    value_mask[::3, 0] = 1.0  # rows of 1 and 2 value positions: minibatch counts differ
    batch = {"tokens": np.arange(rows)[:, None].repeat(6, axis=1),
             "value_weights": value_mask / value_mask.sum()}

    def source(seed, sampled_at, count=minibatches):
        made = rl.RolloutBatches.__new__(rl.RolloutBatches)
        made.seed, made.minibatches, made.sampled_at = seed, count, sampled_at
        made.last = rl.Rollout(batch, {})
        return made

    def epochs(made):
        parts = [made.part(made.sampled_at + i) for i in range(2 * minibatches)]
        return [[list(p["tokens"][:, 0]) for p in parts[e * minibatches:(e + 1) * minibatches]]
                for e in range(2)], parts

    (first, second), parts = epochs(source(0, 8))
    for epoch in (first, second):
        assert sorted(r for part in epoch for r in part) == list(range(rows))
        assert all(len(part) == rows // minibatches for part in epoch)
    assert first != second
    assert epochs(source(0, 8))[0] == [first, second]
    assert epochs(source(1, 8))[0] != [first, second]
    for part in parts:
        assert part["value_weights"].sum() == pytest.approx(1.0)
        np.testing.assert_array_equal(part["value_weights"] > 0,
                                      value_mask[part["tokens"][:, 0]] > 0)
    assert source(0, 8, count=1).part(9) is None


def test_the_value_model_starts_from_the_reward_model(arithmetic_sft, reward_model):  # noqa: F811
    """PPO's start: the reward model's trunk and head under ``value``; without a reward
    model the value model keeps the policy's trunk (``params_from_pretrained``)."""
    spec = spec_of(ppo_config(arithmetic_sft, reward_model))
    mesh = partitioning.make_mesh({"data": 1}, jax.devices()[:1])
    started = rl.value_model_params(spec, {("policy", "x"): 1}, mesh)
    saved = rl.reward_model_spec(spec)
    reward_params, _ = param_sources.base_params(str(reward_model), saved, mesh)
    expected = {("value", *k): v for k, v in flat(reward_params).items()}
    assert set(started) == {("policy", "x"), *expected}
    for key, value in expected.items():
        np.testing.assert_array_equal(started[key], value)
    without = spec_of(ppo_config(arithmetic_sft, reward_model, **{"rl.reward_model": ""}))
    assert rl.value_model_params(without, {("policy", "x"): 1}, mesh) == {("policy", "x"): 1}


def test_a_reward_model_exports_as_a_sequence_classifier(arithmetic_sft, reward_model,  # noqa: F811
                                                         tmp_path):
    """``convert export`` of a reward-model run writes ``GPT2ForSequenceClassification``
    (what TRL's PPOTrainer takes as its reward and value models): transformers' scores
    of right-padded rows equal ours."""
    import torch
    import transformers

    from t5x_like.convert import __main__ as convert_cli
    from t5x_like.structures.preference import RewardStructure
    convert_cli.export_hf(str(reward_model), str(tmp_path / "hf"))
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "GPT2ForSequenceClassification"
    assert "pipeline_tag: text-classification" in (tmp_path / "hf" / "README.md").read_text()
    assert not (tmp_path / "hf" / "generation_config.json").exists()  # it does not generate
    saved = rl.reward_model_spec(spec_of(ppo_config(arithmetic_sft, reward_model)))
    mesh = partitioning.make_mesh({"data": 1}, jax.devices()[:1])
    params, _ = param_sources.base_params(str(reward_model), saved, mesh)
    rng = np.random.default_rng(0)
    lengths = np.array([3, 7, 12, 5])
    tokens = np.zeros((4, 12), np.int32)
    for row, length in enumerate(lengths):
        tokens[row, 1:length] = rng.integers(3, 500, length - 1)  # the start id 0, then text
    mask = (np.arange(12)[None] < lengths[:, None]).astype(np.int32)
    structure = RewardStructure(structures.for_config(saved).body, None)
    ours = np.asarray(structure.rewards(params, jax.numpy.asarray(tokens), mask))
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(tokens, dtype=torch.long),
                    attention_mask=torch.tensor(mask)).logits[:, 0].numpy()
    np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("overrides,message", [
    ({"peft.lora.rank": 4}, "without peft"),
    ({"rl.value_model": "{sft}"}, r"rl.value_model=.* is not a reward model"),
    ({"rl.dynamic_sampling_rounds": 2}, "PPO samples one completion a prompt"),
    ({"init_from": ""}, "set init_from"),
    ({"rl.num_mini_batches": 2, "num_train_steps": 6},
     r"num_train_steps=6 is not a multiple of rl.iterations x rl.num_mini_batches=4 .*"
     r"--config.num_train_steps=8"),
])
def test_ppo_settings_that_cannot_work_are_refused(arithmetic_sft, reward_model, tmp_path,  # noqa: F811
                                                   overrides, message):
    overrides = {k: (v.format(sft=arithmetic_sft) if isinstance(v, str) else v)
                 for k, v in overrides.items()}
    with pytest.raises(errors.UserError, match=message):
        train.run(set_keys(ppo_config(arithmetic_sft, reward_model), overrides),
                  str(tmp_path / "ppo"), quiet=True)


@pytest.mark.slow
def test_a_ppo_step_in_two_microbatches_equals_it_whole():
    """A PPO batch (``abstract_batch``'s features: completions of 1 to 4 tokens, so the
    microbatches hold unequal token and value-position counts; old log-probabilities and
    values off the current ones, so both clips act) on a 4-way data mesh: one train
    step logs the same loss, gradient norm, losses and clip fractions whole and in two
    optimizer microbatches."""
    import jax.numpy as jnp

    from t5x_like.objectives import ppo

    def config_for(microbatches):
        return ppo_config("unused", "unused", **{"mesh.data": 4,
                                                 "optimizer.microbatches": microbatches})

    def batch_for(structure, params, rng, tokens, weights):
        logps = np.asarray(structure.token_log_probs(structure.model, params, tokens))
        values = np.asarray(structure.values(structure.model, params, tokens))
        value_mask, _ = ppo.completion_spans(jnp.asarray(weights), 4)
        noise = {scale: rng.normal(0, scale, (8, 12)).astype(np.float32)
                 for scale in (0.3, 0.5, 1.0, 2.0)}
        return {"tokens": tokens, "completion_loss_weights": weights,
                "old_log_probs": logps + noise[0.3], "old_values": values + noise[0.5],
                "advantages": noise[1.0] * weights, "returns": noise[2.0],
                "value_weights": np.asarray(ppo.value_shares(value_mask))}

    steps = one_step_whole_and_in_two_microbatches(config_for, batch_for)
    whole, split = steps[1], steps[2]
    assert whole["clip_fraction"] > 0 and whole["value_clip_fraction"] > 0
    for key in ("loss", "grad_norm", "policy_loss", "value_loss", "clip_fraction",
                "value_clip_fraction", "approx_kl", "num_target_tokens"):
        assert split[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7), key
