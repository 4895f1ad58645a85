"""Parity of our decoder multiple-choice scoring with EleutherAI lm-evaluation-harness.

One decoder checkpoint is scored twice on ``embedded_austen_cloze``: by our
``Evaluator`` in ``lm_eval`` mode (``t5x_like/evaluation/few_shot.py``, what
``python -m t5x_like.eval --num_shots=K`` runs) and by lm-eval 0.4.13's ``HFLM`` on
the checkpoint exported to Hugging Face GPT-2 (``t5x_like.convert``). Both see the
same examples, the same k-shot seed and the same context window, so accuracy,
normalised accuracy, prompts and per-choice log-likelihoods should agree (the
log-likelihoods up to float32 differences between JAX and PyTorch).

Not a test, and nothing in the test suite needs it or lm-eval. lm-eval goes in a
venv of its own, installed with the project's pins (from the repository root)::

    python3.11 -m venv /work/lmeval_venv
    /work/lmeval_venv/bin/pip install -c constraints.txt -e '.[hf,eval]' 'lm-eval[hf]==0.4.13'

then::

    /work/lmeval_venv/bin/python benchmarks/lm_eval_parity.py \
        --checkpoint=runs/pt_gpt2 [--num_shots 0,2] [--limit N] [--max_length 0]

``--checkpoint``: a training workdir (its newest step), one step folder, or a
``convert import`` folder. ``--max_length`` (tokens a scored row may hold, the left
cut for long few-shot prompts) is given to both sides; 0 means the model's
``max_length`` (GPT-2's ``n_positions``, lm-eval's default for the export), which
can exceed the training length that ``t5x_like.eval`` uses by default: give both
sides the same window, or the k-shot numbers differ for that reason alone. Prints
one row per shot count: both accuracies, the largest log-likelihood difference over
all choices, and whether the prompts (text and token ids) are identical; exits 1
when the accuracies or prompts differ.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import tempfile

import numpy as np

TASK = "embedded_austen_cloze"
LM_EVAL_TASK = "t5x_like_austen_cloze"


@dataclasses.dataclass
class Scored:
    """One side's result: metrics, and per evaluated example its prompt and choice scores."""
    acc: float
    acc_norm: float
    prompts: list[str]
    logliks: list[list[float]]
    # Token ids of every (context, continuation) request, in example then choice order.
    requests: list[tuple[list[int], list[int]]] = dataclasses.field(default_factory=list)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--num_shots", default="0,2", help="Comma-separated shot counts.")
    parser.add_argument("--limit", type=int, default=0, help="First N test examples; 0 = all.")
    parser.add_argument("--split", default="test")
    parser.add_argument("--max_length", type=int, default=0,
                        help="Scoring window of both sides in tokens; 0 = the model's max_length.")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1234, help="Few-shot sampling seed.")
    parser.add_argument("--work_dir", help="Where the export and data go (default: a temp dir).")
    return parser.parse_args(argv)


# -- our side ------------------------------------------------------------------------------

def restore(checkpoint: str):
    """``(step, config, trainer, params)`` of the newest step, as ``t5x_like.eval`` loads it."""
    import jax

    from t5x_like import config_lib, partitioning, trainer as trainer_lib
    from t5x_like.evaluation import loading

    source = loading.resolve(checkpoint)
    steps = source.steps()
    if not steps:
        sys.exit(f"{checkpoint} holds no complete checkpoint yet.")
    step = steps[-1]
    config = loading.run_config(source, step, None, [])
    if config.model.family != "decoder":
        sys.exit(f"{checkpoint} is a {config.model.family} model; lm-eval parity needs a decoder.")
    devices = jax.devices()
    shape = config_lib.validate_for_devices(config, len(devices), jax.process_count(),
                                            partitioning.num_slices(devices))
    trainer = trainer_lib.build_trainer(config, partitioning.make_mesh(shape, devices))
    return step, config, trainer, source.restore_params(step, trainer)


