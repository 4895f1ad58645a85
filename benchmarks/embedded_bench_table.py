"""The embedded_bench table of docs/evaluation.md: majority-class baseline, and each fine-tuned
model from random init and from its pretrained checkpoint, per task and metric.

    .venv/bin/python benchmarks/embedded_bench_table.py --runs=runs [--split=test] [--max_examples=200]
    .venv/bin/python benchmarks/embedded_bench_table.py --smoke   # tiny: a check that it runs

Model columns read ``RUNS/ft_<model>_<init>/eval_<split>/metrics.jsonl`` (text-to-text
runs, ``python -m t5x_like.eval --mixture=embedded_bench``) and
``RUNS/ft_bert_<task>_<init>/eval_<split>/metrics.jsonl`` (one head per task); a
missing run prints ``-``. The majority baseline is computed here on the same examples
with each task's own metric functions: every example gets the most frequent train
target (for tagging, the most frequent tag at every word; for the cloze, the option at
the most frequent answer position).

``--smoke``: the majority baseline on 4 examples of each task (the most frequent target
counted on the first ``SMOKE_TRAIN_EXAMPLES`` train examples: reading every train split
through its task's preprocessing takes seconds a task), and one model cell from a
real run: a BERT head trained from random init for 2 steps on ``embedded_spam`` and
evaluated on 4 test examples into ``RUNS/ft_bert_spam_rand`` (a temporary ``--runs``
unless one is given; the other cells print ``-``): a check that the script runs and reads
what ``eval`` writes.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import pathlib
import tempfile

from t5x_like.builtin_tasks import bench as bench_tasks
from t5x_like.data import get_task_or_mixture
from t5x_like.data.preprocessors.text import as_text

COLUMNS = [("T5", "t5"), ("GPT-2", "gpt2"), ("BERT", "bert")]
LENGTHS = {"inputs": 1 << 16, "targets": 1 << 16}
SMOKE_TRAIN_EXAMPLES = 64  # --smoke: the train examples the majority is counted on


def examples(task, split: str, limit: int | None) -> list[dict]:
    ds = task.get_dataset(split, LENGTHS, shuffle=False, num_epochs=1)
    return list(itertools.islice(iter(ds), limit))


def majority(task, split: str, limit: int | None,
             train_limit: int | None = None) -> dict[str, float]:
    train = examples(task, "train", train_limit)
    evaluated = examples(task, split, limit)
    targets = [as_text(ex["targets_pretokenized"]) for ex in evaluated]
    if "tags" in evaluated[0]:
        tag = collections.Counter(t for ex in train for t in ex["tags"]).most_common(1)[0][0]
        predictions = [" ".join([tag] * len(ex["tags"])) for ex in evaluated]
    elif "options" in evaluated[0]:
        position = collections.Counter(int(ex["label"]) for ex in train).most_common(1)[0][0]
        predictions = [as_text(ex["options"][position]) for ex in evaluated]
    else:
        common = collections.Counter(as_text(ex["targets_pretokenized"]) for ex in train)
        predictions = [common.most_common(1)[0][0]] * len(evaluated)
    out = {}
    post = lambda text, ex, is_target: task.postprocess(text, example=ex, is_target=is_target)  # noqa: E731
    for fn in task.metric_fns:
        out.update(fn([post(t, ex, True) for t, ex in zip(targets, evaluated, strict=False)],
                      [post(p, ex, False) for p, ex in zip(predictions, evaluated, strict=False)]))
    return out


def read_metrics(path: pathlib.Path) -> dict[str, dict[str, float]]:
    """task -> metrics of the newest step in a metrics.jsonl."""
    if not path.is_file():
        return {}
    out, steps = {}, {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["step"] >= steps.get(record["task"], -1):
            steps[record["task"]] = record["step"]
            out[record["task"]] = record
    return out


def smoke_run(runs: pathlib.Path, split: str, max_examples: int) -> None:
    """``--smoke``'s one model cell: ``RUNS/ft_bert_spam_rand`` trained (2 steps, a tiny
    BERT from random init, no held-out evaluation: the cell is the eval command's) and
    evaluated as the table's runs are."""
    import _smoke
    _smoke.IN_PROCESS = True
    workdir = runs / "ft_bert_spam_rand"
    _, model, lengths = _smoke.PRETRAINED["pt_bert"]
    _smoke.cli("t5x_like.train", ["--config=configs/finetune/bert_tiny_head.py",
                                  f"--workdir={workdir}", "--quiet", "--config.init_from=",
                                  "--config.task=embedded_spam", *_smoke.TINY_RUN, *model,
                                  *lengths, _smoke.NO_HELD_OUT], cwd=_smoke.REPO)
    _smoke.cli("t5x_like.eval", [f"--checkpoint={workdir}", "--task=embedded_spam",
                                 f"--split={split}", f"--max_examples={max_examples}",
                                 f"--output_dir={workdir / f'eval_{split}'}", "--quiet"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="")
    parser.add_argument("--split", default="test")
    parser.add_argument("--max_examples", type=int, default=200)
    parser.add_argument("--smoke", action="store_true",
                        help="4 examples a task, one tiny run: a check that the script runs")
    args = parser.parse_args(argv)
    if not args.smoke:
        return table(pathlib.Path(args.runs or "runs"), args)
    args.max_examples = 4
    with tempfile.TemporaryDirectory(prefix="embedded_bench_smoke_") as scratch:
        runs = pathlib.Path(args.runs or scratch)
        smoke_run(runs, args.split, args.max_examples)
        table(runs, args)


def table(runs: pathlib.Path, args) -> None:
    """The table: per task and metric, the majority baseline and every model column."""
    eval_dir = f"eval_{args.split}"
    text_runs = {(model, init): read_metrics(runs / f"ft_{model}_{init}" / eval_dir /
                                             "metrics.jsonl")
                 for _, model in COLUMNS[:2] for init in ("rand", "pt")}
    header = ["task", "metric", "majority"] + [f"{name} {label}" for name, _ in COLUMNS
                                               for label in ("random init", "pretrained")]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name in bench_tasks.TASKS:
        task = get_task_or_mixture(name)
        base = majority(task, args.split, args.max_examples or None,
                        SMOKE_TRAIN_EXAMPLES if args.smoke else None)
        short = name.replace("embedded_", "")
        bert = {init: read_metrics(runs / f"ft_bert_{short}_{init}" / eval_dir / "metrics.jsonl")
                for init in ("rand", "pt")}
        for metric, value in base.items():
            cells = [short, metric, f"{value:.1f}"]
            for _, model in COLUMNS:
                for init in ("rand", "pt"):
                    source = bert[init] if model == "bert" else text_runs[(model, init)]
                    got = source.get(name, {}).get(metric)
                    cells.append("-" if got is None else f"{got:.1f}")
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
