"""Preference losses against TRL on the same tiny transformers Llama and the same batch of
pairs: DPO (sigmoid, cDPO-free robust, IPO, hinge) through ``DPOTrainer``, SimPO through
``CPOTrainer``, ORPO through ``ORPOTrainer``, the Bradley-Terry reward model through
``RewardTrainer``; losses and the logged rewards, margins and accuracies within 1e-5.

Our side imports the Hugging Face weights (``convert import``) and reads the pairs through
``PairFeatureConverter``; TRL's side reads the same ids through its own collator."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from datasets import Dataset
from hf_helpers import tiny_hf_llama, tiny_hf_tokenizer

from t5x_like import config_lib, structures
from t5x_like.config import spec_of
from t5x_like.convert import __main__ as convert_cli
from t5x_like.convert import load_pretrained
from t5x_like.data.preference import PairFeatureConverter

LENGTHS = {"inputs": 10, "targets": 6}
TOLERANCE = 1e-5


def pair_examples(count=6, seed=0):
    """Pairs of token ids: a prompt (without BOS) and two different responses."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        chosen = rng.integers(3, 99, size=int(rng.integers(1, 6))).tolist()
        rejected = rng.integers(3, 99, size=int(rng.integers(1, 6))).tolist()
        pairs.append({"prompt": rng.integers(3, 99, size=int(rng.integers(2, 9))).tolist(),
                      "chosen": chosen, "rejected": rejected,
                      "margin": float(rng.uniform(0, 1))})
    return pairs


def perturbed(model, seed, scale=0.05):
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter += scale * torch.randn_like(parameter)
    return model


@functools.cache
def imported(tmp_root, name, seed):
    """(HF model, our model spec dict, our params) for a perturbed tiny Llama."""
    import pathlib
    hf = perturbed(tiny_hf_llama(), seed)
    folder = pathlib.Path(tmp_root) / name
    hf.save_pretrained(folder / "hf")
    convert_cli.import_hf(str(folder / "hf"), str(folder / "ours"))
    model_config, params = load_pretrained(folder / "ours")
    return hf, model_config, params


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("preference_models"))
    return imported(root, "policy", 1), imported(root, "reference", 2)


def our_structure(model_config, **preference):
    config = config_lib.default_config()
    config.model = model_config["model"] if "model" in model_config else model_config
    config.task_feature_lengths = dict(LENGTHS)
    config.init_from = "unused"
    config.preference.update(preference)
    return structures.for_config(spec_of(config))


def our_batch(structure, pairs):
    converter = structure.feature_converter(LENGTHS)
    assert isinstance(converter, PairFeatureConverter)
    rows = [converter.convert_example(pair, LENGTHS) for pair in pairs]
    return {key: jnp.asarray(np.stack([row[key] for row in rows])) for key in rows[0]}


def trl_examples(pairs):
    return [{"prompt_ids": [1] + p["prompt"], "chosen_ids": p["chosen"],
             "rejected_ids": p["rejected"]} for p in pairs]


TEXT_DATASET = [{"prompt": "w3 w4", "chosen": "w5", "rejected": "w6"}] * 4


def trl_args(config_class, tmp_path, **settings):
    return config_class(output_dir=str(tmp_path / "trl"), report_to=[], use_cpu=True, bf16=False,
                        per_device_train_batch_size=4, **settings)


def assert_close(ours, theirs, what):
    assert abs(float(ours) - float(theirs)) <= TOLERANCE * max(1.0, abs(float(theirs))), (
        f"{what}: ours {float(ours):.7g}, TRL {float(theirs):.7g}")


@pytest.mark.parametrize("loss_type,label_smoothing", [
    ("sigmoid", 0.0), ("robust", 0.1), ("ipo", 0.0), ("hinge", 0.0)])
def test_dpo_equals_trl(models, tmp_path, loss_type, label_smoothing):
    from trl import DPOConfig, DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference
    (policy_hf, policy_config, policy_params), (ref_hf, ref_config, ref_params) = models
    pairs = pair_examples()
    beta = 0.3
    trainer = DPOTrainer(model=policy_hf, ref_model=ref_hf, args=trl_args(
        DPOConfig, tmp_path, beta=beta, loss_type=[loss_type], label_smoothing=label_smoothing),
        train_dataset=Dataset.from_list(TEXT_DATASET), processing_class=tiny_hf_tokenizer())
    trainer.model.train()
    with torch.no_grad():
        loss = trainer._compute_loss(trainer.model, DataCollatorForPreference(pad_token_id=0)(
            trl_examples(pairs)), False)
    logged = {key: values[-1] for key, values in trainer._metrics["train"].items()}

    policy = our_structure(policy_config, objective="dpo", beta=beta, loss_type=loss_type,
                           label_smoothing=label_smoothing)
    reference = our_structure(ref_config, objective="dpo")
    objective, metrics = policy.loss_fn(config_lib.default_config().loss, reference=reference)(
        policy.model, policy_params, our_batch(policy, pairs), None, frozen_params=ref_params)
    assert_close(objective, loss, "loss")
    for ours, theirs in (("rewards_chosen", "rewards/chosen"),
                         ("rewards_rejected", "rewards/rejected"),
                         ("rewards_margin", "rewards/margins"), ("accuracy", "rewards/accuracies"),
                         ("logps_chosen", "logps/chosen"), ("logps_rejected", "logps/rejected")):
        assert_close(metrics[ours], logged[theirs], ours)


