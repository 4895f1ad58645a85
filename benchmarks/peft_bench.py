"""Full fine-tuning against parameter-efficient tuning, from one pretrained BERT, on three
embedded_bench tasks: score, trainable fraction, optimizer-state bytes, step time.

    .venv/bin/python -m t5x_like.train --config=configs/pretrain/bert_tiny.py --workdir=runs/pt_bert
    .venv/bin/python benchmarks/peft_bench.py run --runs=runs      # trains and evaluates
    .venv/bin/python benchmarks/peft_bench.py table --runs=runs    # prints the table
    .venv/bin/python benchmarks/peft_bench.py run --smoke          # tiny: a check that it runs

Every run is ``configs/finetune/bert_tiny_head.py`` (400 steps of 32, a fresh head)
from ``RUNS/pt_bert``, with the method's overrides below; each method has one
learning rate, picked before any run (no search): the usual ranges of its paper
scaled to this small model. Runs land in ``RUNS/peft_<method>_<task>`` and are
evaluated on the first 200 test examples; a finished run is skipped on ``run``.
Step times are measured by ``table`` itself, one method at a time on a random batch
of the first task's shape, with nothing else running.

``--smoke`` (``run`` or ``table``, this script and ``electra_bench.py`` / ``distill_bench.py``):
the same commands at tiny sizes, in this process, as a check that the script runs: 1-layer,
32-wide models, 2 steps of 8 rows of 32 tokens without the held-out evaluation during
training (the tables read the eval command's scores), evaluation on 8 examples, one row
on the first task (here the first parameter-efficient ``--methods``, LoRA: ``full``
fine-tunes as ``distill_bench.py``'s smoke row does; ``electra_bench.py``: ELECTRA;
``distill_bench.py``: the distilled student), in a temporary ``--runs`` unless one is
given; the pretraining runs the table needs are made there first, as tiny. The step time
is measured on the run's own mesh (every device, not one), whose train step the
fine-tuning has just compiled: each row and each mesh is another compile, 10-20 s on 2
busy cores.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile

import _smoke

from t5x_like.checkpoints.param_sources import peft_partial

TASKS = {"spam": ("classification", "f1"), "bible_paraphrase": ("classification", "accuracy"),
         "ud_pos": ("token_classification", "token_accuracy")}
METHODS = {
    "full": [],
    "lora": ["peft.lora.rank=8", "peft.lora.alpha=16", "optimizer.learning_rate=2e-3"],
    "adapters": ["peft.adapter.size=16", "optimizer.learning_rate=2e-3"],
    "prefix": ["peft.prefix.length=10", "peft.prefix.reparameterize=True",
               "peft.prefix.hidden=128", "optimizer.learning_rate=5e-3"],
    "prompt": ["peft.prompt.length=20", "optimizer.learning_rate=2e-2"],
    "bitfit": ["peft.bitfit=True", "optimizer.learning_rate=5e-3"],
    # LoRA on every kernel of the body (attention and MLP), as QLoRA and later work do.
    "lora_all": ["peft.lora.rank=8", "peft.lora.alpha=16", "peft.lora.targets=kernel$",
                 "optimizer.learning_rate=2e-3"],
}
CONFIG = "configs/finetune/bert_tiny_head.py"
# What --smoke adds to every fine-tuning command: the tiny BERT of RUNS/pt_bert and its
# rows' length (SMOKE_MODEL), 2 steps of 8 rows, no held-out evaluation (SMOKE_RUN).
SMOKE_MODEL = [*_smoke.PRETRAINED["pt_bert"][1], *_smoke.PRETRAINED["pt_bert"][2]]
SMOKE_RUN = [*_smoke.TINY_RUN, *SMOKE_MODEL, "--config.evals.held_out.every_steps=0"]
SMOKE = {"run": [], "eval_examples": 200, "step_ms_steps": 30}  # set by bench_main --smoke


def run_dir(runs: pathlib.Path, method: str, task: str) -> pathlib.Path:
    return runs / f"peft_{method}_{task}"


def head_overrides(init_from: pathlib.Path, task: str) -> list[str]:
    """A head run on ``embedded_<task>`` from ``init_from``."""
    return [f"--config.init_from={init_from}", f"--config.task=embedded_{task}",
            f"--config.head.kind={TASKS[task][0]}"]


def overrides(runs: pathlib.Path, method: str, task: str) -> list[str]:
    return head_overrides(runs / "pt_bert", task) + [f"--config.{o}" for o in METHODS[method]]


def finetune_and_evaluate(workdir: pathlib.Path, config: str, task: str,
                          run_overrides: list[str]) -> None:
    """Trains ``config`` with ``run_overrides`` into ``workdir`` and evaluates its last step
    on the first 200 test examples of ``embedded_<task>``; skipped when evaluated.
    (Shared by electra_bench.py and distill_bench.py.)"""
    if (workdir / "eval_test" / "metrics.jsonl").is_file():
        return
    _smoke.cli("t5x_like.train", [f"--config={config}", f"--workdir={workdir}", "--quiet",
                                  *run_overrides, *SMOKE["run"]])
    _smoke.cli("t5x_like.eval", [f"--checkpoint={workdir}", f"--task=embedded_{task}",
                                 "--split=test", f"--max_examples={SMOKE['eval_examples']}",
                                 f"--output_dir={workdir / 'eval_test'}", "--quiet"])


def run_all(runs: pathlib.Path, methods, tasks) -> None:
    for task in tasks:
        for method in methods:
            finetune_and_evaluate(run_dir(runs, method, task), CONFIG, task,
                                  overrides(runs, method, task))


def _trainer(runs: pathlib.Path, method: str, task: str):
    import jax

    from t5x_like import config_lib
    from t5x_like import resolving as resolving
    from t5x_like.engine import partitioning
    from t5x_like.engine import trainer as trainer_lib
    config = config_lib.load_config_file(CONFIG)
    config_lib.apply_overrides(config, [o[len("--config."):] for o in
                                        overrides(runs, method, task) + SMOKE["run"]])
    config.init_from = ""
    spec = resolving.resolve_spec(config)  # the head's labels from the task, as train reads them
    if SMOKE["run"]:  # --smoke: the fine-tuning run's mesh, whose step it compiled (docstring)
        return spec, trainer_lib.build_on_devices(spec)[1]
    mesh = partitioning.make_mesh({"data": 1}, jax.devices()[:1])
    return spec, trainer_lib.build_trainer(spec, mesh)


def sizes(runs: pathlib.Path, method: str, task: str) -> tuple[int, int, int]:
    """``(params, trainable params, optimizer-state bytes)`` of the run's trainer."""
    import jax
    import numpy as np

    from t5x_like.engine import trainer as trainer_lib
    _, trainer = _trainer(runs, method, task)
    params = trainer.abstract_state.params
    total = trainer_lib.param_count(params)
    trainable = (total if trainer.trainable is None else
                 trainer_lib.param_count(peft_partial.trainable_only(params, trainer.trainable) or {}))
    state_bytes = sum(int(np.prod(x.shape)) * x.dtype.itemsize
                      for x in jax.tree.leaves(trainer.abstract_state.opt_state))
    return total, trainable, state_bytes


