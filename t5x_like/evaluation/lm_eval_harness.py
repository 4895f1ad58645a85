"""Our multiple-choice tasks run through EleutherAI's lm-evaluation-harness, to compare.

``write_task`` writes a task's examples as JSONL plus a task YAML using the harness's
multiple-choice conventions (``target_delimiter`` " ", ``fewshot_delimiter`` a blank
line, demonstrations from the train split); ``run`` scores a Hugging Face folder (an
export, or the folder a model was imported from) with the harness's ``HFLM`` and
returns its metrics, prompts and per-choice log-likelihoods in example order, so they
can be put beside ``python -m t5x_like.eval --num_shots=K`` line by line.

lm-eval is an optional dependency (the ``lm_eval`` extra); it reads the JSONL through
``datasets`` offline.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import numpy as np

# Imports inside functions: lm-eval, PyTorch and transformers (the `lm_eval` extra) load only
# when the harness runs.


@dataclasses.dataclass
class Scored:
    """One side's result: metrics, and per evaluated example its prompt and choice scores."""
    acc: float
    acc_norm: float
    prompts: list[str]
    logliks: list[list[float]]
    # Token ids of every (context, continuation) request, in example then choice order.
    requests: list[tuple[list[int], list[int]]] = dataclasses.field(default_factory=list)


def _text(value) -> str:
    from t5x_like.data.preprocessors.text import as_text
    return as_text(value)


def task_records(task_name: str, split: str) -> list[dict]:
    """The split's examples as the evaluator reads them (same order), as JSON records;
    the target must be one of the options (the harness answers with options[label])."""
    from t5x_like.data import get_task_or_mixture

    task = get_task_or_mixture(task_name)
    records = []
    # The length only truncates token features; the text fields are kept whole.
    for ex in task.get_dataset(split, {"targets": 256}, shuffle=False, num_epochs=1):
        options = [_text(o) for o in ex["options"]]
        target = _text(ex["targets_pretokenized"])
        if options[int(ex["label"])] != target:
            raise ValueError(f"Task {task_name!r}: label {int(ex['label'])} does not point at "
                             f"the target {target!r} among {options}.")
        records.append({"inputs": _text(ex["inputs_pretokenized"]), "options": options,
                        "label": int(ex["label"]), "targets": target})
    return records


def write_task(folder, task_name: str, split: str, harness_name: str) -> dict[str, list[dict]]:
    """JSONL files of the train split and ``split`` plus ``<harness_name>.yaml``;
    returns the records by file ("test", "train")."""
    import yaml

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = {"test": task_records(task_name, split), "train": task_records(task_name, "train")}
    files = {}
    for name, records in data.items():
        files[name] = str(folder / f"{name}.jsonl")
        with open(files[name], "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    spec = {
        "task": harness_name, "dataset_path": "json", "dataset_kwargs": {"data_files": files},
        "output_type": "multiple_choice", "training_split": "train", "fewshot_split": "train",
        "test_split": "test", "doc_to_text": "inputs", "doc_to_choice": "options",
        "doc_to_target": "label", "target_delimiter": " ", "fewshot_delimiter": "\n\n",
        "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True}
                        for m in ("acc", "acc_norm")],
    }
    (folder / f"{harness_name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return data


def load_model(hf_dir, max_length: int, batch_size: int = 16):
    """lm-eval's ``HFLM`` on a Hugging Face folder and the tokenizer it carries, with its
    default encoding: texts framed by the tokenizer's template (ours frame them alike,
    ``evaluator.text_prefix``), an empty context prefixed with the tokenizer's BOS,
    else EOS (ours too); rows are cut from the left to ``max_length`` tokens, as ours
    are."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import torch
    import transformers
    from lm_eval.models.huggingface import HFLM

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    return HFLM(pretrained=model.eval(), tokenizer=tokenizer, batch_size=batch_size,
                max_length=max_length)


def run(lm, task_dir, harness_name: str, num_shots: int, *, limit: int = 0,
        seed: int = 1234) -> Scored:
    """The harness's ``simple_evaluate`` with samples logged, in example order."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(task_dir), include_defaults=False)
    out = lm_eval.simple_evaluate(model=lm, tasks=[harness_name], num_fewshot=num_shots,
                                  limit=limit or None, task_manager=manager, log_samples=True,
                                  fewshot_random_seed=seed, bootstrap_iters=0)
    metrics = out["results"][harness_name]
    samples = sorted(out["samples"][harness_name], key=lambda s: s["doc_id"])
    prompts, logliks, requests = [], [], []
    for sample in samples:
        contexts = {context for context, _ in sample["arguments"]}
        if len(contexts) != 1:
            raise ValueError(f"lm-eval gave example {sample['doc_id']} several prompts.")
        prompts.append(contexts.pop())
        logliks.append([float(r[0]) for r in sample["filtered_resps"]])
        requests += [lm._encode_pair(context, continuation)
                     for context, continuation in sample["arguments"]]
    return Scored(metrics["acc,none"], metrics["acc_norm,none"], prompts, logliks, requests)


def compare(theirs: Scored, ours: Scored) -> dict:
    """A table row (both accuracies, the largest log-likelihood difference, whether the
    prompts and request tokens are identical), plus the first differing prompt."""
    if len(theirs.prompts) != len(ours.prompts) or len(theirs.requests) != len(ours.requests):
        raise ValueError(f"lm-eval scored {len(theirs.prompts)} examples / "
                         f"{len(theirs.requests)} requests, ours {len(ours.prompts)} / "
                         f"{len(ours.requests)}.")
    delta = max(float(np.max(np.abs(np.subtract(a, b))))
                for a, b in zip(theirs.logliks, ours.logliks, strict=False))
    differing = [i for i, (a, b) in enumerate(zip(theirs.prompts, ours.prompts, strict=False)) if a != b]
    token_differing = sum(tuple(map(list, a)) != tuple(map(list, b))
                          for a, b in zip(theirs.requests, ours.requests, strict=False))
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


def ours_from_predictions(predictions_file, vocabulary, records: list[dict],
                          prefix=()) -> Scored:
    """Our side read back from ``eval``'s ``predictions/<task>/step_N.jsonl``: the
    written prompts and choice scores, and the requests re-made with ``vocabulary``
    (each text after ``prefix``, ``evaluator.text_prefix``)."""
    from t5x_like.evaluation import few_shot

    written = [json.loads(line) for line in
               pathlib.Path(predictions_file).read_text(encoding="utf-8").splitlines()]
    requests = [few_shot.loglikelihood_request(vocabulary, w["inputs"], option, prefix)
                for w, record in zip(written, records, strict=False) for option in record["options"]]
    correct = [w["prediction"] == w["targets"] for w in written]
    correct_norm = [w["prediction_norm"] == w["targets"] for w in written]
    return Scored(float(np.mean(correct)), float(np.mean(correct_norm)),
                  [w["inputs"] for w in written], [w["option_scores"] for w in written], requests)
