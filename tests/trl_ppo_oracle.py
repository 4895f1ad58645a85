"""TRL 1.12's ``PPOTrainer`` (``trl.experimental.ppo``) run on fixed rollouts: the oracle
of ``tests/test_ppo_parity.py``, run in a subprocess with ``.venv/trl-ppo`` (TRL 1.12.0,
``oracle-requirements.txt``) first on ``PYTHONPATH``: the rest of the tests import TRL
1.16, which no longer has PPO.

Usage: ``python trl_ppo_oracle.py CASES.json OUT_FOLDER``. Each case names the Hugging
Face folders of the policy, the reference, the reward model, the value model and the
model whose logits stand for the sampling policy's, the prompts (with BOS), the
responses (``response_length`` ids each, pad after an EOS), offsets added to the value
model's values at rollout time (standing for a value model one epoch older, so the value
clip acts) and ``PPOConfig`` settings. TRL's own ``train()`` runs one epoch with SGD
over the policy and the value model: at learning rate 1 and one minibatch (each
parameter's change is minus its gradient), or a case's ``lr`` and its
``num_mini_batches`` (``permutations`` records the minibatches NumPy drew); three of
TRL's module functions are wrapped
to hand it the fixed rollout and to read what it computed (``batch_generation``: the
fixed responses and the sampling model's logits; ``get_reward``: the value offsets
added, the scores read; ``masked_whiten``: the advantages before and after whitening).
Nothing of TRL's arithmetic is replaced. Writes ``OUT_FOLDER/<case>.npz``.
"""

import json
import sys

import numpy as np
import torch
import transformers
from datasets import Dataset


def run_case(case: dict, out: str) -> None:
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    from trl.experimental.ppo import ppo_trainer as trl_ppo

    load = transformers.AutoModelForCausalLM.from_pretrained
    classifier = transformers.AutoModelForSequenceClassification.from_pretrained
    policy, reference, sampler = load(case["policy"]), load(case["reference"]), load(case["sampler"])
    reward_model, value_model = classifier(case["reward"]), classifier(case["value"])
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(case["tokenizer"])
    prompts, responses = case["prompts"], case["responses"]
    context = max(len(p) for p in prompts)
    queries = [[0] * (context - len(p)) + p for p in prompts]
    offsets = torch.tensor(case["value_offsets"], dtype=torch.float32)
    seen = {"order": None}
    temperature = case["settings"]["temperature"]

    def batch_generation(model, batch_queries, batch_size, pad_token_id, generation_config):
        order = [queries.index(row.tolist()) for row in batch_queries]
        seen["order"] = order
        query_responses = torch.cat([batch_queries, torch.tensor([responses[i] for i in order])], 1)
        with torch.no_grad():
            logits = trl_ppo.forward(sampler, query_responses, pad_token_id).logits
        return query_responses, logits[:, context - 1:-1] / (temperature + 1e-7)

    get_reward = trl_ppo.get_reward

    def wrapped_get_reward(model, query_responses, pad_token_id, context_length):
        values, scores, lengths = get_reward(model, query_responses, pad_token_id, context_length)
        if model is not value_model:  # the reward model's
            seen["scores"] = scores.detach().numpy().copy()
        else:
            values = values.clone()
            values[:, context - 1:context - 1 + offsets.shape[1], 0] += offsets[seen["order"]]
            seen["values"] = values[:, context - 1:-1, 0].detach().numpy().copy()
        return values, scores, lengths

    masked_whiten = trl_ppo.masked_whiten

    def wrapped_masked_whiten(values, mask, shift_mean=True):
        whitened = masked_whiten(values, mask, shift_mean)
        if shift_mean:  # the advantages' (the rewards' is shift_mean=False)
            seen["raw_advantages"] = values.detach().numpy().copy()
            seen["advantages"] = whitened.detach().numpy().copy()
        return whitened

    permutation = np.random.permutation

    def recorded_permutation(n):
        drawn = permutation(n)
        seen.setdefault("permutations", []).append(drawn.copy())
        return drawn

    np.random.permutation = recorded_permutation
    trl_ppo.batch_generation = batch_generation
    trl_ppo.get_reward = wrapped_get_reward
    trl_ppo.masked_whiten = wrapped_masked_whiten
    before = {name: p.detach().numpy().copy() for name, p in policy.named_parameters()}
    before_value = {name: p.detach().numpy().copy() for name, p in value_model.named_parameters()}
    rows = len(prompts)
    settings = dict(case["settings"])
    minibatches, lr = settings.pop("num_mini_batches", 1), settings.pop("lr", 1.0)
    args = PPOConfig(output_dir=f"{out}/trl_{case['name']}", report_to=[], use_cpu=True,
                     bf16=False, per_device_train_batch_size=rows, gradient_accumulation_steps=1,
                     num_mini_batches=minibatches, num_ppo_epochs=1, total_episodes=rows,
                     local_rollout_forward_batch_size=rows,
                     response_length=len(responses[0]), stop_token="eos",
                     num_sample_generations=0, save_strategy="no", logging_steps=1,
                     **settings)
    optimizer = torch.optim.SGD(list(policy.parameters()) + list(value_model.parameters()),
                                lr=lr)
    trainer = PPOTrainer(args=args, processing_class=tokenizer, model=policy,
                         ref_model=reference, reward_model=reward_model,
                         train_dataset=Dataset.from_dict({"input_ids": queries}),
                         value_model=value_model, optimizers=(optimizer, None))
    try:
        trainer.train()
    finally:
        np.random.permutation = permutation
    logged = [entry for entry in trainer.state.log_history if "loss/policy_avg" in entry][-1]
    arrays = {f"policy_step/{name}": before[name] - p.detach().numpy()
              for name, p in policy.named_parameters()}
    arrays.update({f"value_step/{name}": before_value[name] - p.detach().numpy()
                   for name, p in value_model.named_parameters()})
    arrays.update({key: np.asarray(value) for key, value in seen.items()})
    np.savez(f"{out}/{case['name']}.npz", logged=json.dumps(logged), **arrays)


def main() -> None:
    import trl
    assert trl.__version__ == "1.12.0", trl.__version__  # the PYTHONPATH took
    torch.use_deterministic_algorithms(True)
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    for case in cases:
        run_case(case, sys.argv[2])


if __name__ == "__main__":
    main()