def step_ms(runs: pathlib.Path, method: str, task: str, steps: int | None = None) -> float:
    """Median train step time on one random batch of the run's shape, measured alone
    (the runs' own logged rates share the machine with whatever else ran)."""
    import time

    import jax
    import numpy as np

    from t5x_like import structures
    steps = steps or SMOKE["step_ms_steps"]
    config, trainer = _trainer(runs, method, task)
    structure = structures.for_config(config)
    rng = np.random.default_rng(0)
    batch = {}
    for name, spec in structure.abstract_batch(config.task_feature_lengths,
                                               config.batch_size).items():
        high = 2 if "label" in name else 1000
        batch[name] = (np.ones(spec.shape, spec.dtype) if spec.dtype == np.float32 else
                       rng.integers(1, high, size=spec.shape).astype(spec.dtype))
    batch = jax.device_put(batch, trainer.batch_sharding)
    state = trainer.init_state(0)
    times = []
    for index in range(steps + 3):
        start = time.perf_counter()
        state, metrics = trainer.train_step(state, batch)
        jax.block_until_ready(metrics)
        if index >= 3:
            times.append(time.perf_counter() - start)
    return 1000.0 * statistics.median(times)


def score(workdir: pathlib.Path, task: str) -> float | None:
    path = workdir / "eval_test" / "metrics.jsonl"
    if not path.is_file():
        return None
    line = json.loads(path.read_text().splitlines()[-1])
    return line.get(TASKS[task][1])