def cpo_batch(pairs):
    """TRL's older paired layout (CPO, ORPO): prompt + response rows with labels -100 on the
    prompt and the padding."""
    out = {}
    for side in ("chosen", "rejected"):
        rows = [[1] + p["prompt"] + p[side] for p in pairs]
        width = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for i, (row, pair) in enumerate(zip(rows, pairs, strict=True)):
            ids[i, :len(row)] = torch.tensor(row)
            mask[i, :len(row)] = 1
            start = 1 + len(pair["prompt"])
            labels[i, start:len(row)] = torch.tensor(row[start:])
        out.update({f"{side}_input_ids": ids, f"{side}_attention_mask": mask,
                    f"{side}_labels": labels})
    return out


def test_simpo_equals_trl_cpo_trainer(models, tmp_path):
    from trl.experimental.cpo import CPOConfig, CPOTrainer
    (policy_hf, policy_config, policy_params), _ = models
    pairs = pair_examples(seed=3)
    settings = dict(beta=2.0, simpo_gamma=0.7, label_smoothing=0.1)
    trainer = CPOTrainer(model=policy_hf, args=trl_args(CPOConfig, tmp_path, loss_type="simpo",
                                                        cpo_alpha=0.0, **settings),
                         train_dataset=Dataset.from_list(TEXT_DATASET),
                         processing_class=tiny_hf_tokenizer())
    with torch.no_grad():
        loss, logged = trainer.get_batch_loss_metrics(trainer.model, cpo_batch(pairs))
    policy = our_structure(policy_config, objective="simpo", **settings)
    objective, metrics = policy.loss_fn(config_lib.default_config().loss)(
        policy.model, policy_params, our_batch(policy, pairs), None)
    assert_close(objective, loss, "loss")
    for ours, theirs in (("rewards_chosen", "rewards/chosen"),
                         ("rewards_rejected", "rewards/rejected"),
                         ("rewards_margin", "rewards/margins"), ("accuracy", "rewards/accuracies")):
        assert_close(metrics[ours], logged[theirs], ours)


def test_orpo_equals_trl_orpo_trainer(models, tmp_path):
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer
    (policy_hf, policy_config, policy_params), _ = models
    pairs = pair_examples(seed=4)
    trainer = ORPOTrainer(model=policy_hf, args=trl_args(ORPOConfig, tmp_path, beta=0.25),
                          train_dataset=Dataset.from_list(TEXT_DATASET),
                          processing_class=tiny_hf_tokenizer())
    with torch.no_grad():
        loss, logged = trainer.get_batch_loss_metrics(trainer.model, cpo_batch(pairs))
    policy = our_structure(policy_config, objective="orpo", beta=0.25)
    objective, metrics = policy.loss_fn(config_lib.default_config().loss)(
        policy.model, policy_params, our_batch(policy, pairs), None)
    assert_close(objective, loss, "loss")
    for ours, theirs in (("rewards_chosen", "rewards/chosen"),
                         ("rewards_rejected", "rewards/rejected"), ("nll_loss", "nll_loss"),
                         ("rewards_margin", "rewards/margins"), ("accuracy", "rewards/accuracies"),
                         ("log_odds_ratio", "log_odds_chosen")):
        assert_close(metrics[ours], logged[theirs], ours)


@pytest.mark.parametrize("with_margin", [False, True])
def test_reward_model_equals_trl_reward_trainer(models, tmp_path, with_margin):
    import transformers
    from trl import RewardConfig, RewardTrainer
    (policy_hf, policy_config, policy_params), _ = models
    classifier = transformers.LlamaForSequenceClassification(transformers.LlamaConfig(
        **{**policy_hf.config.to_dict(), "num_labels": 1}))
    classifier.model.load_state_dict(policy_hf.model.state_dict())
    torch.manual_seed(5)
    torch.nn.init.normal_(classifier.score.weight, std=0.5)
    classifier.eval()
    pairs = pair_examples(seed=5)
    trainer = RewardTrainer(model=classifier, args=trl_args(
        RewardConfig, tmp_path, center_rewards_coefficient=0.01),
        train_dataset=Dataset.from_list([{"chosen": "w3 w5", "rejected": "w3 w6"}] * 4),
        processing_class=tiny_hf_tokenizer())
    rows = [[1] + p["prompt"] + p[side] for side in ("chosen", "rejected") for p in pairs]
    width = max(len(r) for r in rows)
    inputs = {"input_ids": torch.tensor([r + [0] * (width - len(r)) for r in rows]),
              "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r))
                                              for r in rows])}
    if with_margin:
        inputs["margin"] = torch.tensor([p["margin"] for p in pairs])
    else:
        pairs = [{**p, "margin": 0.0} for p in pairs]
    trainer.model.train()
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, inputs)
    logged = {key: values[-1] for key, values in trainer._metrics["train"].items()}

    reward = our_structure(policy_config, objective="reward_model", center_rewards=0.01)
    params = {"backbone": policy_params,
              "head": {"kernel": classifier.score.weight.detach().numpy().T}}
    objective, metrics = reward.loss_fn(config_lib.default_config().loss)(
        reward.model, params, our_batch(reward, pairs), None)
    assert_close(objective, loss, "loss")
    assert_close(metrics["accuracy"], logged["accuracy"], "accuracy")
    assert_close(metrics["rewards_margin"], logged["margin"], "margin")
    rewards = jnp.concatenate([reward.rewards(params, our_batch(reward, pairs)[f"{s}_tokens"],
                                              our_batch(reward, pairs)[f"{s}_mask"])
                               for s in ("chosen", "rejected")])
    assert_close(rewards.mean(), logged["mean_reward"], "mean reward")
    assert_close(rewards.max(), logged["max_reward"], "max reward")
    assert np.isfinite(jax.device_get(objective))
