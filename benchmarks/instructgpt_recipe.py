"""InstructGPT's recipe in miniature (``docs/preference_tuning.md``): SFT -> a reward model
on preference pairs -> PPO against it, on the embedded corpus, with a hidden rule in the
labellers' place (``_instructgpt_rule.py``: a continuation scores the share of its words
that start with a vowel).

1. SFT: the small GPT-2 pretrained 500 steps on the corpus (``configs/pretrain/
   gpt2_tiny.py``), then 200 steps on ``embedded_en_prefix_lm`` (the corpus's own
   continuations of its prefixes: the demonstrations; ``configs/finetune/
   gpt2_tiny_arithmetic_sft.py``'s recipe with that task);
2. pairs: two samples (temperature 1) of the SFT model for each training prompt,
   labelled by the rule (ties dropped); every 8th pair held out;
3. a reward model from the SFT model on those pairs (Bradley-Terry), read on the
   held-out pairs (pair accuracy);
4. PPO from the SFT model against the reward model (its value model from the reward
   model), at TRL's KL coefficient 0.05 and at 0.5, the rule's score only measured:
   greedy completions of held-out prompts over PPO's steps, their reward-model score,
   rule score and share of distinct words (a policy that collapses onto a few words
   repeats them), the KL to the SFT model, and the language model's held-out loss
   before and after.

    .venv/bin/python benchmarks/instructgpt_recipe.py run --runs=runs/instructgpt
    .venv/bin/python benchmarks/instructgpt_recipe.py table --runs=runs/instructgpt
    .venv/bin/python benchmarks/instructgpt_recipe.py run --smoke   # tiny: a check that it runs

One seed on this machine's CPU: a small run, read as such. ``--smoke``: every step at
tiny sizes (1-layer 32-wide models, 2 training steps, 16 prompts sampled), in this
process.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile

import _smoke
import preference_tuning as shared

ROOT = pathlib.Path(__file__).resolve().parents[1]
PRETRAIN = "configs/pretrain/gpt2_tiny.py"
PPO = "configs/rl/gpt2_tiny_ppo_arithmetic.py"
# The SFT and reward-model runs start from the arithmetic SFT config (the same GPT-2, a
# prompt-and-answer task's lengths) with the task and lengths changed.
SFT_BASE = "configs/finetune/gpt2_tiny_arithmetic_sft.py"
LENGTHS = ["--config.task_feature_lengths.inputs=24", "--config.task_feature_lengths.targets=8"]
SFT = ["--config.task=embedded_en_prefix_lm", *LENGTHS, "--config.data.prefix_attention=causal",
       "--config.num_train_steps=200", "--config.optimizer.learning_rate=3e-4",
       "--config.optimizer.warmup_steps=20", "--config.checkpoint.every_steps=200",
       "--config.evals.held_out.every_steps=0"]
REWARD_MODEL = ["--config.task=instructgpt_pairs", *LENGTHS,
                "--config.task_feature_lengths.targets=9",  # the response and its EOS
                "--config.preference.objective=reward_model", "--config.num_train_steps=300",
                "--config.optimizer.learning_rate=1e-4", "--config.optimizer.warmup_steps=20",
                "--config.checkpoint.every_steps=300", "--config.evals.held_out.every_steps=300",
                "--config.evals.held_out.batches=100", "--module=_instructgpt_rule"]
# The rule and the distinct-word share are measured (weight 0); the reward model is scored.
PPO_RUN = ["--config.task=embedded_en_prefix_lm", *LENGTHS,
           "--config.rl.rewards=('hidden_rule', 'distinct_words')",
           "--config.rl.reward_weights=(0.0, 0.0, 1.0)", "--config.rl.temperature=1.0",
           "--config.num_train_steps=400", "--config.optimizer.learning_rate=3e-5",
           # Read after the run, each kept step on the SFT model's prompts (rollout_eval).
           "--config.evals.held_out.every_steps=0", "--config.checkpoint.every_steps=100",
           "--config.checkpoint.keep=4", "--module=_instructgpt_rule"]
# PPO's KL coefficients: TRL's default, and ten times it.
KL_COEFS = (0.05, 0.5)
SMOKE = {"on": False, "prompts": 1536}
SMOKE_RUN = ["--config.num_train_steps=2", "--config.batch_size=8", "--config.logging.every_steps=1",
             "--config.checkpoint.every_steps=2"]


def train(config: str, workdir: pathlib.Path, *overrides: str) -> None:
    """``shared.train`` with ``--smoke``'s run sizes (an evaluation that is on, every 2
    steps on one batch)."""
    smoke = [*SMOKE_RUN, *(["--config.evals.held_out.every_steps=2",
                            "--config.evals.held_out.batches=1"]
                           if not any(o.endswith("held_out.every_steps=0") for o in overrides)
                           else [])]
    shared.train(config, workdir, *overrides, *(smoke if SMOKE["on"] else []))


def make_pairs(sft: pathlib.Path, path: pathlib.Path) -> dict:
    """Two samples of the SFT model for each training prompt, labelled by the rule, as
    JSONL preference rows at ``path``; what was sampled."""
    import jax
    import numpy as np
    from _instructgpt_rule import vowel_share

    from t5x_like import config_lib, resolving, structures
    from t5x_like.checkpoints import param_sources
    from t5x_like.data import get_task_or_mixture, pipeline
    from t5x_like.engine import trainer as trainer_lib
    from t5x_like.modes import rl
    config = shared.load(PPO)
    config_lib.apply_overrides(config, [o[len("--config."):] for o in PPO_RUN + LENGTHS
                                        if o.startswith("--config.")])
    config.rl.algorithm, config.rl.num_generations, config.init_from = "grpo", 2, str(sft)
    config.rl.reward_weights = ()  # the rule alone: no reward model yet
    config.batch_size = 8 if SMOKE["on"] else 64
    spec = resolving.resolve_spec(config)
    _, trainer = trainer_lib.build_on_devices(spec)
    structure = structures.for_config(spec)
    params = trainer.place_params(param_sources.base_params(str(sft), spec, trainer.mesh)[0])
    lengths = dict(spec.task_feature_lengths)
    rows = pipeline.build_dataset(spec.task, "train", lengths, seed=1, shuffle=True,
                                  repeat=False, feature_converter=structure.feature_converter(lengths))
    rollouts = rl.Rollouts(spec, trainer, structure, get_task_or_mixture(spec.task).vocabulary,
                           None)
    batches = pipeline.HostBatchIterator(rows, spec.batch_size // 2)
    written, ties = 0, 0
    with path.open("w") as out:
        for index, batch in enumerate(batches):
            if index * (spec.batch_size // 2) >= SMOKE["prompts"]:
                break
            repeated = {key: np.repeat(value, 2, axis=0) for key, value in batch.items()}
            _, _, completions = rollouts.sample(params, repeated, jax.random.key(index))
            texts = [rollouts._texts(c) for c in completions]
            prompts = [e["prompt"] for e in rollouts.examples(repeated)]
            for i in range(0, len(texts), 2):
                a, b = texts[i], texts[i + 1]
                if vowel_share(a) == vowel_share(b):
                    ties += 1
                    continue
                chosen, rejected = (a, b) if vowel_share(a) > vowel_share(b) else (b, a)
                out.write(json.dumps({"prompt": prompts[i], "chosen": chosen,
                                      "rejected": rejected}) + "\n")
                written += 1
    return {"pairs": written, "ties": ties}


def run(runs: pathlib.Path, results: dict) -> None:
    pairs = runs / "pairs.jsonl"
    os.environ["INSTRUCTGPT_PAIRS"] = str(pairs)  # before the rule module registers its task
    import _instructgpt_rule  # noqa: F401  (the hidden rule as a reward, the pairs task)
    pretrained, sft = runs / "pt_gpt2", runs / "sft"
    shared.train(PRETRAIN, pretrained, "--config.num_train_steps=500",
                 "--config.evals.held_out.every_steps=500", "--config.checkpoint.every_steps=500",
                 *(SMOKE_RUN if SMOKE["on"] else []))
    train(SFT_BASE, sft, f"--config.init_from={pretrained}", *SFT)
    if not pairs.exists():
        results["pairs"] = make_pairs(sft, pairs)
    reward_model = runs / "reward_model"
    train(SFT_BASE, reward_model, f"--config.init_from={sft}", *REWARD_MODEL)
    held_out = [r for r in shared.records(reward_model) if "eval_accuracy" in r][-1]
    results["reward_model"] = {"accuracy": held_out["eval_accuracy"],
                               "loss": held_out["eval_loss"]}
    overrides = tuple(o for o in PPO_RUN if o.startswith("--config.")) + (
        f"--config.rl.reward_model={reward_model}",)
    results["sft"] = shared.rollout_eval(PPO, sft, samples=1, overrides=overrides)
    results["lm_loss"] = {"sft": shared.lm_held_out_loss(sft)}
    results["ppo"] = {}
    for kl_coef in KL_COEFS:
        ppo = runs / f"ppo_kl{kl_coef}"
        train(PPO, ppo, f"--config.init_from={sft}", f"--config.rl.reward_model={reward_model}",
              f"--config.rl.kl_coef={kl_coef}", *PPO_RUN,
              *(["--config.rl.iterations=2"] if SMOKE["on"] else []))
        logged = shared.records(ppo)
        steps = sorted(int(p.name) for p in (ppo / "checkpoints").iterdir() if p.name.isdigit())
        results["ppo"][str(kl_coef)] = {
            "curve": [{"step": step, **{key: measured[key] for key in MEASURED}}
                      for step in steps
                      for measured in [shared.rollout_eval(
                          PPO, ppo / "checkpoints" / str(step), samples=1,
                          overrides=overrides)]],
            "kl": [(r["step"], r["kl"]) for r in logged if "kl" in r],
            "lm_loss": shared.lm_held_out_loss(ppo)}


# What the table reads of each evaluation (``rollout_eval``'s means per reward).
MEASURED = ("hidden_rule", "reward_model", "distinct_words")


def table(results: dict) -> None:
    pairs = results.get("pairs", {})
    print(f"pairs: {pairs.get('pairs')} labelled ({pairs.get('ties')} ties dropped); reward "
          f"model held-out pair accuracy {results['reward_model']['accuracy']:.3f}")
    print("| model | held-out rule score | reward-model score | distinct words | KL to SFT "
          "| LM held-out loss |")
    print("| --- | --- | --- | --- | --- | --- |")
    sft = results["sft"]
    print(f"| SFT | {sft['hidden_rule']:.3f} | {sft['reward_model']:.3f} | "
          f"{sft['distinct_words']:.3f} | 0 | {results['lm_loss']['sft']:.3f} |")
    for kl_coef, run in results["ppo"].items():
        kl = dict(run["kl"])
        for index, point in enumerate(run["curve"]):
            near = max((s for s in kl if s <= point["step"]), default=None)
            shown = f"{kl[near]:.3f}" if near is not None else "-"
            loss = f"{run['lm_loss']:.3f}" if index == len(run["curve"]) - 1 else ""
            print(f"| PPO kl_coef {kl_coef}, step {point['step']} | {point['hidden_rule']:.3f} "
                  f"| {point['reward_model']:.3f} | {point['distinct_words']:.3f} | {shown} "
                  f"| {loss} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("run", "table"))
    parser.add_argument("--runs", default="runs/instructgpt")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny runs, in this process: a check that the script runs")
    args = parser.parse_args(argv)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "benchmarks"), *filter(None, [os.environ.get("PYTHONPATH")])])
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    if not args.smoke:
        shared.SMOKE["prompts"] = 256  # the held-out prompts PPO's evaluations read (4 x 64)
        return run_or_table(args, pathlib.Path(args.runs))
    _smoke.IN_PROCESS = True
    _, model, _ = _smoke.PRETRAINED["pt_gpt2"]
    shared.SMOKE.update(model=model, lm_batches=1, prompts=8)
    SMOKE.update(on=True, prompts=16)
    args.command = "run"
    with tempfile.TemporaryDirectory(prefix="instructgpt_smoke_") as scratch:
        return run_or_table(args, pathlib.Path(args.runs if args.runs != "runs/instructgpt"
                                               else scratch))


def run_or_table(args, runs: pathlib.Path) -> int:
    return shared.run_and_table(args.command, runs, run, table)


if __name__ == "__main__":
    raise SystemExit(main())
