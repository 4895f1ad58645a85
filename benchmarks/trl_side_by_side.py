"""GRPO side by side with TRL (``docs/preference_tuning.md``, (f)): the same SFT model,
prompts, reward, group size, temperature, KL weight, learning rate, gradient clip, steps
and seeds, trained by our ``train`` on the original checkpoint and by TRL's own
``GRPOTrainer`` (CPU, transformers' ``generate``) on its ``convert export``.

Two rewards (``--reward``): the task's ``exact_answer`` (600 steps, read every 100) and
``leading_one`` (``_side_by_side_rewards.py``, one both learn: 100 steps, read every 10).
Both sides are read the same way: the greedy reward on the 500 held-out
``embedded_arithmetic`` prompts (ours: the run's held-out rollouts evaluator; TRL's:
``model.generate`` in a callback), and the sampled reward each run logs (the mean reward
of a step's completions; TRL averages it over its logging window of 10 steps, ours logs
every 10th step's).

    .venv/bin/python benchmarks/trl_side_by_side.py run --runs=runs/side_by_side
    .venv/bin/python benchmarks/trl_side_by_side.py run --runs=runs/side_by_side --reward=leading_one
    .venv/bin/python benchmarks/trl_side_by_side.py table --runs=runs/side_by_side
    .venv/bin/python benchmarks/trl_side_by_side.py run --smoke   # tiny: a check that it runs

``run`` trains what is missing: the SFT model (``preference_tuning.py``'s), its export,
then for each seed our GRPO run (``RUNS/ours_REWARD_seedS``) and TRL's
(``RUNS/trl_REWARD_seedS.json``, in a subprocess: torch and JAX keep to their own
process), and writes ``RUNS/results.json``; ``table`` prints mean ± half the range over
the seeds.

What is checked to be the same, what is set rather than left at a default, and where the
two differ:

- TRL's prompt is our prompt token for token: the start id (``<s>``, 3, which the
  export's tokenizer adds), the operands and the inputs' EOS (``</s>``), as text its
  tokenizer splits back into those ids;
  ``run`` checks every train and held-out prompt before it trains anything.
- ``use_bias_correction_kl=False`` in TRL (its default is True): the GRPO paper's k3
  term, which ours computes (the parity test's setting); ours clips the gradient's norm
  at 1, TRL's default (ours is off by default).
- Left padding: TRL left-pads prompts, and transformers' GPT-2 numbers a padded row's
  positions from the padding on, in ``generate`` and in TRL's log-probabilities alike
  (neither passes ``position_ids``), so its sampling and its updates agree; ours pads
  on the right of the prompt and numbers from the start id. A plain transformers load
  of the export reads the SFT model's greedy exact match as ours does (0.244); inside
  TRL's run 3 of the 500 answers differ (0.238; not traced).

``--smoke``: the same code path at tiny sizes (a 1-layer, 32-wide GPT-2 SFT'd for 2
steps, 2 GRPO steps of 8 prompts x 2 completions each side, 8 held-out prompts, one
seed), in a temporary ``--runs`` unless one is given (then in its ``side_by_side/``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import _side_by_side_rewards  # noqa: F401  (registers leading_one here too)
import _smoke
import preference_tuning as pt

ROOT = pathlib.Path(__file__).resolve().parents[1]
SFT_CONFIG = "configs/finetune/gpt2_tiny_arithmetic_sft.py"
RL_CONFIG = "configs/rl/gpt2_tiny_grpo_arithmetic.py"
# The GRPO recipe both sides run (RL_CONFIG's settings; TRL's clip is its default 1.0, ours
# is set to it), for each reward: ``exact_answer`` (the task's: out of reach, as measured)
# and ``leading_one`` (``_side_by_side_rewards.py``: one both learn, read every 10 steps).
# ``--smoke`` shrinks steps, prompts, generations and held-out prompts.
RECIPE = {"steps": 600, "every": 100, "prompts_per_step": 8, "generations": 8,
          "temperature": 0.7, "beta": 0.04, "learning_rate": 2e-5, "max_grad_norm": 1.0,
          "completion_tokens": 5, "held_out": 500}
REWARDS = {"exact_answer": {}, "leading_one": {"steps": 100, "every": 10}}
REWARD_MODULE = "benchmarks._side_by_side_rewards"
SMOKE_RECIPE = {"steps": 2, "every": 2, "prompts_per_step": 8, "generations": 2,
                "held_out": 8}


# -- prompts ------------------------------------------------------------------------------
def prompt_texts(split: str) -> list[dict]:
    """``embedded_arithmetic``'s ``split`` as TRL's dataset: the prompt as text whose
    tokens are ours (the export's tokenizer adds the start id, then the operands and
    the inputs' EOS) and the answer."""
    from t5x_like.builtin_tasks.preferences import arithmetic_examples
    return [{"prompt": f"{row['inputs']}</s>", "answer": row["targets"]}
            for row in arithmetic_examples()[split]]


def check_prompts(export: pathlib.Path, splits=("train", "validation")) -> int:
    """Every prompt of ``splits`` tokenized by the export's tokenizer equals what our
    rollouts sample from (``preference_tuning.sampler_prompts``); the number checked."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(export)
    lengths = dict(pt.load(RL_CONFIG).task_feature_lengths)
    checked = 0
    for split in splits:
        ours = pt.sampler_prompts("embedded_arithmetic", split, lengths)
        for tokens, text in zip(ours, prompt_texts(split), strict=True):
            theirs = tokenizer(text["prompt"])["input_ids"]
            if tokens != theirs:
                raise SystemExit(f"{split} prompt {text['prompt']!r}: TRL's tokens {theirs} "
                                 f"are not ours {tokens}")
            checked += 1
    return checked


# -- TRL's side (a subprocess: python trl_side_by_side.py _trl ...) ----------------------
def greedy_reward(model, tokenizer, rows: list[dict], completion_tokens: int,
                  reward) -> float:
    """The mean ``reward`` of greedy completions of ``rows``' prompts by ``model``
    (transformers' ``generate``, left-padded)."""
    import torch
    batch = tokenizer([r["prompt"] for r in rows], return_tensors="pt", padding=True,
                      padding_side="left")
    training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=completion_tokens, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
    model.train(training)
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    scores = reward(texts, rows)
    return sum(scores) / len(scores)


def reward_function(name: str):
    """Our reward ``name`` (``fn(completions, examples)``)."""
    from t5x_like.metrics import rewards
    return rewards.BUILTIN.get(name) or rewards.RewardRegistry.get(name)


def trl_run(export: str, out: str, seed: int, recipe: dict) -> None:
    """TRL's ``GRPOTrainer`` on ``export`` with ``recipe`` (its ``reward``); writes ``out``
    (the greedy curve, the logged history)."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(max(1, (os.cpu_count() or 2)))
    tokenizer = AutoTokenizer.from_pretrained(export)
    held_out = prompt_texts("validation")[:recipe["held_out"]]
    ours_reward, curve = reward_function(recipe["reward"]), []

    def reward(prompts, completions, answer, **_):
        return ours_reward(completions, [{"answer": a} for a in answer])
    reward.__name__ = recipe["reward"]

    class GreedyCurve(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **_):
            curve.append({"step": 0, "greedy": greedy_reward(
                model, tokenizer, held_out, recipe["completion_tokens"], ours_reward)})

        def on_step_end(self, args, state, control, model=None, **_):
            if state.global_step % recipe["every"] == 0:
                curve.append({"step": state.global_step, "greedy": greedy_reward(
                    model, tokenizer, held_out, recipe["completion_tokens"], ours_reward)})

    args = GRPOConfig(
        output_dir=str(pathlib.Path(out).with_suffix(".trainer")), use_cpu=True, seed=seed,
        per_device_train_batch_size=recipe["prompts_per_step"] * recipe["generations"],
        num_generations=recipe["generations"], max_completion_length=recipe["completion_tokens"],
        temperature=recipe["temperature"], beta=recipe["beta"], use_bias_correction_kl=False,
        learning_rate=recipe["learning_rate"], lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=recipe["max_grad_norm"], max_steps=recipe["steps"], logging_steps=10,
        save_strategy="no", report_to="none", dataloader_num_workers=0)
    trainer = GRPOTrainer(model=export, reward_funcs=reward, args=args,
                          train_dataset=Dataset.from_list(prompt_texts("train")),
                          processing_class=tokenizer, callbacks=[GreedyCurve()])
    trainer.train()
    pathlib.Path(out).write_text(json.dumps({"curve": curve,
                                             "log": trainer.state.log_history}, indent=1))


# -- the runs -----------------------------------------------------------------------------
def ours(runs: pathlib.Path, sft: pathlib.Path, seed: int, recipe: dict) -> dict:
    workdir = runs / f"ours_{recipe['reward']}_seed{seed}"
    pt.train(RL_CONFIG, workdir, f"--config.init_from={sft}", f"--config.seed={seed}",
             f"--module={REWARD_MODULE}", f"--config.rl.rewards=('{recipe['reward']}',)",
             f"--config.num_train_steps={recipe['steps']}",
             f"--config.batch_size={recipe['prompts_per_step'] * recipe['generations']}",
             f"--config.rl.num_generations={recipe['generations']}",
             f"--config.rl.temperature={recipe['temperature']}",
             f"--config.rl.beta={recipe['beta']}",
             f"--config.optimizer.learning_rate={recipe['learning_rate']}",
             f"--config.optimizer.grad_clip_norm={recipe['max_grad_norm']}",
             f"--config.evals.held_out.every_steps={recipe['every']}",
             f"--config.checkpoint.every_steps={recipe['steps']}",
             f"--config.logging.every_steps={min(10, recipe['every'])}")
    logged = pt.records(workdir)
    key = f"eval_{recipe['reward']}"
    return {"curve": [{"step": r["step"], "greedy": r[key]} for r in logged if key in r],
            "reward": [(r["step"], r["reward"]) for r in logged if "reward" in r]}


def trl(runs: pathlib.Path, export: pathlib.Path, seed: int, recipe: dict) -> dict:
    out = runs / f"trl_{recipe['reward']}_seed{seed}.json"
    if not out.exists():
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])}
        subprocess.run([sys.executable, __file__, "_trl", f"--export={export}",
                        f"--out={out}", f"--seed={seed}", f"--recipe={json.dumps(recipe)}"],
                       check=True, env=env, cwd=ROOT)
    done = json.loads(out.read_text())
    return {"curve": done["curve"],
            "reward": [(r["step"], r["reward"]) for r in done["log"] if "reward" in r]}


def run(runs: pathlib.Path, results: dict, seeds: list[int], recipe: dict) -> None:
    sft = runs / "sft_arith"
    pt.train(SFT_CONFIG, sft)
    export = pt.export(sft, runs / "sft_arith_hf")
    print(f"  prompts: TRL's tokens equal ours on {check_prompts(export)} prompts")
    pt.SMOKE["prompts"] = recipe["held_out"]
    reward = recipe["reward"]
    sft_eval = pt.rollout_eval(RL_CONFIG, sft, samples=1, overrides=(
        f"--config.rl.rewards=('{reward}',)",))
    done = results.setdefault(reward, {})
    done["recipe"], done["sft"] = recipe, sft_eval[reward]
    for seed in seeds:
        mine = ours(runs, sft, seed, recipe)
        mine["curve"].insert(0, {"step": 0, "greedy": sft_eval[reward]})
        done.setdefault("ours", {})[str(seed)] = mine
        done.setdefault("trl", {})[str(seed)] = trl(runs, export, seed, recipe)


# -- the table ----------------------------------------------------------------------------
def _at(points, step: int, window: int = 0):
    """The value logged at ``step`` (``window`` > 0: the mean over (step - window, step])."""
    found = [v for s, v in points if (step - window < s <= step if window else s == step)]
    return sum(found) / len(found) if found else None


def table(results: dict) -> None:
    if not results:
        print("no results yet: run `trl_side_by_side.py run` first")
    for reward, done in results.items():
        recipe, names = done["recipe"], {"ours": "ours", "trl": "TRL"}
        sides = [side for side in names if side in done]
        print(f"GRPO on embedded_arithmetic with the {reward} reward, from the SFT model "
              f"(greedy {reward} {done['sft']:.3f} on {recipe['held_out']} held-out prompts): "
              f"{recipe['prompts_per_step']} prompts x {recipe['generations']} completions a "
              f"step, temperature {recipe['temperature']}, beta {recipe['beta']}, learning "
              f"rate {recipe['learning_rate']}; mean ± half the range over seeds "
              + ", ".join(f"{names[s]} {sorted(done[s])}" for s in sides))
        print()
        print("| step | " + " | ".join(f"{names[s]}: greedy {reward}" for s in sides) + " | "
              + " | ".join(f"{names[s]}: sampled reward" for s in sides) + " |")
        print("| --- " * (1 + 2 * len(sides)) + "|")
        steps = sorted({p["step"] for s in sides for seed in done[s].values()
                        for p in seed["curve"]})
        window = min(10, recipe["every"])
        for step in steps:
            greedy = [pt.spread([p["greedy"] for seed in done[s].values()
                               for p in seed["curve"] if p["step"] == step]) for s in sides]
            sampled = []
            for s in sides:
                values = [_at(seed["reward"], step, window) for seed in done[s].values()]
                sampled.append(pt.spread([v for v in values if v is not None]))
            print(f"| {step} | " + " | ".join(greedy) + " | " + " | ".join(sampled) + " |")
        print()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("run", "table", "_trl"))
    parser.add_argument("--runs", default="runs/side_by_side")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--reward", choices=tuple(REWARDS), default="exact_answer")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny runs: a check that the script runs")
    # The subprocess's arguments (_trl).
    parser.add_argument("--export")
    parser.add_argument("--out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recipe")
    args = parser.parse_args(argv)
    if args.command == "_trl":
        trl_run(args.export, args.out, args.seed, json.loads(args.recipe))
        return 0
    recipe = {**RECIPE, **REWARDS[args.reward], "reward": args.reward}
    seeds = [int(s) for s in args.seeds.split(",")]

    def selected(runs, results):
        run(runs, results, seeds, recipe)
    if not args.smoke:
        return pt.run_and_table(args.command, pathlib.Path(args.runs), selected, table)
    _smoke.IN_PROCESS = True
    _, model, _ = _smoke.PRETRAINED["pt_gpt2"]
    pt.SMOKE.update(model=model, run=_smoke.TINY_RUN)
    recipe.update(SMOKE_RECIPE)
    seeds = seeds[:1]
    with tempfile.TemporaryDirectory(prefix="side_by_side_smoke_") as scratch:
        # A given --runs is shared with other smoke runs: this script's results.json
        # keeps to a folder of its own there.
        runs = (pathlib.Path(args.runs) / "side_by_side" if args.runs != "runs/side_by_side"
                else pathlib.Path(scratch))
        return pt.run_and_table("run", runs, selected, table)


if __name__ == "__main__":
    raise SystemExit(main())
