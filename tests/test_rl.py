"""Online RL (GRPO): the loss and the group advantages against TRL's ``GRPOTrainer`` on the
same tiny Llama, rollouts and rewards; sampling that a key reproduces; a run through
``train`` from an SFT checkpoint that resumes exactly (rollouts included); the one-line
refusals of rewards that cannot work."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import set_keys
from datasets import Dataset
from hf_helpers import tiny_hf_tokenizer
from test_preference_parity import models  # noqa: F401  (the imported tiny Llamas)
from test_preference_training import decoder_config

from t5x_like import config_lib, errors, rl, structures, train
from t5x_like.config import spec_of
from t5x_like.objectives import preference as losses
from t5x_like.rewards import RewardRegistry

G = 4
COMPLETION = 5


def fixed_rollouts(seed=0):
    """Two prompts (with BOS), four completions each (some end with EOS 2, some are cut
    off), and a reward for each."""
    rng = np.random.default_rng(seed)
    prompts = [[1] + rng.integers(3, 99, size=int(rng.integers(2, 6))).tolist() for _ in range(2)]
    completions = []
    for i in range(2 * G):
        tokens = rng.integers(3, 99, size=int(rng.integers(1, COMPLETION))).tolist()
        completions.append(tokens + [2] if i % 3 else tokens)
    rewards = rng.uniform(0, 1, size=2 * G).round(2)
    rewards[4:] = [0.5, 0.5, 1.0, 0.0]
    return prompts, completions, rewards.tolist()


def rl_structure(model_config, **rl_settings):
    config = config_lib.default_config()
    config.model = model_config["model"] if "model" in model_config else model_config
    config.task = "embedded_arithmetic"
    config.task_feature_lengths = {"inputs": 6, "targets": COMPLETION}
    config.batch_size = 2 * G
    config.init_from = "unused"
    config.evals.held_out.every_steps = 0
    config.rl.update(dict(algorithm="grpo", num_generations=G, **rl_settings))
    return structures.for_config(spec_of(config))


@pytest.mark.parametrize("loss_type,scale,beta", [("dapo", "group", 0.04), ("grpo", "batch", 0.0),
                                                  ("bnpo", "none", 0.1)])
def test_grpo_loss_and_advantages_equal_trl(models, tmp_path, loss_type, scale, beta):  # noqa: F811
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.grpo_trainer import add_fused_lm_head
    (policy_hf, policy_config, policy_params), (ref_hf, ref_config, ref_params) = models
    prompts, completions, rewards = fixed_rollouts()
    temperature = 0.7

    def rollout_func(prompt_texts, trainer):
        return {"prompt_ids": [prompts[i // G] for i in range(len(prompt_texts))],
                "completion_ids": completions, "logprobs": [[0.0] * len(c) for c in completions]}

    def reward(prompts, completions, completion_ids, **kwargs):
        return rewards
    policy_hf.save_pretrained(tmp_path / "policy")
    policy_hf.config._name_or_path = str(tmp_path / "policy")
    trainer = GRPOTrainer(
        model=policy_hf, reward_funcs=[reward], rollout_func=rollout_func,
        args=GRPOConfig(output_dir=str(tmp_path / "trl"), report_to=[], use_cpu=True, bf16=False,
                        num_generations=G, per_device_train_batch_size=2 * G,
                        max_completion_length=COMPLETION, beta=beta, loss_type=loss_type,
                        scale_rewards=scale, temperature=temperature, epsilon=0.2,
                        epsilon_high=0.28),
        train_dataset=Dataset.from_list([{"prompt": "w3 w4"}] * 8),
        processing_class=tiny_hf_tokenizer())
    if beta:
        add_fused_lm_head(ref_hf, temperature=temperature)
        trainer.ref_model = ref_hf.eval()
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    with torch.no_grad():
        rolled = trainer._generate_and_score_completions([{"prompt": "w3 w4"}] * (2 * G))
        loss = trainer._compute_loss(trainer.model, rolled)
    logged = {key: values[-1] for key, values in trainer._metrics["train"].items()}

    advantages = losses.group_advantages(jnp.asarray(rewards, jnp.float32), G, scale)
    np.testing.assert_allclose(advantages, rolled["advantages"].numpy(), rtol=1e-5, atol=1e-6)
    structure = rl_structure(policy_config, beta=beta, loss_type=loss_type,
                             scale_rewards=scale, temperature=temperature, epsilon=0.2,
                             epsilon_high=0.28)
    reference = rl_structure(ref_config, beta=beta, temperature=temperature)
    lengths = [len(prompts[i // G]) for i in range(2 * G)]
    tokens, _, weights = rl.rollout_rows([prompts[i // G] for i in range(2 * G)], lengths,
                                         completions, eos_id=2, width=7 + COMPLETION)
    batch = {"tokens": jnp.asarray(tokens), "completion_loss_weights": jnp.asarray(weights),
             "advantages": advantages}
    objective, metrics = structure.loss_fn(None, reference=reference)(
        structure.model, policy_params, batch, None, frozen_params=ref_params)
    assert abs(float(objective) - float(loss)) < 1e-5 * max(1.0, abs(float(loss))), (
        float(objective), float(loss))
    if beta:
        assert float(metrics["kl"]) == pytest.approx(logged["kl"], rel=1e-5, abs=1e-6)
    assert float(metrics["num_completion_tokens"]) == float(rolled["completion_mask"].sum())


def test_sampling_with_a_key_is_reproducible_and_top_k_one_is_greedy(models):  # noqa: F811
    """The rollout sampler (``decoding.generate_padded`` with temperature): the same key
    gives the same completions, another key others; top_k=1 samples the argmax."""
    from t5x_like import decoding
    (_, policy_config, params), _ = models
    model = rl_structure(policy_config).model
    prompts = jnp.asarray([[1, 5, 6, 7, 0, 0], [1, 9, 10, 0, 0, 0]] * 4)
    lengths = jnp.asarray([4, 3] * 4)

    def sample(key, **options):
        return np.asarray(decoding.generate_padded(
            model, params, prompts, lengths, max_new_tokens=COMPLETION, rng=key,
            eos_id=2, **{"temperature": 1.0, **options}))
    first, again = sample(jax.random.key(3)), sample(jax.random.key(3))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, sample(jax.random.key(4)))
    np.testing.assert_array_equal(sample(jax.random.key(5), top_k=1),
                                  sample(None, temperature=0.0))


def test_rollout_rows_mark_the_completion_through_its_eos():
    tokens, mask, weights = rl.rollout_rows([[1, 7, 8], [1, 9]], [3, 2], [[4, 2, 5], [6, 6, 6]],
                                            eos_id=2, width=6)
    assert tokens.tolist() == [[1, 7, 8, 4, 2, 0], [1, 9, 6, 6, 6, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0]]
    # position t predicts token t + 1: the completion's tokens 4, 2 and 6, 6, 6
    assert weights.tolist() == [[0, 0, 1, 1, 0], [0, 1, 1, 1, 0]]


def test_group_advantages_have_zero_mean_and_unit_spread_per_group():
    rewards = jnp.asarray([1.0, 0.0, 0.0, 1.0, 3.0, 3.0, 3.0, 3.0])
    advantages = np.asarray(losses.group_advantages(rewards, 4, "group"))
    np.testing.assert_allclose(advantages[:4].mean(), 0.0, atol=1e-6)
    np.testing.assert_allclose(advantages[:4].std(ddof=1), 1.0, rtol=1e-3)
    np.testing.assert_array_equal(advantages[4:], 0.0)  # no signal in an all-equal group


def rl_config(init_from, **overrides):
    return decoder_config(**{
        "task": "embedded_arithmetic", "task_feature_lengths": {"inputs": 8, "targets": 4},
        "init_from": str(init_from), "rl.algorithm": "grpo", "rl.num_generations": 4,
        "rl.beta": 0.04, "rl.temperature": 1.5, "rl.rewards": ("exact_answer", "text_length"),
        "num_train_steps": 4, "evals.held_out.kind": "rollouts",
        "evals.held_out.every_steps": 4, "evals.held_out.batches": 1, **overrides})


def text_length(completions, examples):
    """A dense test reward (an untrained model almost never answers right): the
    completion's length in characters, which every sample varies."""
    return [min(len(c), 20) / 20 for c in completions]


