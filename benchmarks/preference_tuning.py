"""Learning from preferences and rewards at our scale (``docs/preference_tuning.md``):

(a) DPO on the embedded cloze pairs from the small GPT-2's pretraining run: held-out
    pair accuracy before and after (by the policy's own likelihood, and by DPO's
    implicit reward), the cloze task's own 4-way accuracy, and the LM's held-out loss
    on the embedded corpus (what DPO does to the model's language modelling);
(b) GRPO on ``embedded_arithmetic`` from an SFT'd model: greedy exact match on the 500
    held-out prompts over training, against the SFT model and against best-of-8
    sampling from it;
(c) tokens per second of DPO's updates, GRPO's rollouts and GRPO's updates;
(d) PPO on the same task from the same SFT model (the same exact-answer reward, its value
    model from the SFT model's trunk): greedy exact match over training, beside GRPO's.

    .venv/bin/python benchmarks/preference_tuning.py run --runs=runs/preference
    .venv/bin/python benchmarks/preference_tuning.py table --runs=runs/preference
    .venv/bin/python benchmarks/preference_tuning.py run --smoke   # tiny: a check that it runs

``run`` trains what is missing (pretraining 500 steps, DPO, SFT, GRPO, PPO with the configs
in ``configs/``) and writes ``RUNS/results.json``; ``table`` prints it. Numbers are
from one seed on this machine's CPU (8 fake devices): a small run, read as such.

``--smoke``: every run and measurement at tiny sizes, in this process, as a check that the
script runs: 1-layer, 32-wide GPT-2s, 2 training steps of each run (8 rows; GRPO 8
prompts x 2 completions), the first 3 batches of held-out pairs (24: 8 cloze points) and 1
of held-out LM rows, 8 held-out prompts, in a temporary ``--runs`` unless one is given (a
``pt_gpt2`` there is read as the pretrained model). DPO and SFT train without their
held-out evaluations (the table reads this script's own measurements; each is another
compile); GRPO keeps its, the table's curve.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import tempfile

import _smoke

ROOT = pathlib.Path(__file__).resolve().parents[1]
# What --smoke changes: the model (every run and every config read here), each run's
# length, the held-out batches of pairs (None: all) and of LM rows DPO is read on, and the
# held-out prompts GRPO is read on. Set by main.
SMOKE = {"model": [], "run": [], "pair_batches": None, "lm_batches": 8, "prompts": 500}
SMOKE_RUNS = {  # config -> its --smoke sizes
    "configs/pretrain/gpt2_tiny.py": _smoke.PRETRAINED["pt_gpt2"][2],
    "configs/preference/gpt2_tiny_dpo_cloze.py": ["--config.evals.held_out.every_steps=0"],
    "configs/finetune/gpt2_tiny_arithmetic_sft.py": ["--config.evals.held_out.every_steps=0"],
    "configs/rl/gpt2_tiny_grpo_arithmetic.py": [
        "--config.batch_size=16", "--config.rl.num_generations=2",
        "--config.evals.held_out.every_steps=2", "--config.evals.held_out.batches=1",
        "--config.logging.every_steps=1", "--config.checkpoint.every_steps=2"],
    "configs/rl/gpt2_tiny_ppo_arithmetic.py": [
        "--config.batch_size=8", "--config.rl.iterations=2",
        "--config.evals.held_out.every_steps=2", "--config.evals.held_out.batches=1",
        "--config.logging.every_steps=1", "--config.checkpoint.every_steps=2"],
}


def load(config_path: str):
    """A config file, with ``--smoke``'s model when set."""
    from t5x_like import config_lib
    config = config_lib.load_config_file(config_path)
    config_lib.apply_overrides(config, [o[len("--config."):] for o in SMOKE["model"]])
    return config


def train(config: str, workdir: pathlib.Path, *overrides: str) -> None:
    if (workdir / "checkpoints").is_dir() and any((workdir / "checkpoints").iterdir()):
        done = json.loads((workdir / "metrics.jsonl").read_text().splitlines()[-1])
        print(f"  {workdir.name}: trained to step {done['step']} already")
        return
    smoke = [*SMOKE["run"], *SMOKE_RUNS.get(config, [])] if SMOKE["run"] else []
    _smoke.cli("t5x_like.train", [f"--config={config}", f"--workdir={workdir}", *overrides,
                                  *SMOKE["model"], *smoke], cwd=ROOT)