def score_ours(config, trainer, params, args, num_shots: int, width: int) -> Scored:
    """Our ``Evaluator`` in lm_eval mode on the first ``--limit`` examples of the split."""
    from t5x_like import eval as eval_cli
    from t5x_like.evaluation import evaluator, few_shot

    settings = evaluator.EvalSettings(split=args.split, max_examples=args.limit,
                                      batch_size=args.batch_size, num_shots=num_shots,
                                      few_shot_seed=args.seed)
    ev = eval_cli.build_evaluator(config, trainer, TASK, settings, {"targets": width})
    (result,) = ev.evaluate(params)
    assert result.mode == "lm_eval", result.mode
    vocabulary = ev.tasks[0].output_features["targets"].vocabulary
    examples = ev.examples(ev.tasks[0])
    requests = [few_shot.loglikelihood_request(vocabulary, record["inputs"], _text(option))
                for record, ex in zip(result.records, examples) for option in ex["options"]]
    return Scored(result.metrics["acc"], result.metrics["acc_norm"],
                  [r["inputs"] for r in result.records],
                  [r["option_scores"] for r in result.records], requests)


def _text(value) -> str:
    from t5x_like.data.preprocessors.text import as_text
    return as_text(value)


# -- the export and the data lm-eval reads ----------------------------------------------------

def export_hf(config, params, folder: pathlib.Path) -> pathlib.Path:
    """The checkpoint as a Hugging Face folder. ``convert export`` reads params-only
    folders, not training workdirs, so the params are saved as one first."""
    from t5x_like.convert import __main__ as convert, pretrained

    pretrained.save_pretrained(folder / "pretrained", config.model.to_dict(), params)
    convert.export_hf(str(folder / "pretrained"), str(folder / "hf"))
    return folder / "hf"


def task_examples(split: str) -> list[dict]:
    """The split's examples as the evaluator reads them (same order), as JSON records."""
    from t5x_like.data import get_task_or_mixture

    task = get_task_or_mixture(TASK)
    records = []
    # The length only truncates token features; the text fields are kept whole.
    for ex in task.get_dataset(split, {"targets": 256}, shuffle=False, num_epochs=1):
        options = [_text(o) for o in ex["options"]]
        target = _text(ex["targets_pretokenized"])
        # lm-eval's demonstrations answer with options[label]; ours with the target text.
        assert options[int(ex["label"])] == target, (options, target)
        records.append({"inputs": _text(ex["inputs_pretokenized"]), "options": options,
                        "label": int(ex["label"]), "targets": target})
    return records


