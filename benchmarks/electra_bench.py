"""Does replaced-token detection learn more per FLOP? ELECTRA against a BERT of the same
size pretrained for the same model FLOPs, both fine-tuned on three embedded_bench tasks.

    .venv/bin/python -m t5x_like.train --config=configs/pretrain/bert_tiny.py --workdir=runs/pt_bert
    .venv/bin/python -m t5x_like.train --config=configs/pretrain/electra_tiny.py --workdir=runs/pt_electra
    .venv/bin/python benchmarks/electra_bench.py run --runs=runs     # fine-tunes and evaluates
    .venv/bin/python benchmarks/electra_bench.py table --runs=runs   # prints the table
    .venv/bin/python benchmarks/electra_bench.py run --smoke         # tiny: a check that it runs

The BERT (``bert_tiny``: 4 layers, 128 wide, 1,000 steps of 32 x 128) and the ELECTRA
(a discriminator of the same shape, a generator a quarter of its width, 956 steps:
``flops.py`` counts both towers, 1.046x a BERT step) each fine-tune with the same
head recipe (400 steps of 32, one head per task) into ``RUNS/electra_<model>_<task>``
and are evaluated on the first 200 test examples. A finished run is skipped.
The table adds each model's pretraining FLOPs, its last held-out pretraining
metrics and the fine-tuned scores. ``--smoke``: as ``peft_bench.py``'s (a 1-layer
discriminator), the generator 1 layer and 16 wide, ELECTRA's row only: the BERT row
fine-tunes ``RUNS/pt_bert`` with the command ``distill_bench.py``'s smoke row runs on its
student.
"""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from peft_bench import (  # noqa: E402
    PT_BERT,
    SMOKE,
    TASKS,
    bench_main,
    finetune_and_evaluate,
    head_overrides,
    score,
)

MODELS = {"bert": ("configs/finetune/bert_tiny_head.py", "pt_bert",
                   "configs/pretrain/bert_tiny.py"),
          "electra": ("configs/finetune/electra_tiny_head.py", "pt_electra",
                      "configs/pretrain/electra_tiny.py")}
# --smoke: the generator narrower than the (32-wide) discriminator, as in the recipe.
SMOKE_GENERATOR = ["--config.model.generator.d_model=16", "--config.model.generator.num_heads=1",
                   "--config.model.generator.head_dim=16", "--config.model.generator.d_ff=32",
                   "--config.model.generator.num_layers=1"]


def run_dir(runs: pathlib.Path, model: str, task: str) -> pathlib.Path:
    return runs / f"electra_{model}_{task}"


def run_all(runs: pathlib.Path, model_names, tasks) -> None:
    for model in model_names:
        config, pretrained, _ = MODELS[model]
        for task in tasks:
            finetune_and_evaluate(run_dir(runs, model, task), config, task,
                                  head_overrides(runs / pretrained, task)
                                  + (SMOKE_GENERATOR if SMOKE["run"] and model == "electra"
                                     else []))


def pretraining(runs: pathlib.Path, model: str) -> tuple[float, dict]:
    """``(total model FLOPs, the last held-out metrics)`` of the model's pretraining run."""
    from t5x_like import config_lib
    from t5x_like.engine import flops
    config = config_lib.load_config_file(MODELS[model][2])
    total = config.num_train_steps * flops.train_flops_per_step(
        config.model.to_dict(), dict(config.task_feature_lengths), config.batch_size)
    path = runs / MODELS[model][1] / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    held_out = [r for r in records if "eval_loss" in r]
    return total, (held_out[-1] if held_out else {})


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


def pretraining_runs(runs: pathlib.Path, models) -> list:
    """The pretraining runs the chosen models fine-tune from (``bench_main``'s ``--smoke``)."""
    made = {"bert": PT_BERT,
            "electra": ("pt_electra", "configs/pretrain/electra_tiny.py", SMOKE_GENERATOR)}
    return [made[model] for model in models]


def main(argv=None) -> None:
    bench_main(__doc__, "models", MODELS, run_all, table, argv, pretraining_runs,
               smoke_rows=lambda chosen: chosen[-1:])


if __name__ == "__main__":
    main()
