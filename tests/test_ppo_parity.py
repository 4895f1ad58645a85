"""PPO against TRL's own ``PPOTrainer`` (TRL 1.12.0, the last to ship it; run by
``trl_ppo_oracle.py`` in a subprocess) on the same tiny Llamas and fixed rollouts: the
scores, the per-token KL penalty folded into the rewards, GAE's advantages (whitened) and
returns, the clipped policy and value losses, their clip fractions, and one optimizer
step's change of every parameter of the policy and of the value model, within 1e-5.

The rollout is one TRL cannot sample for us reproducibly, so it is fixed: prompts of
several lengths (eight: TRL whitens rewards from eight
rows on); completions that end with EOS early, at the last position, at the first,
or not at all; the sampling policy's log-probabilities from a third model (so the ratio
is not 1 and the policy clip acts) and the value model's rollout values moved by fixed
offsets (so the value clip acts). Two settings: k1 KL and raw rewards with γ=1, λ=0.95
(TRL's defaults); k3 KL and whitened rewards with γ=0.9, λ=0.8 and a missing-EOS
penalty of 1."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from hf_helpers import tiny_hf_llama, tiny_hf_tokenizer
from test_preference_parity import perturbed

from t5x_like import config_lib, structures
from t5x_like.config import spec_of
from t5x_like.convert import __main__ as convert_cli
from t5x_like.convert import load_pretrained
from t5x_like.modes import rl
from t5x_like.objectives import ppo
from t5x_like.objectives import preference as losses
from t5x_like.structures.reinforcement import PpoStructure

ROOT = pathlib.Path(__file__).resolve().parents[1]
ORACLE_PATH = ROOT / ".venv" / "trl-ppo"  # oracle-requirements.txt installs TRL 1.12.0 there
R = 5  # response_length
PROMPTS = [[1, 11, 12], [1, 21, 22, 23, 24], [1, 31, 32, 33], [1, 41, 42], [1, 51, 52, 53, 54],
           [1, 61, 62, 63], [1, 64, 65], [1, 66, 67, 68, 69]]
RESPONSES = [[71, 72, 2, 0, 0],     # EOS early: the score sits after it
             [73, 74, 75, 76, 77],  # no EOS: the score on the last token
             [78, 79, 80, 81, 2],   # EOS at the last position
             [2, 0, 0, 0, 0],       # EOS first
             [82, 2, 0, 0, 0],
             [83, 84, 85, 2, 0],
             [86, 87, 88, 89, 90],
             [91, 92, 2, 0, 0]]
CASES = {"k1": dict(kl_estimator="k1", whiten_rewards=False, gamma=1.0, lam=0.95),
         "k3_whitened": dict(kl_estimator="k3", whiten_rewards=True, gamma=0.9, lam=0.8,
                             missing_eos_penalty=1.0)}
# TRL's num_mini_batches: one epoch of two minibatch steps (whitened rewards need 8 rows a
# minibatch in TRL, so k1's settings), at a learning rate that keeps the second step's
# gradient, read after the first moved the params, in the range the tolerance is for.
MINIBATCHES = {"minibatches": dict(kl_estimator="k1", whiten_rewards=False, gamma=1.0, lam=0.95,
                                   num_mini_batches=2, lr=0.05)}
SHARED = dict(temperature=0.7, kl_coef=0.2, cliprange=0.2, cliprange_value=0.2, vf_coef=0.1)
TOLERANCE = 1e-5


def classifier(seed: int, head_seed: int):
    """A one-label Llama classifier (a reward or value model) on a perturbed tiny Llama."""
    base = perturbed(tiny_hf_llama(), seed)
    model = transformers.LlamaForSequenceClassification(transformers.LlamaConfig(
        **{**base.config.to_dict(), "num_labels": 1}))
    model.model.load_state_dict(base.model.state_dict())
    torch.manual_seed(head_seed)
    torch.nn.init.normal_(model.score.weight, std=0.5)
    return model.eval()


def import_decoder(hf, folder: pathlib.Path):
    hf.save_pretrained(folder / "hf")
    convert_cli.import_hf(str(folder / "hf"), str(folder / "ours"))
    return load_pretrained(folder / "ours")


def import_classifier(hf, folder: pathlib.Path):
    """Our ``{"backbone", "head"}`` params of a Llama classifier (its backbone imported as a
    causal Llama with the same trunk)."""
    causal = tiny_hf_llama()
    causal.model.load_state_dict(hf.model.state_dict())
    hf.save_pretrained(folder / "classifier")
    model_config, params = import_decoder(causal, folder)
    return model_config, {"backbone": params,
                          "head": {"kernel": hf.score.weight.detach().numpy().T.copy()}}


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """The HF folders, our params, and TRL's results for every case (one subprocess)."""
    root = tmp_path_factory.mktemp("ppo_parity")
    hf = {"policy": perturbed(tiny_hf_llama(), 1), "reference": perturbed(tiny_hf_llama(), 2),
          "sampler": perturbed(tiny_hf_llama(), 3, scale=0.15)}
    ours = {name: import_decoder(model, root / name) for name, model in hf.items()}
    reward_hf, value_hf = classifier(4, 14), classifier(5, 15)
    ours["reward"] = import_classifier(reward_hf, root / "reward")
    ours["value"] = import_classifier(value_hf, root / "value")
    tiny_hf_tokenizer().save_pretrained(root / "tokenizer")
    offsets = np.random.default_rng(0).normal(0.0, 0.3, size=(len(PROMPTS), R)).round(3)
    # Not on the value clip's edge (|offset| = cliprange_value): there which side a value
    # falls on is float noise, and PyTorch's clamp and JAX's clip split its gradient
    # differently (1 and 1/2).
    edge = np.abs(np.abs(offsets) - SHARED["cliprange_value"]) < 0.01
    offsets = np.where(edge, offsets + 0.03 * np.sign(offsets), offsets)
    folders = {name: str(root / name / "hf") for name in hf}
    folders.update(reward=str(root / "reward" / "classifier"),
                   value=str(root / "value" / "classifier"))
    cases = [{"name": name, **folders, "tokenizer": str(root / "tokenizer"),
              "prompts": PROMPTS, "responses": RESPONSES, "value_offsets": offsets.tolist(),
              "settings": {**SHARED, **settings}}
             for name, settings in {**CASES, **MINIBATCHES}.items()]
    (root / "cases.json").write_text(json.dumps(cases))
    assert (ORACLE_PATH / "trl" / "experimental" / "ppo").is_dir(), (
        "TRL 1.12.0 is missing: .venv/bin/pip install --no-deps --target .venv/trl-ppo "
        "-r oracle-requirements.txt (README's test command does)")
    env = {**os.environ, "PYTHONPATH": str(ORACLE_PATH), "TRL_EXPERIMENTAL_SILENCE": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "trl_ppo_oracle.py"),
                           str(root / "cases.json"), str(root)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {name: dict(np.load(root / f"{name}.npz")) for name in {**CASES, **MINIBATCHES}}
    return ours, offsets, results


