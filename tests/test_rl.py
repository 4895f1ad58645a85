"""Online RL (GRPO): the loss and the group advantages against TRL's ``GRPOTrainer`` on the
same tiny Llama, rollouts and rewards, and the loss and every gradient with one and two
updates per rollout (``rl.iterations``); sampling that a key reproduces; runs through
``train`` from an SFT checkpoint that resume exactly (rollouts included; with two updates
per rollout, stopped by a SIGTERM at a rollout boundary); the kept old log-probabilities
split by gradient accumulation; the one-line refusals of rewards and settings that cannot
work."""

import copy
import functools
import json
import os
import signal
import zlib

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

from t5x_like import config_lib, errors, structures, train
from t5x_like.config import spec_of
from t5x_like.convert import __main__ as convert_cli
from t5x_like.metrics.rewards import RewardRegistry
from t5x_like.modes import rl
from t5x_like.objectives import preference as losses

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


def trl_grpo(policy_hf, ref_hf, tmp_path, rollouts, num_iterations, **settings):
    """TRL's ``GRPOTrainer`` on a copy of the tiny Llama (its updates stay in the copy),
    handed the fixed rollouts, with ``ref_hf`` as its reference when ``beta`` > 0."""
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.grpo_trainer import add_fused_lm_head
    prompts, completions, rewards = rollouts

    def rollout_func(prompt_texts, trainer):
        return {"prompt_ids": [prompts[i // G] for i in range(len(prompt_texts))],
                "completion_ids": completions, "logprobs": [[0.0] * len(c) for c in completions]}

    def reward(prompts, completions, completion_ids, **kwargs):
        return rewards
    policy = copy.deepcopy(policy_hf)
    folder = tmp_path / f"policy_{num_iterations}"
    policy.save_pretrained(folder)
    policy.config._name_or_path = str(folder)
    trainer = GRPOTrainer(
        model=policy, reward_funcs=[reward], rollout_func=rollout_func,
        args=GRPOConfig(output_dir=str(tmp_path / "trl"), report_to=[], use_cpu=True, bf16=False,
                        num_generations=G, per_device_train_batch_size=2 * G,
                        max_completion_length=COMPLETION, num_iterations=num_iterations,
                        **settings),
        train_dataset=Dataset.from_list([{"prompt": "w3 w4"}] * 8),
        processing_class=tiny_hf_tokenizer())
    if settings.get("beta"):
        reference = copy.deepcopy(ref_hf)
        add_fused_lm_head(reference, temperature=settings["temperature"])
        trainer.ref_model = reference.eval()
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def trl_loss_and_gradients(trainer, rolled):
    """TRL's ``_compute_loss`` on ``rolled`` and the gradient of every parameter (by its
    Hugging Face name), as its ``training_step`` back-propagates it."""
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(trainer.model, rolled)
    loss.backward()
    gradients = {name: p.grad.detach().numpy().copy() for name, p in trainer.model.named_parameters()}
    logged = {key: values[-1] for key, values in trainer._metrics["train"].items()}
    return float(loss.detach()), gradients, logged


def assert_gradients_close(ours: dict, theirs: dict, what: str):
    """Every parameter's gradient within 1e-5, relative where an entry exceeds 1."""
    assert set(ours) == set(theirs), what
    for name, expected in theirs.items():
        error = np.abs(ours[name] - expected) / np.maximum(1.0, np.abs(expected))
        assert error.max() <= 1e-5, f"{what}: {name} differs by {error.max():.3g}"


# TRL 1.16 multiplies the KL term by the ratio by default (use_bias_correction_kl, the
# DeepSeek-V3.2 gradient); ours is the GRPO paper's k3 term, TRL's with it off.
TRL_GRPO_SETTINGS = dict(temperature=0.7, epsilon=0.2, epsilon_high=0.28,
                         use_bias_correction_kl=False)


@pytest.mark.parametrize("loss_type,beta,level", [
    ("grpo", 0.0, "token"), ("dapo", 0.04, "token"), ("bnpo", 0.0, "token"),
    ("dr_grpo", 0.04, "token"), ("grpo", 0.0, "sequence"), ("dapo", 0.04, "sequence")])
def test_grpo_loss_and_gradients_equal_trl_over_two_iterations(models, tmp_path,  # noqa: F811
                                                               loss_type, beta, level):
    """One update per rollout (``rl.iterations=1``, TRL's ``num_iterations=1``) and two
    (``num_iterations=2``): TRL keeps the sampling policy's log-probabilities, takes a
    first update (ratio 1), and its second reads the changed policy against them, so
    tokens (with ``rl.ratio_level=sequence``, GSPO's one ratio per completion, TRL's
    ``importance_sampling_level``: whole completions) are clipped. At each update our
    loss and the gradient of every parameter (ours exported to Hugging Face names by the
    converter) equal TRL's ``_compute_loss`` and its backward pass; the kept
    log-probabilities equal TRL's ``old_per_token_logps``. Between the two updates TRL's
    policy takes an SGD step of its gradients (learning rate 1), and our params are that
    policy imported."""
    (policy_hf, policy_config, policy_params), (ref_hf, ref_config, ref_params) = models
    prompts, completions, rewards = rollouts = fixed_rollouts()
    settings = dict(TRL_GRPO_SETTINGS, beta=beta, loss_type=loss_type,
                    importance_sampling_level=level)
    flat = convert_cli.flat_model(policy_config)
    converter = convert_cli.exporter_for(flat)
    lengths = [len(prompts[i // G]) for i in range(2 * G)]
    tokens, _, weights = rl.rollout_rows([prompts[i // G] for i in range(2 * G)], lengths,
                                         completions, eos_id=2, width=7 + COMPLETION)
    batch = {"tokens": jnp.asarray(tokens), "completion_loss_weights": jnp.asarray(weights),
             "advantages": losses.group_advantages(jnp.asarray(rewards, jnp.float32), G)}
    reference = rl_structure(ref_config, beta=beta, temperature=settings["temperature"])
    rl_settings = {k: v for k, v in settings.items()
                   if k not in ("use_bias_correction_kl", "importance_sampling_level")}
    rl_settings["ratio_level"] = level

    def ours(iterations, params, batch):
        """Our loss, metrics and gradients (by Hugging Face name), op by op: each op's
        compilation is shared by every case, where a jitted step would compile per case."""
        structure = rl_structure(policy_config, iterations=iterations, **rl_settings)
        loss_fn = structure.loss_fn(None, reference=reference)
        (loss, metrics), gradients = jax.value_and_grad(
            lambda p: loss_fn(structure.model, p, batch, None, frozen_params=ref_params),
            has_aux=True)(params)
        return float(loss), converter.params_to_hf(jax.device_get(gradients), flat), metrics

    once = trl_grpo(policy_hf, ref_hf, tmp_path, rollouts, 1, **settings)
    with torch.no_grad():
        rolled = once._generate_and_score_completions([{"prompt": "w3 w4"}] * (2 * G))
    assert "old_per_token_logps" not in rolled  # one update: the current policy's, detached
    loss, gradients, _ = trl_loss_and_gradients(once, rolled)
    our_loss, our_gradients, _ = ours(1, policy_params, batch)
    assert our_loss == pytest.approx(loss, rel=1e-5, abs=1e-6)
    assert_gradients_close(our_gradients, gradients, "one iteration")

    twice = trl_grpo(policy_hf, ref_hf, tmp_path, rollouts, 2, **settings)
    with torch.no_grad():
        rolled = twice._generate_and_score_completions([{"prompt": "w3 w4"}] * (2 * G))
    kept = rl_structure(policy_config, iterations=2, **rl_settings)
    old = kept.token_log_probs(kept.model, policy_params, batch["tokens"])
    completion = rolled["completion_mask"].numpy() > 0
    np.testing.assert_allclose(np.asarray(old)[weights > 0],
                               rolled["old_per_token_logps"].numpy()[completion], atol=1e-5)
    batch = {**batch, "old_log_probs": old}
    for update in (1, 2):
        loss, gradients, logged = trl_loss_and_gradients(twice, rolled)
        params = policy_params if update == 1 else converter.params_from_hf(
            {k: v.detach().numpy() for k, v in twice.model.state_dict().items()}, flat)
        our_loss, our_gradients, metrics = ours(2, params, batch)
        assert our_loss == pytest.approx(loss, rel=1e-5, abs=1e-6), update
        assert_gradients_close(our_gradients, gradients, f"update {update} of 2")
        for ours_key, trl_key in (("clip_ratio_low", "clip_ratio/low_mean"),
                                  ("clip_ratio_high", "clip_ratio/high_mean"),
                                  ("clip_ratio_region", "clip_ratio/region_mean")):
            assert float(metrics[ours_key]) == pytest.approx(logged[trl_key], abs=1e-6)
        if update == 1:
            assert logged["clip_ratio/region_mean"] == 0.0  # the ratio is 1
            with torch.no_grad():  # SGD, learning rate 1
                for parameter in twice.model.parameters():
                    parameter -= parameter.grad
    assert logged["clip_ratio/low_mean"] > 0 and logged["clip_ratio/high_mean"] > 0


def test_sampling_with_a_key_is_reproducible_and_top_k_one_is_greedy(models):  # noqa: F811
    """The rollout sampler (``decoding.generate_padded`` with temperature): the same key
    gives the same completions, another key others; top_k=1 samples the argmax."""
    from t5x_like.models import decoding
    (_, policy_config, params), _ = models
    model = rl_structure(policy_config).model
    prompts = jnp.asarray([[1, 5, 6, 7, 0, 0], [1, 9, 10, 0, 0, 0]] * 4)
    lengths = jnp.asarray([4, 3] * 4)

    # Whole under one jit per setting (the key an argument): called eagerly, each sample
    # ran its setup op by op.
    @functools.partial(jax.jit, static_argnames=("temperature", "top_k"))
    def generate(params, key, temperature, top_k):
        return decoding.generate_padded(
            model, params, prompts, lengths, max_new_tokens=COMPLETION, rng=key, eos_id=2,
            temperature=temperature, **({"top_k": top_k} if top_k else {}))

    def sample(key, temperature=1.0, top_k=0):
        return np.asarray(generate(params, key, temperature=temperature, top_k=top_k))
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


def test_completion_tokens_count_what_rollout_rows_keep():
    completions = np.array([[5, 6, 1, 7], [5, 6, 7, 8], [1, 1, 9, 9]])
    _, _, weights = rl.rollout_rows(np.array([[0, 3], [0, 3], [0, 3]]), np.array([2, 2, 2]),
                                    completions, eos_id=1, width=6)
    assert rl.completion_tokens(completions, eos_id=1) == weights.sum() == 3 + 4 + 1


def test_group_advantages_have_zero_mean_and_unit_spread_per_group():
    rewards = jnp.asarray([1.0, 0.0, 0.0, 1.0, 3.0, 3.0, 3.0, 3.0])
    advantages = np.asarray(losses.group_advantages(rewards, 4, "group"))
    np.testing.assert_allclose(advantages[:4].mean(), 0.0, atol=1e-6)
    np.testing.assert_allclose(advantages[:4].std(ddof=1), 1.0, rtol=1e-3)
    np.testing.assert_array_equal(advantages[4:], 0.0)  # no signal in an all-equal group


# The runs' decoder has one layer (test_preference_training's has two): what they check
# (rollouts, rewards, exact resume, the split of old log-probabilities) is the same at
# any depth, and every program they compile (init, rollout, train step) is smaller.
ONE_LAYER = {"model.num_layers": 1}


def rl_config(init_from, **overrides):
    return decoder_config(**{
        **ONE_LAYER,
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
    train.run(decoder_config(**{**ONE_LAYER, "task": "embedded_arithmetic",
                                "task_feature_lengths": {"inputs": 8, "targets": 4},
                                "data.prefix_attention": "causal", "num_train_steps": 4}),
              str(workdir), quiet=True)
    return workdir


def records(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").open()]


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["static", pytest.param("engine", marks=pytest.mark.slow)])
def test_grpo_trains_from_sft_and_resumes_exactly_rollouts_included(arithmetic_sft, tmp_path,
                                                                    sampler):
    """Either sampler (``rl.sampler``): the engine's rollouts resume as exactly."""
    straight = tmp_path / "straight"
    train.run(rl_config(arithmetic_sft, **{"rl.sampler": sampler}), str(straight), quiet=True)
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
    train.run(rl_config(arithmetic_sft, num_train_steps=2, **{"rl.sampler": sampler}),
              str(interrupted), quiet=True)
    train.run(rl_config(arithmetic_sft, **{"rl.sampler": sampler}), str(interrupted), quiet=True)
    resumed = records(interrupted)
    for key in ("loss", "reward", "kl", "completion_length"):
        assert [r[key] for r in resumed] == [r[key] for r in logged], key


def test_engine_rollouts_are_the_static_samplers_greedy_tokens(arithmetic_sft):
    """``rl.sampler=engine``: the continuous-batching engine, given a rollout's rows (their
    prompts of several lengths), continues each as ``generate_padded`` does: greedy, the
    same completions. The SFT model's params are perturbed so the rows' continuations
    differ (the tiny SFT model answers every prompt alike)."""
    from t5x_like import resolving
    from t5x_like.checkpoints import param_sources
    from t5x_like.data import get_task_or_mixture, pipeline
    from t5x_like.engine import trainer as trainer_lib
    completions, engines = {}, {}
    for sampler in ("static", "engine"):
        spec = resolving.resolve_spec(rl_config(arithmetic_sft, **{"rl.sampler": sampler}))
        _, trainer = trainer_lib.build_on_devices(spec)
        structure = structures.for_config(spec)
        loaded = param_sources.base_params(str(arithmetic_sft), spec, trainer.mesh)[0]
        leaves, tree = jax.tree.flatten(jax.device_get(loaded))
        noise = np.random.default_rng(0)
        params = trainer.place_params(jax.tree.unflatten(tree, [
            leaf + noise.normal(0.0, 0.5, np.shape(leaf)).astype(np.asarray(leaf).dtype)
            for leaf in leaves]))
        lengths = dict(spec.task_feature_lengths)
        rows = pipeline.build_dataset(spec.task, "validation", lengths, seed=0, shuffle=False,
                                      repeat=False,
                                      feature_converter=structure.feature_converter(lengths))
        batch = next(iter(pipeline.HostBatchIterator(rows, 16)))
        rollouts = rl.Rollouts(spec, trainer, structure,
                               get_task_or_mixture(spec.task).vocabulary, None)
        *_, completions[sampler] = rollouts.sample(params, batch, jax.random.key(0), greedy=True)
        engines[sampler] = rollouts._engine
    np.testing.assert_array_equal(completions["engine"], completions["static"])
    assert len({tuple(row) for row in completions["static"]}) > 4  # rows continue apart
    assert engines["static"] is None
    assert engines["engine"] is not None and engines["engine"].stats.steps > 0  # it sampled


def odd_prompts_only(completions, examples):
    """Signal for about half the prompts: a score of the completion's text (0 to 1 by
    its CRC, which differs between the group's sampled completions) where the prompt's
    text has an odd length, 0 (a group without signal) where it is even."""
    return [zlib.crc32(c.encode()) % 5 / 4 if len(e["prompt"]) % 2 else 0.0
            for c, e in zip(completions, examples, strict=True)]


def test_dynamic_sampling_refills_groups_without_signal_and_resumes_exactly(arithmetic_sft,
                                                                            tmp_path):
    """DAPO's dynamic sampling: groups whose rewards are all equal are dropped and
    refilled from the next prompts. Every step's batch has signal in each group unless
    the rounds ran out; the filter had groups to drop; more prompts were read than
    without it; and an interrupted run resumes into the same rollouts."""
    RewardRegistry.add("odd_prompts_only", odd_prompts_only)
    config = rl_config(arithmetic_sft, **{"rl.rewards": ("odd_prompts_only",),
                                          "rl.dynamic_sampling_rounds": 3})
    straight = tmp_path / "straight"
    train.run(config, str(straight), quiet=True)
    logged = records(straight)
    assert [r["step"] for r in logged] == [1, 2, 3, 4]
    for r in logged:
        assert 1 <= r["sampling_rounds"] <= 4
        if r["sampling_rounds"] < 4:  # rounds to spare: every group kept has signal
            assert r["groups_without_signal"] == 0.0, r
    assert any(r["sampled_groups_without_signal"] > 0 for r in logged)  # something dropped
    assert any(r["sampling_rounds"] > 1 for r in logged)  # and refilled
    plain = tmp_path / "plain"
    train.run(rl_config(arithmetic_sft, **{"rl.rewards": ("odd_prompts_only",)}), str(plain),
              quiet=True)
    without = records(plain)
    assert "sampling_rounds" not in without[0]
    assert (sum(r["groups_without_signal"] for r in logged)
            < sum(r["groups_without_signal"] for r in without))

    interrupted = tmp_path / "interrupted"
    train.run(set_keys(copy.deepcopy(config), {"num_train_steps": 2}), str(interrupted),
              quiet=True)
    train.run(config, str(interrupted), quiet=True)
    resumed = records(interrupted)
    for key in ("loss", "reward", "sampling_rounds", "groups_without_signal"):
        assert [r[key] for r in resumed] == [r[key] for r in logged], key


PREEMPT = {"armed": False}


def preempt_once(completions, examples):
    """A reward of 0 that, once armed, sends this process SIGTERM as it scores (the
    first rollout of a run): a preemption in the middle of that rollout's updates."""
    if PREEMPT["armed"]:
        PREEMPT["armed"] = False
        os.kill(os.getpid(), signal.SIGTERM)
    return [0.0] * len(completions)


@pytest.mark.slow
def test_grpo_two_iterations_per_rollout_resume_exactly_from_a_rollout_boundary(arithmetic_sft,
                                                                                tmp_path):
    """``rl.iterations=2``: a rollout every other step, its batch reused by the next
    update, which (at a large learning rate) clips tokens; a SIGTERM during the first
    rollout stops the run after that batch's second update (checkpoints are every 4
    steps, so only the preemption saves step 2), and the resumed run logs what an
    uninterrupted one does, step for step."""
    RewardRegistry.add("preempt_once", preempt_once)
    config = rl_config(arithmetic_sft, **{
        "rl.iterations": 2, "rl.rewards": ("exact_answer", "text_length", "preempt_once"),
        "optimizer.learning_rate": 0.03, "checkpoint.every_steps": 4})
    straight = tmp_path / "straight"
    train.run(config, str(straight), quiet=True)
    logged = records(straight)
    assert [r["step"] for r in logged] == [1, 2, 3, 4]
    sampled, reused = logged[0::2], logged[1::2]
    assert all("reward" in r and "rollout_seconds" in r for r in sampled)
    assert not any("reward" in r or "rollout_seconds" in r for r in reused)
    assert all("groups_without_signal" in r and "kl" in r for r in logged)
    assert all(r["clip_ratio_region"] == 0.0 for r in sampled)  # first update: ratio 1
    assert max(r["clip_ratio_region"] for r in reused) > 0.0  # the reused batch clips

    interrupted = tmp_path / "interrupted"
    PREEMPT["armed"] = True
    result = train.run(config, str(interrupted), quiet=True)
    assert not PREEMPT["armed"] and result["step"] == 2  # not 1: the batch's updates end
    assert sorted(p.name for p in (interrupted / "checkpoints").iterdir()
                  if p.name.isdigit()) == ["2"]
    train.run(config, str(interrupted), quiet=True)
    resumed = records(interrupted)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for key in ("loss", "kl", "clip_ratio_low", "clip_ratio_high", "grad_norm"):
        assert [r[key] for r in resumed] == [r[key] for r in logged], key
    for key in ("reward", "rewards/text_length", "completion_length"):
        assert [r[key] for r in resumed[0::2]] == [r[key] for r in sampled], key


def one_step_whole_and_in_two_microbatches(config_for, batch_for) -> dict:
    """``{1: metrics, 2: metrics}``: what one train step logs on a 4-way data mesh whole
    and in two optimizer microbatches (``config_for(microbatches)``: the run's config),
    from the same init, of the rollout batch ``batch_for(structure, params, rng, tokens,
    weights)`` builds: 8 rows of 13 random tokens, completions of 1 to 4 tokens after an
    8-token prompt (so the microbatches hold unequal token counts), laid out as
    ``abstract_batch`` says."""
    from t5x_like.engine import partitioning
    from t5x_like.engine import trainer as trainer_lib
    mesh = partitioning.make_mesh({"data": 4}, jax.devices()[:4])
    steps = {}
    for microbatches in (1, 2):
        spec = spec_of(config_for(microbatches))
        structure = structures.for_config(spec)
        trainer = trainer_lib.build_trainer(spec, mesh)
        state = trainer.init_state(0)
        rng = np.random.default_rng(0)
        weights = np.zeros((8, 12), np.float32)
        for row, completion in enumerate([1, 4, 2, 4, 1, 1, 3, 2]):
            weights[row, 8:8 + completion] = 1.0
        tokens = rng.integers(3, 100, size=(8, 13)).astype(np.int32)
        batch = batch_for(structure, state.params, rng, tokens, weights)
        abstract = structure.abstract_batch({"inputs": 8, "targets": 4}, spec.batch_size)
        assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
            k: (v.shape, v.dtype) for k, v in abstract.items()}
        _, metrics = trainer.train_step(state, partitioning.global_batch(batch, mesh,
                                                                         trainer.rules))
        steps[microbatches] = {k: float(v) for k, v in jax.device_get(metrics).items()}
    return steps


@pytest.mark.slow
@pytest.mark.parametrize("loss_type,level", [("dapo", "token"), ("grpo", "sequence")])
def test_old_log_probs_split_with_microbatches_as_the_rest_of_the_rollout(loss_type, level):
    """``rl.iterations=2``: a batch laid out by ``abstract_batch`` (so ``old_log_probs``
    among its features), sharded over a 4-way data mesh, gives one train step the same
    logged loss, gradient norm and clip ratios whole and in two microbatches (each
    microbatch reads its own rows' old log-probabilities; completions of 1 to 4 tokens,
    so the microbatches hold unequal token counts; GSPO's clip rates count completions),
    with old log-probabilities off the current policy's so the clip acts."""
    def config_for(microbatches):
        return rl_config("unused", **{"rl.iterations": 2, "rl.beta": 0.0, "mesh.data": 4,
                                      "optimizer.microbatches": microbatches,
                                      "rl.loss_type": loss_type, "rl.ratio_level": level})

    def batch_for(structure, params, rng, tokens, weights):
        assert structure.abstract_batch(
            {"inputs": 8, "targets": 4}, 8)["old_log_probs"].shape == (8, 12)
        current = structure.token_log_probs(structure.model, params, jnp.asarray(tokens))
        return {"tokens": tokens, "completion_loss_weights": weights,
                "advantages": rng.normal(size=8).astype(np.float32),
                # off by enough that whole completions clip too (their mean log-ratio)
                "old_log_probs": np.asarray(current) + rng.normal(
                    0, 0.3 if level == "token" else 1.0, (8, 12)).astype(np.float32)}

    steps = one_step_whole_and_in_two_microbatches(config_for, batch_for)
    whole, split = steps[1], steps[2]
    assert whole["clip_ratio_region"] > 0
    for key in ("loss", "grad_norm", "clip_ratio_low", "clip_ratio_high", "num_target_tokens",
                "num_completion_tokens"):
        assert split[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7), key


def _raises(completions, examples):
    raise KeyError("score")


@pytest.mark.parametrize("reward,message", [
    (_raises, "reward 'broken_reward' raised KeyError"),
    (lambda completions, examples: [1.0], r"returned 1 values for 8 completions; return one each"),
    (lambda completions, examples: ["good"] * len(completions), "not a number"),
    (lambda completions, examples: [1.0] * 7 + [float("nan")], r"reward 'broken_reward' gave "
     r"nan for completion 7 \(.*\) for step 1 \(1 of 8 not finite\); return finite floats"),
])
def test_a_reward_that_fails_stops_the_run_naming_it(arithmetic_sft, tmp_path, reward, message):
    RewardRegistry.add("broken_reward", reward)
    with pytest.raises(errors.UserError, match=message):
        train.run(rl_config(arithmetic_sft, **{"rl.rewards": ("broken_reward",)}),
                  str(tmp_path / "rl"), quiet=True)


def test_a_reward_that_turns_nan_mid_run_names_the_step_and_keeps_the_checkpoint(
        arithmetic_sft, tmp_path):
    """A reward that is NaN from its third rollout on: the run stops in one line naming
    the reward, the completion and step 3; the checkpoint of step 2 stays, and the run
    resumes from it once the reward is fixed."""
    calls = []

    def turns_nan(completions, examples):
        calls.append(len(completions))
        return [float("nan") if len(calls) >= 3 else 0.5] * len(completions)
    RewardRegistry.add("turns_nan", turns_nan)
    config = rl_config(arithmetic_sft, **{"rl.rewards": ("text_length", "turns_nan"),
                                          "checkpoint.every_steps": 2})
    workdir = tmp_path / "rl"
    with pytest.raises(errors.UserError, match=r"reward 'turns_nan' gave nan for completion 0 "
                       r"\(.*\) for step 3 \(8 of 8 not finite\)"):
        train.run(config, str(workdir), quiet=True)
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()
                  if p.name.isdigit()) == [2]
    RewardRegistry.add("turns_nan", lambda completions, examples: [0.5] * len(completions))
    train.run(config, str(workdir), quiet=True)
    steps = [json.loads(line)["step"] for line in
             (workdir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 4 and 3 in steps


def test_engine_rollouts_are_refused_where_the_engine_cannot_sample(arithmetic_sft,
                                                                   monkeypatch):
    """``rl.sampler=engine`` on more than one process, or with a policy that reads no
    paged cache: one line naming ``rl.sampler=static``, before anything runs."""
    import types

    import flax.linen as nn
    spec = spec_of(rl_config(arithmetic_sft, **{"rl.sampler": "engine"}))
    rl.check_engine(spec)  # one process, a paged decoder: taken
    with monkeypatch.context() as patched:
        patched.setattr(jax, "process_count", lambda: 2)
        with pytest.raises(errors.UserError,
                           match=r"samples on one process; this run has 2\. Use "
                                 r"--config.rl.sampler=static\."):
            rl.check_engine(spec)
    monkeypatch.setattr(structures, "for_config",
                        lambda spec: types.SimpleNamespace(policy_model=nn.Dense(1)))
    with pytest.raises(errors.UserError, match=r"rl.sampler='engine': Dense.__call__ takes no "
                                               r"page_table.* Use --config.rl.sampler=static"):
        rl.check_engine(spec)


@pytest.mark.parametrize("overrides,message", [
    ({"rl.rewards": ("no_such_reward",)}, "not a registered reward"),
    ({"rl.reward_model": "{sft}"}, "is not a reward model"),
    ({"batch_size": 6}, "multiple of rl.num_generations=4"),
    ({"evals.held_out.kind": "held_out_loss"}, "kind=rollouts"),
    ({"rl.temperature": 0.0}, "must be > 0"),
    ({"rl.reward_weights": (1.0,)}, "1 weights for 2 rewards"),
    ({"rl.top_p": 1.5}, r"must be in \(0, 1\]"),
    ({"rl.beta": 0.04, "init_from": ""}, "neither rl.reference nor init_from"),
    ({"rl.iterations": 3}, r"num_train_steps=4 is not a multiple of rl.iterations=3 .*"
                           r"--config.num_train_steps=6\."),
    ({"rl.iterations": 2, "checkpoint.every_steps": 3},
     r"checkpoint.every_steps=3 is not a multiple of rl.iterations=2 .*"
     r"--config.checkpoint.every_steps=4\."),
    ({"rl.num_mini_batches": 2}, "a GRPO rollout is one step's batch"),
])
def test_rl_settings_that_cannot_work_are_refused(arithmetic_sft, tmp_path, overrides, message):
    overrides = {k: (v.format(sft=arithmetic_sft) if isinstance(v, str) else v)
                 for k, v in overrides.items()}
    with pytest.raises(errors.ConfigError, match=message):
        train.run(set_keys(rl_config(arithmetic_sft), overrides), str(tmp_path / "rl"),
                  quiet=True)
