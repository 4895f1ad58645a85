"""Parity of our decoder multiple-choice scoring with EleutherAI lm-evaluation-harness.

One decoder checkpoint is scored twice on ``embedded_austen_cloze``: by our
``Evaluator`` in ``lm_eval`` mode (``t5x_like/evaluation/few_shot.py``, what
``python -m t5x_like.eval --num_shots=K`` runs) and by lm-eval 0.4.13's ``HFLM`` on
the checkpoint exported to Hugging Face GPT-2 with its tokenizer (``t5x_like.convert``
writes tokenizer.json; lm-eval loads it with ``AutoTokenizer``). Both see the
same examples, the same k-shot seed and the same context window, so accuracy,
normalised accuracy, prompts and per-choice log-likelihoods should agree (the
log-likelihoods up to float32 differences between JAX and PyTorch).

Not a test, and nothing in the test suite needs it or lm-eval. lm-eval goes in a
venv of its own, installed with the project's pins (from the repository root)::

    python3.11 -m venv /work/lmeval_venv
    pip install -c constraints.txt -e '.[lm_eval,eval]'     # (the dev extra has it too)

then::

    python benchmarks/lm_eval_parity.py \
        --checkpoint=runs/pt_gpt2 [--num_shots 0,2] [--limit N] [--max_length 0]
    python benchmarks/lm_eval_parity.py --smoke   # tiny: a check that it runs

``--checkpoint``: a training workdir (its newest step), one step folder, or a
``convert import`` folder. ``--max_length`` (tokens a scored row may hold, the left
cut for long few-shot prompts) is given to both sides; 0 means the model's
``max_length`` (GPT-2's ``n_positions``, lm-eval's default for the export), which
can exceed the training length that ``t5x_like.eval`` uses by default: give both
sides the same window, or the k-shot numbers differ for that reason alone. Prints
one row per shot count: both accuracies, the largest log-likelihood difference over
all choices, and whether the prompts (text and token ids) are identical; exits 1
when the accuracies or prompts differ.

``--smoke``: a tiny GPT-2 pretraining run (2 steps, 1 layer, 32 wide; made in a temporary
``--runs`` unless it holds ``pt_gpt2``) unless ``--checkpoint`` is given, the first 4 test
examples, batches of 8: a check that the script runs, parity included.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile

TASK = "embedded_austen_cloze"
LM_EVAL_TASK = "t5x_like_austen_cloze"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="", help="required but in --smoke")
    parser.add_argument("--num_shots", default="0,2", help="Comma-separated shot counts.")
    parser.add_argument("--limit", type=int, default=0, help="First N test examples; 0 = all.")
    parser.add_argument("--split", default="test")
    parser.add_argument("--max_length", type=int, default=0,
                        help="Scoring window of both sides in tokens; 0 = the model's max_length.")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1234, help="Few-shot sampling seed.")
    parser.add_argument("--work_dir", help="Where the export and data go (default: a temp dir).")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny checkpoint and few examples: a check that the script runs")
    parser.add_argument("--runs", default="", help="--smoke: where the tiny pt_gpt2 run is made")
    args = parser.parse_args(argv)
    if not (args.checkpoint or args.smoke):
        parser.error("--checkpoint is required")
    if args.smoke:
        args.limit, args.batch_size = 4, 8  # 8: a batch divides over 8 (fake) devices
    return args


# -- our side ------------------------------------------------------------------------------

def restore(checkpoint: str):
    """``(step, config, trainer, params, vocabulary)`` of the newest step, as
    ``t5x_like.eval`` loads it; the vocabulary is the checkpoint's own (an imported
    tokenizer), else the task's."""
    from t5x_like import resolving
    from t5x_like.checkpoints import param_sources
    from t5x_like.engine import trainer as trainer_lib

    source = param_sources.resolve(checkpoint)
    steps = source.steps()
    if not steps:
        sys.exit(f"{checkpoint} holds no complete checkpoint yet.")
    step = steps[-1]
    resolved = resolving.resolve_checkpoint(source, step)
    config = resolved.spec
    if config.model.family != "decoder":
        sys.exit(f"{checkpoint} is a {config.model.family} model; lm-eval parity needs a decoder.")
    _, trainer = trainer_lib.build_on_devices(config)
    from t5x_like.data import get_task_or_mixture
    vocabulary = resolved.trained_vocabulary or get_task_or_mixture(TASK).vocabulary
    return step, config, trainer, source.restore_params(step, trainer), vocabulary