@pytest.fixture(scope="module")
def arithmetic_sft(tmp_path_factory):
    RewardRegistry.add("text_length", text_length)
    workdir = tmp_path_factory.mktemp("arith_sft")
    train.run(decoder_config(**{"task": "embedded_arithmetic",
                                "task_feature_lengths": {"inputs": 8, "targets": 4},
                                "data.prefix_attention": "causal", "num_train_steps": 4}),
              str(workdir), quiet=True)
    return workdir


def records(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").open()]


@pytest.mark.slow
def test_grpo_trains_from_sft_and_resumes_exactly_rollouts_included(arithmetic_sft, tmp_path):
    straight = tmp_path / "straight"
    train.run(rl_config(arithmetic_sft), str(straight), quiet=True)
    logged = records(straight)
    assert [r["step"] for r in logged] == [1, 2, 3, 4]
    for key in ("reward", "rewards/exact_answer", "rewards/text_length", "kl", "clip_ratio_low",
                "groups_without_signal", "completion_length", "rollout_tokens_per_sec"):
        assert key in logged[0], key
    assert any(r["groups_without_signal"] < 1.0 for r in logged)  # the dense reward varies
    assert "eval_reward" in logged[-1] and logged[-1]["eval_prompts"] == 8
    events = [json.loads(line) for line in (straight / "goodput.jsonl").open()]
    assert sum(e.get("rollout_s", 0.0) for e in events) > 0  # booked apart from the update

    interrupted = tmp_path / "interrupted"
    train.run(rl_config(arithmetic_sft, num_train_steps=2), str(interrupted), quiet=True)
    train.run(rl_config(arithmetic_sft), str(interrupted), quiet=True)
    resumed = records(interrupted)
    for key in ("loss", "reward", "kl", "completion_length"):
        assert [r[key] for r in resumed] == [r[key] for r in logged], key


def _raises(completions, examples):
    raise KeyError("score")


@pytest.mark.parametrize("reward,message", [
    (_raises, "reward 'broken_reward' raised KeyError"),
    (lambda completions, examples: [1.0], r"returned 1 values for 8 completions; return one each"),
    (lambda completions, examples: ["good"] * len(completions), "not a number"),
])
def test_a_reward_that_fails_stops_the_run_naming_it(arithmetic_sft, tmp_path, reward, message):
    RewardRegistry.add("broken_reward", reward)
    with pytest.raises(errors.UserError, match=message):
        train.run(rl_config(arithmetic_sft, **{"rl.rewards": ("broken_reward",)}),
                  str(tmp_path / "rl"), quiet=True)


@pytest.mark.parametrize("overrides,message", [
    ({"rl.rewards": ("no_such_reward",)}, "not a registered reward"),
    ({"rl.reward_model": "{sft}"}, "is not a reward model"),
    ({"batch_size": 6}, "multiple of rl.num_generations=4"),
    ({"evals.held_out.kind": "held_out_loss"}, "kind=rollouts"),
    ({"rl.temperature": 0.0}, "must be > 0"),
    ({"rl.reward_weights": (1.0,)}, "1 weights for 2 rewards"),
    ({"rl.top_p": 1.5}, r"must be in \(0, 1\]"),
    ({"rl.beta": 0.04, "init_from": ""}, "neither rl.reference nor init_from"),
])
def test_rl_settings_that_cannot_work_are_refused(arithmetic_sft, tmp_path, overrides, message):
    overrides = {k: (v.format(sft=arithmetic_sft) if isinstance(v, str) else v)
                 for k, v in overrides.items()}
    with pytest.raises(errors.ConfigError, match=message):
        train.run(set_keys(rl_config(arithmetic_sft), overrides), str(tmp_path / "rl"),
                  quiet=True)
