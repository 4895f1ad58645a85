"""What the benchmarks' ``--smoke`` modes share (not a benchmark: ``tests/test_benchmarks_smoke.py``
runs every ``benchmarks/*.py`` whose name does not start with ``_``).

A smoke run is the benchmark's own code path at tiny sizes, so that CI notices when a
script stops running (an API it calls changed, a config key moved) long before anyone
re-measures the docs' tables with it. The sizes here only shrink what a run costs; they
are never used to measure anything.

Three things differ from a real run, each only in cost:

- ``tiny_model``: the model's widths and depths shrink (a config's own family, norm,
  positions and objective are kept), so that a compile takes seconds, not minutes;
- ``cli``: the repository's commands (``python -m t5x_like.train`` and the like) that a
  benchmark runs as subprocesses run in this process instead, through the same ``main``
  their ``python -m`` entry calls (a process start costs 5-10 s of imports on 2 cores);
- ``pretrain``: a benchmark that reads pretrained checkpoints a README command makes
  (``runs/pt_bert`` ...) makes that command's run itself, tiny, when it is missing.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]

# Set by a script's --smoke: commands run in-process (see the module docstring).
IN_PROCESS = False

# Widths of every tiny model (heads x head_dim = d_model); layer counts are capped at
# TINY_LAYERS, so a config whose recipe needs its depth (a student that starts from
# layers 0 and 3 of its teacher) keeps it by passing a larger cap.
TINY_WIDTHS = {"d_model": 32, "num_heads": 2, "head_dim": 16, "d_ff": 64}
TINY_LAYERS = 1
LAYER_KEYS = ("num_layers", "num_encoder_layers", "num_decoder_layers")


def tiny_model(model, layers: int | None = TINY_LAYERS, vocab_size: int | None = None) -> None:
    """Shrinks a config's ``model`` section in place: widths to ``TINY_WIDTHS``, layers to
    at most ``layers`` (None: as many as the config has), and the vocabulary to
    ``vocab_size`` when given (only for models fed random ids: a task's tokens need the
    task's vocabulary)."""
    for key, value in TINY_WIDTHS.items():
        if key in model:
            model[key] = value
    for key in LAYER_KEYS:
        if layers is not None and key in model and model[key]:
            model[key] = min(model[key], layers)
    attention = model.get("attention") or {}
    if attention.get("num_kv_heads"):  # grouped queries stay grouped: 2 heads share 1
        attention["num_kv_heads"] = 1
    experts = model.get("experts") or {}
    for key in ("d_ff", "shared_d_ff"):
        if experts.get(key):
            experts[key] = TINY_WIDTHS["d_ff"]
    if vocab_size is not None:
        model["vocab_size"] = vocab_size


def tiny_overrides(layers: int | None = TINY_LAYERS, layer_keys=("num_layers",)) -> list[str]:
    """``tiny_model`` as ``--config.model.KEY=VALUE`` overrides of a command line: the
    widths, and ``layers`` for each of ``layer_keys`` (None: the config's own depth)."""
    out = [f"--config.model.{key}={value}" for key, value in TINY_WIDTHS.items()]
    return out + ([] if layers is None else [f"--config.model.{key}={layers}"
                                             for key in layer_keys])


# ``python -m PACKAGE`` runs PACKAGE/__main__.py; these packages' ``main`` is elsewhere.
ENTRY_POINTS = {"t5x_like.retrieval": "t5x_like.retrieval.cli",
                "t5x_like.convert": "t5x_like.convert.__main__"}


def cli(module: str, argv: list[str], cwd: pathlib.Path | str | None = None,
        capture: bool = False) -> str:
    """``python -m MODULE ARGV``, failing as ``subprocess.run(check=True)`` does; its
    standard output when ``capture``. With ``IN_PROCESS`` the module's ``main(argv)`` runs
    here (the code ``python -m`` runs, without the start-up of a new process)."""
    if not IN_PROCESS:
        done = subprocess.run([sys.executable, "-m", module, *argv], check=True, cwd=cwd,
                              capture_output=capture, text=True)
        return done.stdout if capture else ""
    entry = importlib.import_module(ENTRY_POINTS.get(module, module))
    out = io.StringIO()
    previous = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out) if capture else contextlib.nullcontext():
            try:
                code = entry.main(list(argv))
            except SystemExit as e:
                code = e.code
    finally:
        os.chdir(previous)
    if code not in (None, 0):
        raise subprocess.CalledProcessError(code, [module, *argv], out.getvalue())
    return out.getvalue()


# The run settings of every tiny training run: a step or two of 8 rows, one held-out batch.
TINY_RUN = ["--config.num_train_steps=2", "--config.batch_size=8",
            "--config.logging.every_steps=1", "--config.checkpoint.every_steps=2",
            "--config.evals.held_out.every_steps=2", "--config.evals.held_out.batches=1",
            "--config.optimizer.warmup_steps=1"]


def pretrain(workdir: pathlib.Path, config: str, *overrides: str) -> pathlib.Path:
    """A tiny run of the pretraining command ``python -m t5x_like.train --config=CONFIG
    --workdir=WORKDIR`` (``TINY_RUN``'s steps and batches, then ``overrides``: the caller's
    tiny model, ``tiny_overrides`` for most), unless ``workdir`` holds a checkpoint already:
    the benchmarks share their ``--runs`` folder, so a later one finds the run an earlier one
    made."""
    if (workdir / "checkpoints").is_dir() and any((workdir / "checkpoints").iterdir()):
        return workdir
    cli("t5x_like.train", [f"--config={config}", f"--workdir={workdir}", "--quiet", *TINY_RUN,
                           *overrides], cwd=REPO)
    return workdir


# The pretraining runs several benchmarks read (RUNS/<name>), tiny: (config, the model's
# overrides, which every run that loads the checkpoint repeats, the rows' lengths). One
# layer each (a distilled student of BERT's then starts from its one layer): every model
# that loads one compiles seconds faster than with two.
PRETRAINED = {
    "pt_bert": ("configs/pretrain/bert_tiny.py", tiny_overrides(),
                ["--config.task_feature_lengths.inputs=32"]),
    "pt_gpt2": ("configs/pretrain/gpt2_tiny.py", tiny_overrides(),
                ["--config.task_feature_lengths.targets=32"]),
    "pt_t5": ("configs/pretrain/t5_tiny.py",
              tiny_overrides(layer_keys=("num_encoder_layers", "num_decoder_layers")),
              ["--config.task_feature_lengths.inputs=32",
               "--config.task_feature_lengths.targets=8"]),
}


# No held-out evaluation while a run trains, for the runs whose held-out metrics no smoke
# run reads (each evaluation compiles its own step).
NO_HELD_OUT = "--config.evals.held_out.every_steps=0"


def pretrained(runs: pathlib.Path, name: str) -> pathlib.Path:
    """``RUNS/<name>`` of ``PRETRAINED``, made tiny when missing (``NO_HELD_OUT``)."""
    config, model, lengths = PRETRAINED[name]
    return pretrain(runs / name, config, *model, *lengths, NO_HELD_OUT)