def our_structure(model_config, settings: dict) -> PpoStructure:
    config = config_lib.default_config()
    config.model = model_config["model"] if "model" in model_config else model_config
    config.task = "embedded_arithmetic"
    config.task_feature_lengths = {"inputs": 5, "targets": R}
    config.batch_size = len(PROMPTS)
    config.init_from = "unused"
    config.evals.held_out.every_steps = 0
    config.rl.update(dict(algorithm="grpo", rewards=(), reward_model="unused",
                          temperature=settings["temperature"], epsilon=settings["cliprange"],
                          value_epsilon=settings["cliprange_value"], vf_coef=settings["vf_coef"],
                          kl_coef=settings["kl_coef"], kl_estimator=settings["kl_estimator"],
                          gamma=settings["gamma"], lam=settings["lam"],
                          whiten_rewards=settings["whiten_rewards"],
                          missing_eos_penalty=settings.get("missing_eos_penalty", 0.0)))
    spec = spec_of(config)
    body = structures.for_config(spec).body
    return PpoStructure(body, body, spec.rl, R)


def rollout_rows():
    """Our rows of the fixed rollout: ``(tokens, completion weights, first completion
    position of each row)``; a completion is kept through its EOS."""
    width = 1 + 5 + R
    tokens = np.zeros((len(PROMPTS), width), np.int32)
    weights = np.zeros((len(PROMPTS), width - 1), np.float32)
    for i, (prompt, response) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        kept = response[:response.index(2) + 1] if 2 in response else response
        tokens[i, :len(prompt) + len(kept)] = prompt + kept
        weights[i, len(prompt) - 1:len(prompt) - 1 + len(kept)] = 1.0
    return tokens, weights, np.array([len(p) - 1 for p in PROMPTS])