def table(runs: pathlib.Path, methods, tasks) -> str:
    head = ["method", *[f"{t} {TASKS[t][1]}" for t in tasks], "trainable", "optimizer state",
            f"step ms ({tasks[0]})"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method in methods:
        total, trainable, state_bytes = sizes(runs, method, tasks[0])
        cells = [method]
        for task in tasks:
            value = score(run_dir(runs, method, task), task)
            cells.append("-" if value is None else f"{value:.1f}")
        cells.append(f"{trainable:,} ({100 * trainable / total:.2f}%)")
        cells.append(f"{state_bytes / 1024:,.0f} KiB")
        cells.append(f"{step_ms(runs, method, tasks[0]):.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bench_main(doc: str, flag: str, names, run_all_fn, table_fn, argv=None,
               pretraining=lambda runs, chosen: [PT_BERT],
               smoke_rows=lambda chosen: chosen[:1]) -> None:
    """``run|table --runs=DIR --<flag>=a,b --tasks=...``: the command line of this and the
    other fine-tuning benchmarks (``run`` trains what is missing, both print the table).
    ``pretraining(runs, chosen)``: ``[(run name, config, overrides)]``, the pretraining
    runs the chosen rows start from, in order, which ``--smoke`` makes (tiny) when missing.
    ``smoke_rows(chosen)``: the rows ``--smoke`` runs (on the first task)."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("run", "table"))
    parser.add_argument("--runs", default="")
    parser.add_argument(f"--{flag}", default=",".join(names))
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, in this process: a check that the script runs")
    args = parser.parse_args(argv)
    chosen, tasks = getattr(args, flag).split(","), args.tasks.split(",")
    with tempfile.TemporaryDirectory(prefix="finetune_smoke_") as scratch:
        runs = pathlib.Path(args.runs or (scratch if args.smoke else "runs")).absolute()
        if args.smoke:
            _smoke.IN_PROCESS = True
            SMOKE.update(run=SMOKE_RUN, eval_examples=8, step_ms_steps=1)
            chosen, tasks = smoke_rows(chosen), tasks[:1]
            for name, config, extra in pretraining(runs, chosen):
                _smoke.pretrain(runs / name, config, *SMOKE_MODEL, *extra)
        if args.command == "run" or args.smoke:
            run_all_fn(runs, chosen, tasks)
        print(table_fn(runs, chosen, tasks))


# The pretraining runs (RUNS/<name>) every fine-tuning benchmark starts from (--smoke: as
# _smoke.pretrained makes them).
PT_BERT = ("pt_bert", "configs/pretrain/bert_tiny.py", (_smoke.NO_HELD_OUT,))


def main(argv=None) -> None:
    bench_main(__doc__, "methods", METHODS, run_all, table, argv,
               smoke_rows=lambda chosen: [m for m in chosen if m != "full"][:1] or chosen[:1])


if __name__ == "__main__":
    main()