def records(workdir: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").open()]


# -- (a) DPO ----------------------------------------------------------------------------------

def pair_scores(spec, params_path: str, reference_path: str, split: str = "validation"):
    """Per held-out pair: the policy's summed log-likelihood of both responses, and DPO's
    implicit reward margin against the reference (``(chosen logp, rejected logp,
    margin)`` arrays, with each pair's cloze point)."""
    import jax
    import numpy as np

    from t5x_like import structures
    from t5x_like.checkpoints import param_sources
    from t5x_like.data import pipeline
    from t5x_like.engine import partitioning
    from t5x_like.engine import trainer as trainer_lib
    from t5x_like.modes.preference import load_reference, reference_source
    _, trainer = trainer_lib.build_on_devices(spec)
    structure = structures.for_config(spec)
    policy = trainer.place_params(param_sources.base_params(params_path, spec, trainer.mesh)[0])
    referenced = spec.replace(init_from=reference_path)
    _, ref_host = load_reference(referenced, reference_source(referenced), trainer.mesh)
    reference = trainer.place_params(ref_host)

    @jax.jit
    def logps(params, batch):
        return (structure.side_log_probs(structure.model, params, batch, "chosen")[0],
                structure.side_log_probs(structure.model, params, batch, "rejected")[0])
    lengths = dict(spec.task_feature_lengths)
    rows = pipeline.build_dataset(spec.task, split, lengths, seed=0, shuffle=False, repeat=False,
                                  feature_converter=structure.feature_converter(lengths))
    batches = pipeline.HostBatchIterator(rows, spec.batch_size, padding={
        k: np.zeros_like(v) for k, v in next(iter(rows)).items()})
    out = {"chosen": [], "rejected": [], "ref_chosen": [], "ref_rejected": [], "real": []}
    with trainer._context():
        for index, local in enumerate(batches):
            if index == SMOKE["pair_batches"]:
                break
            batch = partitioning.global_batch(local, trainer.mesh, trainer.rules)
            for name, params in (("", policy), ("ref_", reference)):
                chosen, rejected = jax.device_get(logps(params, batch))
                out[f"{name}chosen"].append(chosen)
                out[f"{name}rejected"].append(rejected)
            out["real"].append(local["chosen_response"].sum(-1) > 0)
    return {key: np.concatenate(values) for key, values in out.items()}


def dpo_metrics(scores, beta: float) -> dict:
    import numpy as np
    real = scores["real"]
    chosen, rejected = scores["chosen"][real], scores["rejected"][real]
    margin = beta * ((chosen - scores["ref_chosen"][real])
                     - (rejected - scores["ref_rejected"][real]))
    # three pairs per cloze point, in order: right when the answer beats all three
    cloze = (chosen > rejected).reshape(-1, 3).all(axis=1)
    return {"pairs": int(real.sum()), "likelihood_pair_accuracy": float(np.mean(chosen > rejected)),
            "implicit_reward_accuracy": float(np.mean(margin > 0)),
            "cloze_accuracy": float(cloze.mean())}


def lm_held_out_loss(checkpoint: pathlib.Path, batches: int | None = None) -> float:
    """The checkpoint's loss per token on ``embedded_en_lm``'s validation rows (the first
    ``batches`` batches, 8 unless --smoke), read as the plain decoder it is."""
    import jax
    import numpy as np

    from t5x_like import resolving as resolving
    from t5x_like import structures
    from t5x_like.checkpoints import param_sources
    from t5x_like.data import pipeline
    from t5x_like.engine import partitioning
    from t5x_like.engine import trainer as trainer_lib
    batches = batches or SMOKE["lm_batches"]
    spec = resolving.resolve_spec(load("configs/pretrain/gpt2_tiny.py"))
    _, trainer = trainer_lib.build_on_devices(spec)
    params = trainer.place_params(param_sources.base_params(str(checkpoint), spec,
                                                            trainer.mesh)[0])
    structure = structures.for_config(spec)
    lengths = dict(spec.task_feature_lengths)
    rows = pipeline.build_dataset(spec.task, "validation", lengths, seed=0, shuffle=False,
                                  repeat=False, feature_converter=structure.feature_converter(lengths))
    host = pipeline.HostBatchIterator(rows, spec.batch_size, padding={
        k: np.zeros_like(v) for k, v in next(iter(rows)).items()})
    loss, tokens = 0.0, 0.0
    for _, local in zip(range(batches), host, strict=False):
        out = jax.device_get(trainer.eval_step(params, partitioning.global_batch(
            local, trainer.mesh, trainer.rules)))
        loss += float(out["loss_sum"])
        tokens += float(out["num_target_tokens"])
    return loss / max(tokens, 1.0)


def run_dpo(runs: pathlib.Path, results: dict) -> None:
    from t5x_like import resolving as resolving
    pretrained = runs / "pt_gpt2"
    train("configs/pretrain/gpt2_tiny.py", pretrained, "--config.num_train_steps=500",
          "--config.evals.held_out.every_steps=500", "--config.checkpoint.every_steps=500")
    dpo = runs / "dpo_gpt2"
    train("configs/preference/gpt2_tiny_dpo_cloze.py", dpo, f"--config.init_from={pretrained}")
    config = load("configs/preference/gpt2_tiny_dpo_cloze.py")
    config.init_from = str(pretrained)
    spec = resolving.resolve_spec(config)
    before = dpo_metrics(pair_scores(spec, str(pretrained), str(pretrained)), spec.preference.beta)
    after = dpo_metrics(pair_scores(spec, str(dpo), str(pretrained)), spec.preference.beta)
    logged = records(dpo)
    before["lm_held_out_loss"] = lm_held_out_loss(pretrained)
    after["lm_held_out_loss"] = lm_held_out_loss(dpo)
    results["dpo"] = {"before": before, "after": after,
                      "train_tokens_per_sec": _median([r["tokens_per_sec"] for r in logged[1:]]),
                      "final": {k: logged[-1][k] for k in logged[-1]
                                if k.startswith(("eval_", "rewards_", "loss", "accuracy"))}}


# -- (b) GRPO ---------------------------------------------------------------------------------

def rollout_eval(spec_config: str, checkpoint: pathlib.Path, samples: int,
                 overrides: tuple[str, ...] = ()) -> dict:
    """Greedy mean rewards (and best-of-``samples``) of ``checkpoint`` on the held-out
    prompts, with ``spec_config``'s rewards (``overrides``: ``--config.`` flags on it)."""
    import numpy as np

    from t5x_like import config_lib, structures
    from t5x_like import resolving as resolving
    from t5x_like.checkpoints import param_sources
    from t5x_like.data import get_task_or_mixture, pipeline
    from t5x_like.engine import trainer as trainer_lib
    from t5x_like.modes import rl
    config = load(spec_config)
    config_lib.apply_overrides(config, [o[len("--config."):] for o in overrides])
    config.init_from = str(checkpoint)
    # Sampled and scored as GRPO's policy is: a plain decoder's params (a PPO run's policy
    # is one, its value model is not read to sample).
    config.rl.algorithm = "grpo"
    spec = resolving.resolve_spec(config)
    _, trainer = trainer_lib.build_on_devices(spec)
    structure = structures.for_config(spec)
    params = trainer.place_params(param_sources.base_params(str(checkpoint), spec,
                                                            trainer.mesh)[0])
    lengths = dict(spec.task_feature_lengths)
    rows = pipeline.build_dataset(spec.task, "validation", lengths, seed=0, shuffle=False,
                                  repeat=False, feature_converter=structure.feature_converter(lengths))
    padding = {k: np.zeros_like(v) for k, v in next(iter(rows)).items()}
    batches = pipeline.HostBatchIterator(rows, spec.batch_size, padding=padding)
    rollouts = rl.Rollouts(spec, trainer, structure, get_task_or_mixture(spec.task).vocabulary,
                           None)

    def filled():
        yield from batches
        while True:
            yield batches.padding_batch()
    count = -(-SMOKE["prompts"] // spec.batch_size)
    return rollouts.evaluate(params, filled(), count, samples=samples)


def run_grpo(runs: pathlib.Path, results: dict) -> None:
    sft = runs / "sft_arith"
    train("configs/finetune/gpt2_tiny_arithmetic_sft.py", sft)
    grpo = runs / "grpo_arith"
    train("configs/rl/gpt2_tiny_grpo_arithmetic.py", grpo, f"--config.init_from={sft}")
    rl_config = "configs/rl/gpt2_tiny_grpo_arithmetic.py"
    sft_eval = rollout_eval(rl_config, sft, samples=8)
    logged = records(grpo)
    curve = [{"step": r["step"], "exact_match": r["eval_exact_answer"],
              "train_reward": r["reward"]} for r in logged if "eval_exact_answer" in r]
    final = rollout_eval(rl_config, grpo, samples=1)
    update_tokens, rollout_tokens = [], []
    width = 1 + 8 + 5
    for r in logged[1:]:
        step_s = 1.0 / r["steps_per_sec"]
        update_s = max(step_s - r["rollout_seconds"], 1e-9)
        update_tokens.append(64 * width / update_s)
        rollout_tokens.append(r["rollout_tokens_per_sec"])
    results["grpo"] = {"sft": sft_eval, "curve": curve, "final": final,
                       "rollout_completion_tokens_per_sec": _median(rollout_tokens),
                       "update_tokens_per_sec": _median(update_tokens),
                       "train_reward": [(r["step"], r["reward"]) for r in logged]}


def run_ppo(runs: pathlib.Path, results: dict) -> None:
    """PPO from GRPO's SFT model, read as GRPO is (``rollout_eval``, the logged curve)."""
    sft = runs / "sft_arith"
    train("configs/finetune/gpt2_tiny_arithmetic_sft.py", sft)
    ppo = runs / "ppo_arith"
    config = "configs/rl/gpt2_tiny_ppo_arithmetic.py"
    train(config, ppo, f"--config.init_from={sft}")
    logged = records(ppo)
    curve = [{"step": r["step"], "exact_match": r["eval_exact_answer"]}
             for r in logged if "eval_exact_answer" in r]
    sampled = [r for r in logged if "reward" in r]
    results["ppo"] = {"sft": rollout_eval(config, sft, samples=1), "curve": curve,
                      "final": rollout_eval(config, ppo, samples=1),
                      "train_reward": [(r["step"], r["reward"]) for r in sampled],
                      "kl": [(r["step"], r["kl"]) for r in sampled]}


def spread(values) -> str:
    """``mean ± half the range`` of ``values`` (None left out; ``-`` when none are left),
    the side-by-side tables' cell over seeds."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    mean = sum(values) / len(values)
    return (f"{mean:.3f} ± {(max(values) - min(values)) / 2:.3f}" if len(values) > 1
            else f"{mean:.3f}")


def export(checkpoint: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """``python -m t5x_like.convert export`` of ``checkpoint`` to ``out``, unless ``out``
    holds an export already."""
    if not (out / "config.json").exists():
        _smoke.cli("t5x_like.convert", ["export", f"--checkpoint={checkpoint}", f"--out={out}"],
                   cwd=ROOT)
    return out


def sampler_prompts(task: str, split: str, lengths: dict,
                    count: int | None = None) -> list[list[int]]:
    """``split``'s prompts of ``task`` (the first ``count``; None: all) as our rollouts
    sample them: the decoder rows' prompts (``prompts_from_batch``: the start id a new
    run takes from the task's vocabulary, and the inputs) cut to the ``1 + inputs``
    positions ``Rollouts.sample`` keeps."""
    import numpy as np

    from t5x_like.data import feature_converters, get_task_or_mixture, pipeline
    from t5x_like.structures.decoder import prompts_from_batch, vocabulary_start_id
    start = vocabulary_start_id(get_task_or_mixture(task).vocabulary)
    converter = feature_converters.DecoderFeatureConverter(prefix_lm=True,
                                                           bidirectional_prefix=False,
                                                           start_id=start)
    rows = pipeline.build_dataset(task, split, lengths, seed=0, shuffle=False, repeat=False,
                                  feature_converter=converter)
    rows = list(rows if count is None else itertools.islice(rows, count))
    tokens, kept = (np.asarray(x) for x in prompts_from_batch(
        {key: np.stack([row[key] for row in rows]) for key in rows[0]}))
    width = 1 + int(lengths["inputs"])
    return [[int(t) for t in row[:min(int(n), width)]] for row, n in zip(tokens, kept, strict=True)]


def _median(values):
    import statistics
    return statistics.median(values) if values else float("nan")


def table(results: dict) -> None:
    dpo, grpo, ppo = results.get("dpo"), results.get("grpo"), results.get("ppo")
    if dpo:
        print("(a) DPO on embedded_austen_cloze_preference (held-out pairs: "
              f"{dpo['before']['pairs']})")
        print(f"| {'':32} | {'before (pretrained)':>20} | {'after DPO':>10} |")
        print(f"|{'-' * 34}|{'-' * 22}|{'-' * 12}|")
        for key in ("likelihood_pair_accuracy", "implicit_reward_accuracy", "cloze_accuracy",
                    "lm_held_out_loss"):
            print(f"| {key:32} | {dpo['before'][key]:20.3f} | {dpo['after'][key]:10.3f} |")
        print(f"DPO update: {dpo['train_tokens_per_sec']:,.0f} tokens/s (both rows of a pair)")
    if grpo:
        sft = grpo["sft"]
        print("\n(b) GRPO on embedded_arithmetic (500 held-out prompts, greedy exact match)")
        print(f"| {'model':30} | {'exact match':>11} |")
        print(f"|{'-' * 32}|{'-' * 13}|")
        print(f"| {'SFT':30} | {sft['exact_answer']:11.3f} |")
        print(f"| {'SFT, best of 8 samples (T=1)':30} | {sft['best_of_8_reward']:11.3f} |")
        for point in grpo["curve"]:
            print(f"| {'GRPO step ' + str(point['step']):30} | {point['exact_match']:11.3f} |")
        print(f"| {'GRPO final':30} | {grpo['final']['exact_answer']:11.3f} |")
        print(f"\n(c) rollouts: {grpo['rollout_completion_tokens_per_sec']:,.0f} completion "
              f"tokens/s; updates: {grpo['update_tokens_per_sec']:,.0f} tokens/s")
    if ppo:
        print("\n(d) PPO on embedded_arithmetic (500 held-out prompts, greedy exact match)")
        print(f"| {'model':30} | {'exact match':>11} |")
        print(f"|{'-' * 32}|{'-' * 13}|")
        print(f"| {'SFT':30} | {ppo['sft']['exact_answer']:11.3f} |")
        for point in ppo["curve"]:
            print(f"| {'PPO step ' + str(point['step']):30} | {point['exact_match']:11.3f} |")
        print(f"| {'PPO final':30} | {ppo['final']['exact_answer']:11.3f} |")
        first, last = ppo["kl"][0], ppo["kl"][-1]
        print(f"sampled reward {ppo['train_reward'][0][1]:.3f} (step {ppo['train_reward'][0][0]}) "
              f"-> {ppo['train_reward'][-1][1]:.3f} (step {ppo['train_reward'][-1][0]}); KL "
              f"{first[1]:.4f} -> {last[1]:.4f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("run", "table"))
    parser.add_argument("--runs", default="runs/preference")
    parser.add_argument("--only", choices=("dpo", "grpo", "ppo"), default=None)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny runs, in this process: a check that the script runs")
    args = parser.parse_args(argv)
    if not args.smoke:
        return run_or_table(args, pathlib.Path(args.runs))
    _smoke.IN_PROCESS = True
    _, model, _ = _smoke.PRETRAINED["pt_gpt2"]
    SMOKE.update(model=model, run=_smoke.TINY_RUN, pair_batches=3, lm_batches=1, prompts=8)
    args.command = "run"
    with tempfile.TemporaryDirectory(prefix="preference_smoke_") as scratch:
        return run_or_table(args, pathlib.Path(args.runs if args.runs != "runs/preference"
                                               else scratch))


def run_or_table(args, runs: pathlib.Path) -> int:
    def selected(runs, results):
        for name, run in (("dpo", run_dpo), ("grpo", run_grpo), ("ppo", run_ppo)):
            if args.only in (None, name):
                run(runs, results)
    return run_and_table(args.command, runs, selected, table)


def run_and_table(command: str, runs: pathlib.Path, run, print_table) -> int:
    """``run(runs, results)`` (with ``command`` "run": what is missing, then
    ``results.json``) and ``print_table(results)``, from ``runs`` (also
    ``instructgpt_recipe.py``'s)."""
    runs = runs.resolve()
    runs.mkdir(parents=True, exist_ok=True)
    path = runs / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    if command == "run":
        import t5x_like.builtin_tasks  # noqa: F401
        run(runs, results)
        path.write_text(json.dumps(results, indent=2))
    print_table(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