def score_ours(config, trainer, params, vocabulary, args, num_shots: int, width: int):
    """Our ``Evaluator`` in lm_eval mode on the first ``--limit`` examples of the split."""
    from t5x_like.evaluation import evaluator, few_shot, lm_eval_harness, runner

    settings = evaluator.EvalSettings(split=args.split, max_examples=args.limit,
                                      batch_size=args.batch_size, num_shots=num_shots,
                                      few_shot_seed=args.seed)
    ev = runner.build_evaluator(config, trainer, TASK, settings, {"targets": width},
                                  vocabulary)
    (result,) = ev.evaluate(params)
    assert result.mode == "lm_eval", result.mode
    vocabulary = ev.tasks[0].output_features["targets"].vocabulary
    examples = ev.examples(ev.tasks[0])
    prefix = evaluator.text_prefix(ev.structure, vocabulary)
    requests = [few_shot.loglikelihood_request(vocabulary, record["inputs"],
                                               lm_eval_harness._text(option), prefix)
                for record, ex in zip(result.records, examples, strict=False) for option in ex["options"]]
    return lm_eval_harness.Scored(result.metrics["acc"], result.metrics["acc_norm"],
                                  [r["inputs"] for r in result.records],
                                  [r["option_scores"] for r in result.records], requests)


# -- the export and the data lm-eval reads ----------------------------------------------------

def export_hf(checkpoint: str, folder: pathlib.Path) -> pathlib.Path:
    """The checkpoint as a Hugging Face folder with the tokenizer it trained with
    (``convert export``: its template frames a text as the run's rows begin)."""
    from t5x_like.convert import __main__ as convert

    convert.export_hf(checkpoint, str(folder / "hf"))
    return folder / "hf"


def check_tokenizer(tokenizer, vocabulary, records: list[dict], prefix=()) -> int:
    """Asserts the exported tokenizer's ids equal ours on every context and every
    context + " " + choice (what both sides split into requests), its template adding
    ``prefix`` (the run's start id); returns the count."""
    texts = [r["inputs"] for r in records]
    texts += [r["inputs"] + " " + o for r in records for o in r["options"]]
    for text in texts:
        theirs = tokenizer.encode(text, add_special_tokens=False)
        ours = list(vocabulary.encode(text))
        assert theirs == ours, f"tokenizers differ on {text[:80]!r}: {theirs[:20]} vs {ours[:20]}"
        assert tokenizer.encode(text) == [*prefix, *ours], "the template adds another prefix"
    return len(texts)


# -- comparison ------------------------------------------------------------------------------

def print_table(rows: dict[int, dict], examples: int, width: int, step: int) -> None:
    columns = ["lm-eval acc", "ours acc", "lm-eval acc_norm", "ours acc_norm", "max |Δ loglik|",
               "prompts identical"]
    print(f"\n{TASK}, {examples} examples, checkpoint step {step}, window {width} tokens")
    print("| shots | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for shots, row in rows.items():
        cells = [f"{row[c]:.4f}" if c.endswith(("acc", "acc_norm")) else
                 f"{row[c]:.2e}" if c.startswith("max") else row[c] for c in columns]
        print(f"| {shots} | " + " | ".join(cells) + " |")
    for shots, row in rows.items():
        if "first difference" in row:
            index, theirs, ours = row["first difference"]
            print(f"\n{shots} shots, example {index}:\n  lm-eval: {theirs[-300:]!r}\n"
                  f"  ours:    {ours[-300:]!r}")


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not args.smoke:
        return compare(args, args.checkpoint)
    import _smoke
    _smoke.IN_PROCESS = True
    with tempfile.TemporaryDirectory(prefix="lm_eval_parity_smoke_") as scratch:
        args.work_dir = args.work_dir or str(pathlib.Path(scratch) / "work")
        return compare(args, args.checkpoint or str(_smoke.pretrained(
            pathlib.Path(args.runs or scratch), "pt_gpt2")))


def compare(args, checkpoint: str) -> int:
    """Both sides on ``checkpoint``; prints the table, returns 0 when they agree."""
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="lm_eval_parity_")).absolute()
    work.mkdir(parents=True, exist_ok=True)
    # lm-eval reads the JSONL through `datasets`: keep its cache here and off the network.
    os.environ.setdefault("HF_DATASETS_CACHE", str(work / "datasets_cache"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

    from t5x_like.evaluation import lm_eval_harness

    step, config, trainer, params, vocabulary = restore(checkpoint)
    width = args.max_length or config.model.positions.max_length
    hf_dir = export_hf(checkpoint, work)
    task_dir = work / "lm_eval_task"
    data = lm_eval_harness.write_task(task_dir, TASK, args.split, LM_EVAL_TASK)
    lm = lm_eval_harness.load_model(hf_dir, width, args.batch_size)
    from t5x_like import structures
    prefix = structures.for_config(config).text_prefix()
    checked = check_tokenizer(lm.tokenizer, vocabulary, data["test"] + data["train"], prefix)
    print(f"tokenizer: the export's ids equal ours on {checked} texts; export in {hf_dir}")
    rows = {}
    for shots in (int(s) for s in args.num_shots.split(",")):
        theirs = lm_eval_harness.run(lm, task_dir, LM_EVAL_TASK, shots, limit=args.limit,
                                     seed=args.seed)
        ours = score_ours(config, trainer, params, vocabulary, args, shots, width)
        rows[shots] = lm_eval_harness.compare(theirs, ours)
    print_table(rows, len(theirs.prompts), width, step)
    return 0 if all(row["agree"] for row in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