def response_view(values, starts) -> np.ndarray:
    """``[rows, R]`` of our ``[rows, positions]`` array: TRL's response positions."""
    values = np.asarray(values)
    return np.stack([values[i, s:s + R] for i, s in enumerate(starts)])


def assert_close(ours, theirs, what: str):
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    error = np.abs(ours - theirs) / np.maximum(1.0, np.abs(theirs))
    assert error.max() <= TOLERANCE, f"{what}: differs by {error.max():.3g}\n{ours}\n{theirs}"


def hf_gradients(gradients, model_config, classifier_head: bool) -> dict:
    """Our gradients by Hugging Face name: a decoder's through the converter; a value
    model's trunk the same way (named as its classifier's ``model.*``; the unused output
    projection its import carries has a zero gradient and no classifier name) and its
    head as ``score.weight``."""
    flat = convert_cli.flat_model(model_config)
    converter = convert_cli.exporter_for(flat)
    if not classifier_head:
        return converter.params_to_hf(jax.device_get(gradients), flat)
    named = converter.params_to_hf(jax.device_get(gradients["backbone"]), flat)
    assert not np.asarray(named.pop("lm_head.weight")).any()
    named["score.weight"] = np.asarray(gradients["head"]["kernel"]).T
    return named


def our_rollout(ours, offsets, settings):
    """Our side of the fixed rollout: ``(structure, params, tokens, weights, starts,
    scores, targets, metrics, batch)``, the batch the update reads."""
    policy_config, policy_params = ours["policy"]
    structure = our_structure(policy_config, settings)
    tokens, weights, starts = rollout_rows()
    tokens_j, weights_j = jnp.asarray(tokens), jnp.asarray(weights)
    params = {"policy": policy_params, "value": ours["value"][1]}

    # The rollout side: the sampler's and the reference's log-probabilities, the value
    # model's values (moved by the offsets), the reward model's scores.
    plain = structure.body
    temperature = settings["temperature"]

    def logps(decoder_params):
        logits = plain.apply_model(plain.model, decoder_params,
                                   {"decoder_input_tokens": tokens_j[:, :-1]})
        return losses.per_token_log_probs(
            logits.astype(jnp.float32) / temperature, tokens_j[:, 1:])

    old_logps = logps(ours["sampler"][1]) * weights_j
    ref_logps = logps(ours["reference"][1]) * weights_j
    shift = np.zeros(weights.shape, np.float32)
    for i, s in enumerate(starts):
        shift[i, s:s + R] = offsets[i]
    old_values = structure.values(structure.model, params, tokens_j) + shift
    reward_structure = structures.preference.RewardStructure(plain, None)
    mask = jnp.asarray((np.arange(tokens.shape[1])[None] <= starts[:, None]
                        + weights.sum(1)[:, None]).astype(np.int32))
    scores = reward_structure.rewards(ours["reward"][1], tokens_j, mask)
    targets, metrics = ppo.rollout_targets(
        scores, old_logps, ref_logps, old_values, weights_j, completion_length=R,
        kl_coef=settings["kl_coef"], kl_estimator=settings["kl_estimator"],
        gamma=settings["gamma"], lam=settings["lam"], whiten_rewards=settings["whiten_rewards"],
        has_eos=jnp.asarray([2 in response for response in RESPONSES], jnp.float32),
        missing_eos_penalty=settings.get("missing_eos_penalty", 0.0))
    batch = {"tokens": tokens_j, "completion_loss_weights": weights_j,
             "old_log_probs": old_logps, "old_values": old_values,
             "advantages": targets["advantages"], "returns": targets["returns"],
             "value_weights": ppo.value_shares(targets["value_mask"])}
    return structure, params, tokens, weights, starts, scores, targets, metrics, batch


