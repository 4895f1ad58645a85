"""Teacher vs distilled student vs the same student trained without a teacher, each
fine-tuned on three embedded_bench tasks: scores, parameters, inference speed.

    .venv/bin/python -m t5x_like.train --config=configs/pretrain/bert_tiny.py --workdir=runs/pt_bert
    .venv/bin/python -m t5x_like.train --config=configs/pretrain/distil_bert_tiny.py --workdir=runs/pt_distil
    .venv/bin/python -m t5x_like.train --config=configs/pretrain/distil_bert_tiny.py --workdir=runs/pt_small \\
        --config.distill.teacher= --config.distill.student_init=fresh
    .venv/bin/python benchmarks/distill_bench.py run --runs=runs     # fine-tunes and evaluates
    .venv/bin/python benchmarks/distill_bench.py table --runs=runs   # prints the table
    .venv/bin/python benchmarks/distill_bench.py run --smoke         # tiny: a check that it runs

The teacher is ``bert_tiny`` (4 layers, 1,000 steps); the students have 2 layers
(500 steps): one distilled from the teacher and started from its layers 0 and 3,
one trained on masked LM alone from a fresh init. All three fine-tune with
``configs/finetune/bert_tiny_head.py`` (400 steps of 32) into
``RUNS/distill_<model>_<task>``. Inference speed is the encoder's forward pass on
a batch of 32 x 128 tokens, measured alone by ``table`` (median of 20).

``--smoke``: as ``peft_bench.py``'s (a 1-layer teacher and student; speed of a 1-layer
encoder on 4 x 16 tokens, median of 2), the distilled row only: its pretraining is what
only this script runs (a student from the teacher's layers, with the teacher in the loss),
and the teacher's row fine-tunes ``RUNS/pt_bert`` with the command that fine-tunes the
student (its "% of teacher" cell is then "-"). Each more row is another fine-tuning,
evaluation and speed compile (10-20 s on 2 busy cores).
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import time

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

CONFIG = "configs/finetune/bert_tiny_head.py"
MODELS = {"teacher": ("pt_bert", 4), "distilled": ("pt_distil", 2), "no_teacher": ("pt_small", 2)}


def run_dir(runs: pathlib.Path, model: str, task: str) -> pathlib.Path:
    return runs / f"distill_{model}_{task}"


def run_all(runs: pathlib.Path, model_names, tasks) -> None:
    for model in model_names:
        pretrained, layers = MODELS[model]
        for task in tasks:
            finetune_and_evaluate(run_dir(runs, model, task), CONFIG, task,
                                  head_overrides(runs / pretrained, task)
                                  + [f"--config.model.num_layers={layers}"])


def size_and_speed(layers: int) -> tuple[int, float]:
    """``(encoder parameters, sequences per second)`` of the forward pass."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from t5x_like import config_lib, structures
    from t5x_like.engine import trainer
    config = config_lib.load_config_file("configs/pretrain/bert_tiny.py")
    config.model.num_layers = layers
    if SMOKE["run"]:  # the smoke run's 1-layer models
        import _smoke
        _smoke.tiny_model(config.model)
    model = structures.build_model(config.model)
    rows, length, repeats = (4, 16, 2) if SMOKE["run"] else (32, 128, 20)
    tokens = jnp.asarray(np.random.default_rng(0).integers(5, 8000, size=(rows, length)),
                         jnp.int32)
    params = jax.jit(model.init)(jax.random.key(0), tokens)["params"]
    forward = jax.jit(lambda p, t: model.apply({"params": p}, t)["mlm_logits"])
    jax.block_until_ready(forward(params, tokens))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(forward(params, tokens))
        times.append(time.perf_counter() - start)
    return trainer.param_count(params), rows / statistics.median(times)


def table(runs: pathlib.Path, model_names, tasks) -> str:
    head = ["model", "layers", "params", "sequences/s", *[f"{t} {TASKS[t][1]}" for t in tasks],
            "mean", "% of teacher"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    teacher_mean = None
    for model in model_names:
        _, layers = MODELS[model]
        count, speed = size_and_speed(layers)
        values = [score(run_dir(runs, model, task), task) for task in tasks]
        known = [v for v in values if v is not None]
        mean = sum(known) / len(known) if len(known) == len(values) else None
        if model == "teacher":
            teacher_mean = mean
        share = (f"{100 * mean / teacher_mean:.0f}%" if mean is not None and teacher_mean
                 else "-")
        cells = [model, str(layers), f"{count:,}", f"{speed:.0f}",
                 *["-" if v is None else f"{v:.1f}" for v in values],
                 "-" if mean is None else f"{mean:.1f}", share]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pretraining_runs(runs: pathlib.Path, models) -> list:
    """The pretraining runs of the chosen models, teacher first (``bench_main``'s
    ``--smoke``): the distilled student reads ``RUNS/pt_bert``."""
    import _smoke

    # The students' held-out losses are read by nobody here: no evaluation while they train.
    quiet = _smoke.NO_HELD_OUT
    made = {"teacher": [PT_BERT],
            "distilled": [PT_BERT, ("pt_distil", "configs/pretrain/distil_bert_tiny.py",
                                    [f"--config.distill.teacher={runs / 'pt_bert'}", quiet])],
            "no_teacher": [("pt_small", "configs/pretrain/distil_bert_tiny.py",
                            ["--config.distill.teacher=", "--config.distill.student_init=fresh",
                             quiet])]}
    wanted = [run for model in models for run in made[model]]
    return [run for index, run in enumerate(wanted) if run not in wanted[:index]]


def main(argv=None) -> None:
    bench_main(__doc__, "models", MODELS, run_all, table, argv, pretraining_runs,
               smoke_rows=lambda chosen: [m for m in chosen if m == "distilled"] or chosen[:1])


if __name__ == "__main__":
    main()
