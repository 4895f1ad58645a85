"""Does replaced-token detection learn more per FLOP? ELECTRA against a BERT of the same
size pretrained for the same model FLOPs, both fine-tuned on three embedded_bench tasks.

    .venv/bin/python -m t5x_like.train --config=configs/pretrain/bert_tiny.py --workdir=runs/pt_bert
    .venv/bin/python -m t5x_like.train --config=configs/pretrain/electra_tiny.py --workdir=runs/pt_electra
    .venv/bin/python benchmarks/electra_bench.py run --runs=runs     # fine-tunes and evaluates
    .venv/bin/python benchmarks/electra_bench.py table --runs=runs   # prints the table

The BERT (``bert_tiny``: 4 layers, 128 wide, 1,000 steps of 32 x 128) and the ELECTRA
(a discriminator of the same shape, a generator a quarter of its width, 956 steps:
``flops.py`` counts both towers, 1.046x a BERT step) each fine-tune with the same
head recipe (400 steps of 32, one head per task) into ``RUNS/electra_<model>_<task>``
and are evaluated on the first 200 test examples. A finished run is skipped.
The table adds each model's pretraining FLOPs, its last held-out pretraining
metrics and the fine-tuned scores.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

TASKS = {"spam": ("classification", "f1"), "bible_paraphrase": ("classification", "accuracy"),
         "ud_pos": ("token_classification", "token_accuracy")}
MODELS = {"bert": ("configs/finetune/bert_tiny_head.py", "pt_bert",
                   "configs/pretrain/bert_tiny.py"),
          "electra": ("configs/finetune/electra_tiny_head.py", "pt_electra",
                      "configs/pretrain/electra_tiny.py")}
PYTHON = sys.executable


def run_dir(runs: pathlib.Path, model: str, task: str) -> pathlib.Path:
    return runs / f"electra_{model}_{task}"


def finetune_and_evaluate(workdir: pathlib.Path, config: str, init_from: pathlib.Path,
                          task: str, extra: list[str] = ()) -> None:
    """One head run of ``config`` from ``init_from`` on ``embedded_<task>``, evaluated on
    the first 200 test examples; skipped when its evaluation exists."""
    if (workdir / "eval_test" / "metrics.jsonl").is_file():
        return
    subprocess.run([PYTHON, "-m", "t5x_like.train", f"--config={config}", f"--workdir={workdir}",
                    "--quiet", f"--config.init_from={init_from}", f"--config.task=embedded_{task}",
                    f"--config.head.kind={TASKS[task][0]}", *extra], check=True)
    subprocess.run([PYTHON, "-m", "t5x_like.eval", f"--checkpoint={workdir}",
                    f"--task=embedded_{task}", "--split=test", "--max_examples=200",
                    f"--output_dir={workdir / 'eval_test'}", "--quiet"], check=True)


def run_all(runs: pathlib.Path, model_names, tasks) -> None:
    for model in model_names:
        config, pretrained, _ = MODELS[model]
        for task in tasks:
            finetune_and_evaluate(run_dir(runs, model, task), config, runs / pretrained, task)


def pretraining(runs: pathlib.Path, model: str) -> tuple[float, dict]:
    """``(total model FLOPs, the last held-out metrics)`` of the model's pretraining run."""
    from t5x_like import config_lib
    from t5x_like.models import structures
    config = config_lib.load_config_file(MODELS[model][2])
    per_sequence = structures.structure_class(config.model.family)(None) \
        .forward_flops_per_sequence(config.model.to_dict(), dict(config.task_feature_lengths))
    flops = 3.0 * per_sequence * config.batch_size * config.num_train_steps
    path = runs / MODELS[model][1] / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    held_out = [r for r in records if "eval_loss" in r]
    return flops, (held_out[-1] if held_out else {})


def score(workdir: pathlib.Path, task: str) -> float | None:
    path = workdir / "eval_test" / "metrics.jsonl"
    if not path.is_file():
        return None
    return json.loads(path.read_text().splitlines()[-1]).get(TASKS[task][1])


def table(runs: pathlib.Path, model_names, tasks) -> str:
    head = ["pretraining", "steps", "model FLOPs", "held-out MLM acc",
            "held-out disc. acc", *[f"{t} {TASKS[t][1]}" for t in tasks]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model in model_names:
        from t5x_like import config_lib
        steps = config_lib.load_config_file(MODELS[model][2]).num_train_steps
        flops, held_out = pretraining(runs, model)
        disc = held_out.get("eval_discriminator_accuracy")
        cells = [model, f"{steps:,}", f"{flops:.3g}",
                 f"{100 * held_out.get('eval_accuracy', float('nan')):.1f}",
                 "-" if disc is None else f"{100 * disc:.1f}"]
        for task in tasks:
            value = score(run_dir(runs, model, task), task)
            cells.append("-" if value is None else f"{value:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("run", "table"))
    parser.add_argument("--runs", default="runs")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--tasks", default=",".join(TASKS))
    args = parser.parse_args()
    runs = pathlib.Path(args.runs).absolute()
    model_names, tasks = args.models.split(","), args.tasks.split(",")
    if args.command == "run":
        run_all(runs, model_names, tasks)
    print(table(runs, model_names, tasks))


if __name__ == "__main__":
    main()