@pytest.mark.parametrize("case", list(CASES))
def test_ppo_targets_losses_and_step_equal_trl(setting, case):
    ours, offsets, results = setting
    trl = results[case]
    logged = json.loads(str(trl["logged"]))
    order = trl["order"]
    settings = {**SHARED, **CASES[case]}
    (structure, params, tokens, weights, starts, scores, targets, metrics,
     batch) = our_rollout(ours, offsets, settings)
    assert_close(np.asarray(scores)[order], trl["scores"], "scores")
    # TRL zeroes the whitened advantages off the completion after whitening (what the
    # oracle reads is before): compared on the completion, ours 0 elsewhere.
    completion = response_view(weights, starts)[order] > 0
    advantages = response_view(targets["advantages"], starts)[order]
    assert_close(np.where(completion, advantages, 0.0),
                 np.where(completion, trl["advantages"], 0.0), "advantages")
    assert not advantages[~completion].any()
    value_mask = response_view(targets["value_mask"], starts)[order] > 0
    trl_returns = trl["raw_advantages"] + np.where(value_mask, trl["values"], 0.0)
    assert_close(np.where(value_mask, response_view(targets["returns"], starts)[order], 0.0),
                 np.where(value_mask, trl_returns, 0.0), "returns")
    for ours_key, trl_key in (("kl", "objective/kl"), ("scores", "objective/scores"),
                              ("non_score_reward", "objective/non_score_reward"),
                              ("rlhf_reward", "objective/rlhf_reward")):
        assert_close(metrics[ours_key], logged[trl_key], ours_key)

    # The update: one step of the clipped losses, its gradients against TRL's SGD step.
    loss_fn = structure.loss_fn(None)
    (loss, step_metrics), gradients = jax.value_and_grad(
        lambda p: loss_fn(structure.model, p, batch, None), has_aux=True)(params)
    for ours_key, trl_key in (("policy_loss", "loss/policy_avg"),
                              ("value_loss", "loss/value_avg"),
                              ("clip_fraction", "policy/clipfrac_avg"),
                              ("value_clip_fraction", "val/clipfrac_avg")):
        assert_close(step_metrics[ours_key], logged[trl_key], ours_key)
    assert logged["policy/clipfrac_avg"] > 0 and logged["val/clipfrac_avg"] > 0  # clips act
    assert_close(loss, logged["loss/policy_avg"] + settings["vf_coef"] * logged["loss/value_avg"],
                 "loss")
    assert_steps_equal(gradients, ours, trl)


def assert_steps_equal(changes, ours, trl):
    """Each tower's parameter change (ours ``changes``, by our names) equals TRL's."""
    for tower, (name, config, head) in {"policy": ("policy_step", ours["policy"][0], False),
                                        "value": ("value_step", ours["value"][0], True)}.items():
        named = hf_gradients(changes[tower], config, head)
        theirs = {key.split("/", 1)[1]: value for key, value in trl.items()
                  if key.startswith(name + "/")}
        assert set(named) == set(theirs), (tower, set(named) ^ set(theirs))
        for key, expected in theirs.items():
            assert_close(named[key], expected, f"{tower} gradient {key}")


def test_ppo_minibatch_steps_equal_trl(setting):
    """TRL's ``num_mini_batches=2``: an epoch of two SGD steps, each on the rows of its
    minibatch of the permutation TRL drew, the second read after the first's step. Ours
    takes the same rows with ``modes.rl.minibatch`` (which re-weighs the value positions
    to the minibatch's count) and steps the same way: the logged losses (TRL's mean over
    the minibatches) and both towers' change over the epoch equal TRL's."""
    ours, offsets, results = setting
    trl = results["minibatches"]
    logged = json.loads(str(trl["logged"]))
    settings = {**SHARED, **MINIBATCHES["minibatches"]}
    structure, params, *_, batch = our_rollout(ours, offsets, settings)
    drawn = np.asarray(trl["permutations"])[-1]  # TRL's rows, the epoch's order
    rows = trl["order"][drawn]  # ours
    half = len(rows) // 2
    loss_fn = structure.loss_fn(None)
    host = jax.device_get(batch)
    start, seen = params, []
    for part in (rows[:half], rows[half:]):
        minibatch = {k: jnp.asarray(v) for k, v in rl.minibatch(host, part).items()}
        (_, metrics), gradients = jax.value_and_grad(
            lambda p, mb=minibatch: loss_fn(structure.model, p, mb, None), has_aux=True)(params)
        seen.append(metrics)
        params = jax.tree.map(lambda p, g: p - settings["lr"] * g, params, gradients)
    for ours_key, trl_key in (("policy_loss", "loss/policy_avg"),
                              ("value_loss", "loss/value_avg"),
                              ("clip_fraction", "policy/clipfrac_avg"),
                              ("value_clip_fraction", "val/clipfrac_avg")):
        assert_close(np.mean([m[ours_key] for m in seen]), logged[trl_key], ours_key)
    assert_steps_equal(jax.tree.map(lambda a, b: a - b, start, params), ours, trl)
