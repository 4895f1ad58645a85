"""PPO side by side with TRL on the InstructGPT recipe (``docs/preference_tuning.md``):
the recipe's SFT model and reward model (``instructgpt_recipe.py``, run first), PPO at
``kl_coef`` 0.5 by our ``train`` and by TRL 1.12's own ``PPOTrainer`` (the last TRL with
PPO, ``.venv/trl-ppo``; CPU, transformers' ``generate``) on their ``convert export``s:
the policy and the reference from the SFT model, the reward model and the value model's
start from the reward model (exported as ``GPT2ForSequenceClassification``), the same
prompts, rollout size (64), epochs (4), response length, temperature, KL coefficient and
estimator, GAE, clips, learning rate (constant, AdamW, no gradient clipping, as TRL's
PPO loop has none), 100 rollouts, and seeds.

Both are read the same way every 25 rollouts (our 100 steps): greedy completions of the
recipe's 256 held-out prompts, their hidden-rule score, reward-model score and share of
distinct words (ours by ``preference_tuning.rollout_eval`` on the step's checkpoint;
TRL's in a callback, its reward model the exported one, which scores as ours does,
``tests/test_ppo.py``), and the KL to the SFT model each run logs (summed over a
completion; TRL's ``objective/kl``, ours ``kl``: equal definitions, ``tests/test_ppo_parity.py``).
The held-out prompts are 24 tokens each, so no row is padded on either side.

    .venv/bin/python benchmarks/instructgpt_recipe.py run --runs=runs/instructgpt
    .venv/bin/python benchmarks/instructgpt_side_by_side.py run --runs=runs/instructgpt
    .venv/bin/python benchmarks/instructgpt_side_by_side.py table --runs=runs/instructgpt
    .venv/bin/python benchmarks/instructgpt_side_by_side.py run --smoke  # tiny: it runs

``run`` trains what is missing (our seeds beside the recipe's seed-0 run ``ppo_kl0.5``:
``ppo_kl0.5_seedS``; TRL's ``trl_ppo_kl0.5_seedS.json``) and writes
``RUNS/side_by_side.json``; ``table`` prints mean ± half the range over the seeds.
``--smoke``: the recipe's own smoke run (tiny models, 2 PPO steps), then TRL's PPO for
2 rollouts of 8 prompts and 2 epochs, one seed, 8 held-out prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import instructgpt_recipe as recipe
import preference_tuning as shared

ROOT = pathlib.Path(__file__).resolve().parents[1]
ORACLE = ROOT / ".venv" / "trl-ppo"  # oracle-requirements.txt: TRL 1.12.0
KL_COEF = 0.5
SETTINGS = {"rollouts": 100, "every": 25, "prompts_per_rollout": 64, "epochs": 4,
            "response_length": 8, "temperature": 1.0, "learning_rate": 3e-5,
            "kl_coef": KL_COEF, "held_out": 256}
PAD_FOR_TRL = "<extra_id_99>"
SMOKE_SETTINGS = {"rollouts": 2, "every": 1, "prompts_per_rollout": 8, "epochs": 2,
                  "held_out": 8}


# -- prompts ------------------------------------------------------------------------------
def prompt_ids(split: str, count: int | None = None) -> list[list[int]]:
    """The recipe's prompts of ``split`` as our rollouts sample them (the first ``count``;
    None: all)."""
    from _instructgpt_rule import PROMPTS_TASK

    import t5x_like.builtin_tasks  # noqa: F401  (the recipe's prompts task)
    return shared.sampler_prompts(PROMPTS_TASK, split, {"inputs": 24, "targets": 8}, count)


# -- TRL's side (a subprocess, TRL 1.12 first on its path) --------------------------------
def trl_run(policy_dir: str, reward_dir: str, out: str, seed: int, settings: dict) -> None:
    import torch
    import transformers
    from _instructgpt_rule import distinct_words, hidden_rule
    from datasets import Dataset
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    torch.set_num_threads(max(1, os.cpu_count() or 2))
    load = transformers.AutoModelForCausalLM.from_pretrained
    classifier = transformers.AutoModelForSequenceClassification.from_pretrained
    policy, reference = load(policy_dir), load(policy_dir)
    reward_model, value_model = classifier(reward_dir), classifier(reward_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(policy_dir)
    # TRL masks every pad id it sees (a query's too). Runs before issue 63 started each
    # prompt with 0, the pad id (new ones with <s>); TRL's padding takes a token no
    # prompt holds either way.
    tokenizer.pad_token = PAD_FOR_TRL
    held_out = torch.tensor(prompt_ids("validation", settings["held_out"]))
    width = settings["response_length"]
    curve = []

    def measure(rollouts: int) -> None:
        policy.eval()
        with torch.no_grad():
            out = policy.generate(input_ids=held_out, attention_mask=torch.ones_like(held_out),
                                  max_new_tokens=width, do_sample=False, eos_token_id=1,
                                  pad_token_id=0)[:, held_out.shape[1]:]
            responses = []
            for row in out.tolist():
                responses.append(row[:row.index(1) + 1] if 1 in row else row)
            texts = [tokenizer.decode([t for t in r if t != 1], skip_special_tokens=True)
                     for r in responses]
            rows = torch.zeros((len(responses), held_out.shape[1] + width), dtype=torch.long)
            for i, response in enumerate(responses):
                rows[i, :held_out.shape[1]] = held_out[i]
                rows[i, held_out.shape[1]:held_out.shape[1] + len(response)] = torch.tensor(response)
            mask = torch.zeros_like(rows)
            for i, response in enumerate(responses):
                mask[i, :held_out.shape[1] + len(response)] = 1
            scores = reward_model(input_ids=rows, attention_mask=mask).logits[:, 0]
        policy.train()
        mean = lambda values: float(sum(values) / len(values))  # noqa: E731
        curve.append({"rollouts": rollouts, "hidden_rule": mean(hidden_rule(texts, None)),
                      "reward_model": float(scores.mean()),
                      "distinct_words": mean(distinct_words(texts, None))})

    class Every(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **_):
            if state.global_step % settings["every"] == 0:
                measure(state.global_step)

    rows = settings["prompts_per_rollout"]
    args = PPOConfig(
        output_dir=str(pathlib.Path(out).with_suffix(".trainer")), report_to=[], use_cpu=True,
        bf16=False, seed=seed, per_device_train_batch_size=rows, gradient_accumulation_steps=1,
        num_mini_batches=1, num_ppo_epochs=settings["epochs"],
        total_episodes=rows * settings["rollouts"], local_rollout_forward_batch_size=rows,
        response_length=width, stop_token="eos", temperature=settings["temperature"],
        kl_coef=settings["kl_coef"], learning_rate=settings["learning_rate"],
        lr_scheduler_type="constant", num_sample_generations=0, save_strategy="no",
        logging_steps=1)
    trainer = PPOTrainer(args=args, processing_class=tokenizer, model=policy,
                         ref_model=reference, reward_model=reward_model, value_model=value_model,
                         train_dataset=Dataset.from_dict({"input_ids": prompt_ids("train")}),
                         callbacks=[Every()])
    measure(0)
    trainer.train()
    kl = [(entry["episode"] // rows, entry["objective/kl"]) for entry in trainer.state.log_history
          if "objective/kl" in entry]
    pathlib.Path(out).write_text(json.dumps({"curve": curve, "kl": kl}))


# -- the runs -----------------------------------------------------------------------------
def ours(runs: pathlib.Path, seed: int, settings: dict, smoke: bool) -> dict:
    """Our PPO at ``KL_COEF`` from the recipe's SFT model: the recipe's run for seed 0."""
    name = f"ppo_kl{KL_COEF}" + (f"_seed{seed}" if seed else "")
    workdir, reward_model = runs / name, runs / "reward_model"
    recipe.train(recipe.PPO, workdir, f"--config.init_from={runs / 'sft'}",
                 f"--config.rl.reward_model={reward_model}", f"--config.rl.kl_coef={KL_COEF}",
                 f"--config.seed={seed}", *recipe.PPO_RUN,
                 *(["--config.rl.iterations=2"] if smoke else []))
    overrides = tuple(o for o in recipe.PPO_RUN if o.startswith("--config.")) + (
        f"--config.rl.reward_model={reward_model}",)
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    per_rollout = 2 if smoke else settings["epochs"]
    curve = []
    for step in steps:
        measured = shared.rollout_eval(recipe.PPO, workdir / "checkpoints" / str(step),
                                       samples=1, overrides=overrides)
        curve.append({"rollouts": step // per_rollout,
                      **{key: measured[key] for key in recipe.MEASURED}})
    return {"curve": curve, "kl": [(r["step"] // per_rollout, r["kl"])
                                   for r in shared.records(workdir) if "kl" in r]}


def trl(runs: pathlib.Path, seed: int, settings: dict) -> dict:
    out = runs / f"trl_ppo_kl{KL_COEF}_seed{seed}.json"
    if not out.exists():
        policy = shared.export(runs / "sft", runs / "sft_hf")
        reward = shared.export(runs / "reward_model", runs / "reward_model_hf")
        env = {key: value for key, value in os.environ.items() if key != "INSTRUCTGPT_PAIRS"}
        env.update(TRL_EXPERIMENTAL_SILENCE="1", PYTHONPATH=os.pathsep.join(
            [str(ORACLE), str(ROOT / "benchmarks"), str(ROOT)]))
        subprocess.run([sys.executable, __file__, "_trl", f"--policy={policy}",
                        f"--reward={reward}", f"--out={out}", f"--seed={seed}",
                        f"--settings={json.dumps(settings)}"], check=True, env=env, cwd=ROOT)
    return json.loads(out.read_text())


def run(runs: pathlib.Path, seeds: list[int], settings: dict, smoke: bool) -> dict:
    os.environ["INSTRUCTGPT_PAIRS"] = str(runs / "pairs.jsonl")  # as the recipe's run sets it
    import t5x_like.builtin_tasks  # noqa: F401, I001  (the prompts task the rule module reads)
    import _instructgpt_rule  # noqa: F401  (the rule and distinct words, read as rewards)
    path = runs / "side_by_side.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    recipe_results = json.loads((runs / "results.json").read_text())
    results["settings"], results["sft"] = settings, {
        key: recipe_results["sft"][key] for key in recipe.MEASURED}
    for seed in seeds:
        results.setdefault("ours", {})[str(seed)] = ours(runs, seed, settings, smoke)
        results.setdefault("trl", {})[str(seed)] = trl(runs, seed, settings)
    path.write_text(json.dumps(results, indent=1))
    return results


# -- the table ----------------------------------------------------------------------------
def table(results: dict) -> None:
    settings, names = results["settings"], {"ours": "ours", "trl": "TRL"}
    print(f"PPO against the recipe's reward model at kl_coef {settings['kl_coef']}: "
          f"{settings['prompts_per_rollout']} prompts a rollout, {settings['epochs']} epochs, "
          f"learning rate {settings['learning_rate']}; greedy completions of "
          f"{settings['held_out']} held-out prompts; mean ± half the range over seeds "
          + ", ".join(f"{names[s]} {sorted(results[s])}" for s in names))
    print()
    print("| rollouts | " + " | ".join(f"{names[s]}: {m}" for m in
                                       ("rule score", "reward-model score", "distinct words",
                                        "KL to SFT") for s in names) + " |")
    print("| --- " * 9 + "|")
    sft = results["sft"]
    points = sorted({p["rollouts"] for s in names for seed in results[s].values()
                     for p in seed["curve"]} | {0})
    for rollouts in points:
        cells = []
        for key in ("hidden_rule", "reward_model", "distinct_words"):
            for s in names:
                values = ([sft[key]] if rollouts == 0 and s == "ours" else
                          [p[key] for seed in results[s].values() for p in seed["curve"]
                           if p["rollouts"] == rollouts])
                cells.append(shared.spread(values))
        for s in names:  # the KL logged on the last rollout before this point
            values = []
            for seed in results[s].values():
                logged = [kl for at, kl in seed["kl"] if at <= rollouts]
                values.append(logged[-1] if logged and rollouts else None)
            cells.append(shared.spread(values))
        print(f"| {rollouts} | " + " | ".join(cells) + " |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("run", "table", "_trl"))
    parser.add_argument("--runs", default="runs/instructgpt")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny runs: a check that the script runs")
    for name in ("policy", "reward", "out", "settings"):  # the subprocess's (_trl)
        parser.add_argument(f"--{name}")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "_trl":
        trl_run(args.policy, args.reward, args.out, args.seed, json.loads(args.settings))
        return 0
    seeds, settings = [int(s) for s in args.seeds.split(",")], dict(SETTINGS)
    # Our runs load the rule with --module=_instructgpt_rule, as the recipe's do.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "benchmarks"), *filter(None, [os.environ.get("PYTHONPATH")])])
    if args.command == "table":
        table(json.loads((pathlib.Path(args.runs) / "side_by_side.json").read_text()))
        return 0
    if not args.smoke:
        shared.SMOKE["prompts"] = settings["held_out"]
        table(run(pathlib.Path(args.runs).resolve(), seeds, settings, smoke=False))
        return 0
    settings.update(SMOKE_SETTINGS)
    with tempfile.TemporaryDirectory(prefix="instructgpt_side_by_side_smoke_") as scratch:
        runs = (pathlib.Path(args.runs) / "instructgpt" if args.runs != "runs/instructgpt"
                else pathlib.Path(scratch))
        recipe.main(["run", "--smoke", f"--runs={runs}"])  # the recipe's tiny runs
        table(run(runs.resolve(), seeds[:1], settings, smoke=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
