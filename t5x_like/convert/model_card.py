"""The model card ``convert export`` writes beside the weights: ``README.md`` in Hugging
Face's format (YAML metadata, then Markdown), so that whoever loads the folder learns
what the model is and how it was made without asking the team that trained it.

It says what the export knows and nothing it does not: the architecture and parameter
count; for a training run of ours, the task (or mixture) and its description, the
steps and the positions they read (steps x batch x sequence length, padding included),
the last logged train loss and held-out metrics of the workdir's ``metrics.jsonl``, the
commands that launched the run (``checkpoints.run_commands``; runs from before it was
kept say so), and the license of every embedded data file the task reads, from
``data/README.md``'s tables. A pretrained folder (``convert import``) says where it came
from and no more.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

from t5x_like.checkpoints import run_commands
from t5x_like.data import embedded
from t5x_like.data.dataset_providers import Mixture, get_task_or_mixture

# Hugging Face's pipeline for the architecture's head, from its class name's ending.
_PIPELINES = (("ForCausalLM", "text-generation"), ("LMHeadModel", "text-generation"),
              ("ForConditionalGeneration", "text2text-generation"),
              ("ForMaskedLM", "fill-mask"), ("ForSequenceClassification", "text-classification"))
_DATA_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|(.*)\|\s*$")


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where the exported weights come from: ``checkpoint`` as given; for a training run,
    its ``workdir``, the ``step`` exported and its run ``spec``."""

    checkpoint: str
    workdir: pathlib.Path | None = None
    step: int | None = None
    spec: object | None = None


def render(hf_config: dict, num_params: int, provenance: Provenance) -> str:
    """The card's text."""
    architecture = (hf_config.get("architectures") or [hf_config.get("model_type", "?")])[0]
    pipeline = next((tag for ending, tag in _PIPELINES if architecture.endswith(ending)), None)
    front = ["---", "library_name: transformers", "tags:", "- t5x_like",
             f"- {hf_config.get('model_type', 'custom')}"]
    if pipeline:
        front.append(f"pipeline_tag: {pipeline}")
    front.append("---")
    lines = [*front, "", f"# {architecture} trained with t5x_like", "",
             f"Exported by `t5x_like.convert export` from `{provenance.checkpoint}`"
             + (f" (step {provenance.step})." if provenance.step is not None else "."), "",
             "## Model", "", f"- Architecture: `{architecture}` "
             f"(`model_type` {hf_config.get('model_type', '?')}), {num_params:,} parameters."]
    shape = [f"{key} {hf_config[key]}" for key in
             ("hidden_size", "d_model", "n_embd", "num_hidden_layers", "num_layers", "n_layer",
              "num_attention_heads", "num_heads", "n_head", "vocab_size") if key in hf_config]
    if shape:
        lines.append(f"- Shape: {', '.join(shape)}.")
    if provenance.spec is None:
        lines += ["", "A pretrained folder (`convert import`): how it was trained is not known "
                      "here; see where it was imported from."]
        return "\n".join(lines) + "\n"
    lines += ["", "## Training", "", *_training(provenance),
              "", "## Data and its license", "", *_licenses(provenance.spec)]
    lines += ["", "## How it was trained", ""]
    commands = run_commands.launches(provenance.workdir)
    if commands:
        lines += ["Each launch into the run's workdir, in order:", "", "```"]
        lines += [f"{c['command']}  # from step {c['from_step']}, {c['time']}" for c in commands]
        lines.append("```")
    else:
        lines.append("Not recorded: the run predates `train`'s record of its commands; its "
                     "resolved config is the workdir's `config.json`.")
    return "\n".join(lines) + "\n"


def _training(provenance: Provenance) -> list[str]:
    spec, step = provenance.spec, provenance.step or 0
    length = sum(dict(spec.task_feature_lengths).values())
    lines = [f"- Task: `{spec.task}`" + _described(spec.task) + ".",
             f"- {step:,} steps of {spec.batch_size} rows x {length} positions: "
             f"{step * spec.batch_size * length:,} positions read (padding included)."]
    records = run_commands.json_lines(provenance.workdir / "metrics.jsonl")
    trained = [r for r in records if "loss" in r and r.get("step", 0) <= step]
    if trained:
        lines.append(f"- Train loss {trained[-1]['loss']:.4f} (the mean logged at step "
                     f"{trained[-1]['step']}).")
    held_out = [r for r in records if any(k.startswith("eval_") for k in r)
                and r.get("step", 0) <= step]
    if held_out:
        last = held_out[-1]
        shown = ", ".join(f"{k[len('eval_'):]} {v:.4f}" for k, v in sorted(last.items())
                          if k.startswith("eval_") and isinstance(v, int | float))
        lines.append(f"- Held-out (step {last['step']}): {shown}.")
    return lines


def _described(task: str) -> str:
    try:
        description = get_task_or_mixture(task).description
    except KeyError:
        return " (registered by the run's own module)"
    return f": {description.rstrip('.')}" if description else ""


def _licenses(spec) -> list[str]:
    """Each embedded data file the task reads, with its license as ``data/README.md``
    states it."""
    files = sorted(_data_files(spec.task))
    table = _license_table(embedded.data_dir() / "README.md")
    if not files:
        return ["The task reads no embedded data file (a user's own data or a dataset "
                "read at run time): its license is its source's."]
    lines = ["The task reads these files of the embedded data (`data/`); the licenses are "
             "`data/README.md`'s:", ""]
    for name in files:
        lines.append(f"- `{name}`: {table.get(name, 'see data/README.md')}")
    return lines


def _data_files(task: str) -> set[str]:
    """The embedded data files (relative to the data folder) the task or mixture reads."""
    root = embedded.data_dir().resolve()
    try:
        found = get_task_or_mixture(task)
    except KeyError:
        return set()
    tasks = ([found.task(name) for name in found.leaf_rates("train")]
             if isinstance(found, Mixture) else [found])
    names = set()
    for each in tasks:
        for text in _strings(each.source):
            try:
                names.add(pathlib.Path(text).resolve().relative_to(root).as_posix())
            except ValueError:
                continue
    return names


def _strings(value, depth: int = 0):
    """Every string held in a source's fields (paths, patterns), through tuples, lists
    and nested dataclasses."""
    if depth > 4:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item, depth + 1)
    elif dataclasses.is_dataclass(value):
        for field in dataclasses.fields(value):
            yield from _strings(getattr(value, field.name), depth + 1)


def _license_table(readme: pathlib.Path) -> dict[str, str]:
    """``{file: license}`` from the Markdown tables of the data README whose first column
    is a file in backquotes and whose last is its license."""
    if not readme.is_file():
        return {}
    table = {}
    for line in readme.read_text().splitlines():
        found = _DATA_ROW.match(line)
        if found:
            table[found.group(1)] = found.group(2).split("|")[-1].strip()
    return table