def write_lm_eval_task(folder: pathlib.Path, split: str) -> tuple[list[dict], list[dict]]:
    """JSONL files of the train and evaluated splits plus a task YAML using lm-eval's
    multiple-choice conventions; returns the (evaluated, train) records."""
    import yaml

    data = {"test": task_examples(split), "train": task_examples("train")}
    files = {}
    for name, records in data.items():
        files[name] = str(folder / f"{name}.jsonl")
        with open(files[name], "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    task = {
        "task": LM_EVAL_TASK, "dataset_path": "json", "dataset_kwargs": {"data_files": files},
        "output_type": "multiple_choice", "training_split": "train", "fewshot_split": "train",
        "test_split": "test", "doc_to_text": "inputs", "doc_to_choice": "options",
        "doc_to_target": "label", "target_delimiter": " ", "fewshot_delimiter": "\n\n",
        "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True}
                        for m in ("acc", "acc_norm")],
    }
    (folder / f"{LM_EVAL_TASK}.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    return data["test"], data["train"]


# -- the tokenizer ---------------------------------------------------------------------------

def build_tokenizer(vocabulary):
    """A transformers tokenizer over our SentencePiece model file. transformers 5's
    T5Tokenizer/LlamaTokenizer are ``tokenizers`` conversions (T5Tokenizer from this
    .model file knows 104 pieces); SentencePieceBackend runs the .model itself. It adds
    no special tokens, and the sentinel pieces above the .model are never in a prompt."""
    from transformers.tokenization_utils_sentencepiece import SentencePieceBackend

    return SentencePieceBackend(vocab_file=vocabulary.model_path, bos_token="<s>",
                                eos_token="</s>", unk_token="<unk>", pad_token="<pad>")


def check_tokenizer(tokenizer, vocabulary, records: list[dict]) -> int:
    """Asserts ``tokenizer.encode == vocabulary.encode`` on every context and every
    context + " " + choice (what both sides split into requests); returns the count."""
    texts = [r["inputs"] for r in records]
    texts += [r["inputs"] + " " + o for r in records for o in r["options"]]
    for text in texts:
        theirs = tokenizer.encode(text, add_special_tokens=False)
        ours = list(vocabulary.encode(text))
        assert theirs == ours, f"tokenizers differ on {text[:80]!r}: {theirs[:20]} vs {ours[:20]}"
        assert tokenizer.encode(text) == ours, "the tokenizer adds special tokens by default"
    return len(texts)


# -- lm-eval's side ---------------------------------------------------------------------------

def make_hflm(hf_dir: pathlib.Path, tokenizer, vocabulary, max_length: int, batch_size: int):
    """lm-eval's HFLM on the export. No BOS is added (ours adds none); an empty context
    would be prefixed with EOS, as ours does; rows are cut to ``max_length`` as ours."""
    import torch
    import transformers
    from lm_eval.models.huggingface import HFLM

    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    return HFLM(pretrained=model.eval(), tokenizer=tokenizer, batch_size=batch_size,
                max_length=max_length, add_bos_token=False, prefix_token_id=vocabulary.eos_id)


def score_lm_eval(lm, task_dir: pathlib.Path, args, num_shots: int) -> Scored:
    """lm-eval's ``simple_evaluate`` with samples logged, in example order."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(task_dir), include_defaults=False)
    out = lm_eval.simple_evaluate(model=lm, tasks=[LM_EVAL_TASK], num_fewshot=num_shots,
                                  limit=args.limit or None, task_manager=manager,
                                  log_samples=True, fewshot_random_seed=args.seed,
                                  bootstrap_iters=0)
    metrics = out["results"][LM_EVAL_TASK]
    samples = sorted(out["samples"][LM_EVAL_TASK], key=lambda s: s["doc_id"])
    prompts, logliks, requests = [], [], []
    for sample in samples:
        contexts = {context for context, _ in sample["arguments"]}
        assert len(contexts) == 1, "one prompt per example"
        prompts.append(contexts.pop())
        logliks.append([float(r[0]) for r in sample["filtered_resps"]])
        requests += [lm._encode_pair(context, continuation)
                     for context, continuation in sample["arguments"]]
    return Scored(metrics["acc,none"], metrics["acc_norm,none"], prompts, logliks, requests)


# -- comparison ------------------------------------------------------------------------------

def compare(theirs: Scored, ours: Scored) -> dict:
    """A table row, plus the first differing prompt for the report."""
    assert len(theirs.prompts) == len(ours.prompts), (len(theirs.prompts), len(ours.prompts))
    assert len(theirs.requests) == len(ours.requests), "different numbers of choices"
    delta = max(float(np.max(np.abs(np.subtract(a, b))))
                for a, b in zip(theirs.logliks, ours.logliks))
    differing = [i for i, (a, b) in enumerate(zip(theirs.prompts, ours.prompts)) if a != b]
    token_differing = sum(a != b for a, b in zip(theirs.requests, ours.requests))
    same = not differing and not token_differing
    row = {"lm-eval acc": theirs.acc, "ours acc": ours.acc, "lm-eval acc_norm": theirs.acc_norm,
           "ours acc_norm": ours.acc_norm, "max |Δ loglik|": delta,
           "agree": same and theirs.acc == ours.acc and theirs.acc_norm == ours.acc_norm,
           "prompts identical": "yes" if same else
           f"no ({len(differing)} texts, {token_differing} requests' tokens)"}
    if differing:
        row["first difference"] = (differing[0], theirs.prompts[differing[0]],
                                   ours.prompts[differing[0]])
    return row


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
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="lm_eval_parity_")).absolute()
    work.mkdir(parents=True, exist_ok=True)
    # lm-eval reads the JSONL through `datasets`: keep its cache here and off the network.
    os.environ.setdefault("HF_DATASETS_CACHE", str(work / "datasets_cache"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

    from t5x_like.data import get_task_or_mixture

    step, config, trainer, params = restore(args.checkpoint)
    width = args.max_length or config.model.max_length
    hf_dir = export_hf(config, params, work)
    task_dir = work / "lm_eval_task"
    task_dir.mkdir(exist_ok=True)
    records, train = write_lm_eval_task(task_dir, args.split)
    vocabulary = get_task_or_mixture(TASK).output_features["targets"].vocabulary
    tokenizer = build_tokenizer(vocabulary)
    checked = check_tokenizer(tokenizer, vocabulary, records + train)
    print(f"tokenizer: ids equal ours on {checked} texts; export in {hf_dir}")
    lm = make_hflm(hf_dir, tokenizer, vocabulary, width, args.batch_size)
    rows = {}
    for shots in (int(s) for s in args.num_shots.split(",")):
        theirs = score_lm_eval(lm, task_dir, args, shots)
        ours = score_ours(config, trainer, params, args, shots, width)
        rows[shots] = compare(theirs, ours)
    print_table(rows, len(theirs.prompts), width, step)
    return 0 if all(row["agree"] for row in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
