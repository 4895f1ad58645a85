"""Evaluation's generations: static batches against the continuous-batching engine
(``eval --sampler=static|engine``) on a task whose answers differ in length.

    .venv/bin/python benchmarks/eval_sampler.py [--runs runs] [--steps 600] [--examples 256]
        [--batch 32] [--smoke]

The model: the benchmark recipe's small GPT-2 (``configs/finetune/gpt2_tiny_embedded_bench.py``:
4 layers, 128 wide, inputs 128 and targets 64, a causal prefix) trained from scratch for
``--steps`` on UD English POS tagging (``embedded_ud_pos``: a sentence in, its tags out),
made once in ``RUNS/pos_gpt2``. The first ``--examples`` sentences of its validation split
are tagged greedily by each sampler through the same evaluator, ``--batch`` rows at a time
(static: a batch; engine: its slots). Each sampler is timed on its second evaluation (the
first compiles).

A static batch decodes every row to ``max_decode_length`` (64; ``decoding.generate_padded``'s
loop has no early exit) and a batch starts when the last one has ended; the engine ends a
row at its EOS and gives its slot to the next row. The table says how many decoding steps
each ran, how many tokens the answers hold (to their EOS), and whether the predictions
are the same.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _smoke  # noqa: E402

import t5x_like.builtin_tasks  # noqa: E402,F401  (registers the task)
from t5x_like import resolving, structures  # noqa: E402
from t5x_like.checkpoints import int8_weights, param_sources  # noqa: E402
from t5x_like.engine import trainer as trainer_lib  # noqa: E402
from t5x_like.evaluation import evaluator, runner  # noqa: E402

TASK = "embedded_ud_pos"
CONFIG = "configs/finetune/gpt2_tiny_embedded_bench.py"


def trained(runs: pathlib.Path, steps: int, smoke: bool) -> pathlib.Path:
    """``RUNS/pos_gpt2``: the tagger, trained unless it is there already."""
    overrides = [f"--config.task={TASK}", f"--config.num_train_steps={steps}",
                 f"--config.checkpoint.every_steps={steps}", "--config.evals.benchmark.mixture=",
                 "--config.evals.held_out.every_steps=0"]
    if smoke:
        return _smoke.pretrain(runs / "pos_gpt2_smoke", CONFIG, *_smoke.tiny_overrides(),
                               f"--config.task={TASK}", "--config.evals.benchmark.mixture=",
                               _smoke.NO_HELD_OUT)
    workdir = runs / "pos_gpt2"
    if not (workdir / "checkpoints").is_dir():
        _smoke.cli("t5x_like.train", [f"--config={CONFIG}", f"--workdir={workdir}", "--quiet",
                                      *overrides], cwd=_smoke.REPO)
    return workdir


def evaluate(workdir: pathlib.Path, examples: int, batch: int) -> list[dict]:
    """Each sampler's row of the table, on the checkpoint's newest step."""
    source = param_sources.resolve(str(workdir))
    step = source.steps()[-1]
    config = resolving.resolve_checkpoint(source, step).spec
    _, trainer = trainer_lib.build_on_devices(config)
    weights = int8_weights.weights_for(config, structures.for_config(config), trainer)
    params = weights.restore(source, step, trainer)
    rows, predictions = [], {}
    for sampler in ("static", "engine"):
        ev = runner.build_evaluator(config, trainer, TASK, evaluator.EvalSettings(
            batch_size=batch, max_examples=examples, sampler=sampler), weights=weights)
        ev.evaluate(params)  # compiles
        start = time.perf_counter()
        (result,) = ev.evaluate(params)
        seconds = time.perf_counter() - start
        vocabulary = ev.tasks[0].output_features["targets"].vocabulary
        length = ev.settings.max_decode_length or ev.lengths["targets"]
        answers = [min(len(vocabulary.encode(r["prediction"])) + 1, length)  # and its EOS
                   for r in result.records]
        steps = (ev.engine.stats.steps // 2 if ev.engine is not None  # two evaluations
                 else -(-len(result.records) // batch) * length)
        predictions[sampler] = [r["prediction"] for r in result.records]
        rows.append(dict(sampler=sampler, rows=len(result.records), seconds=seconds,
                         answer_mean=float(np.mean(answers)), answer_max=max(answers),
                         steps=steps, metrics=result.metrics))
    same = np.mean([a == b for a, b in zip(predictions["static"], predictions["engine"],
                                           strict=True)])
    for row in rows:
        row["same"] = same
    return rows


def table(rows: list[dict], batch: int) -> str:
    metric = next(iter(rows[0]["metrics"]), "")
    lines = [f"| sampler | rows | batch / slots | seconds | rows/s | answer tokens, mean (max) | "
             f"decoding steps | {metric} | same predictions |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    base = rows[0]["seconds"]
    for r in rows:
        speed = f" ({base / r['seconds']:.2f}x)" if r is not rows[0] else ""
        lines.append(f"| {r['sampler']} | {r['rows']} | {batch} | {r['seconds']:.2f}{speed} | "
                     f"{r['rows'] / r['seconds']:.1f} | {r['answer_mean']:.1f} "
                     f"({r['answer_max']}) | {r['steps']} | "
                     f"{r['metrics'].get(metric, float('nan')):.2f} | {100 * r['same']:.0f}% |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="runs")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny model, 2 steps, 16 examples in batches of 8")
    args = parser.parse_args(argv)
    if args.smoke:
        _smoke.IN_PROCESS = True
        args.examples, args.batch = 16, 8
    workdir = trained(pathlib.Path(args.runs), args.steps, args.smoke)
    print(table(evaluate(workdir, args.examples, args.batch), args.batch), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
