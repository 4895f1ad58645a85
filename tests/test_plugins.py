"""Plug-ins from the user's own module, as docs/architecture.md prints them: a model
family (``plugin_family.py``, with its config) trained, evaluated, summarised and
planned through the ordinary commands, its spec's checks made before anything runs;
a training mode (``plugin_mode.py``, with its config) trained from a base run, resumed
exactly and evaluated; and an evaluator kind (``plugin_evaluator.py``) named in
``config.evals``."""

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from t5x_like import eval as eval_command
from t5x_like import train
from t5x_like.checkpoints.param_sources import source as param_source

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
PAGE = REPO / "docs" / "architecture.md"
FAMILY_FILES = ("plugin_family.py", "plugin_family_config.py")
MODE_FILES = ("plugin_mode.py", "plugin_mode_config.py")


def _section(title: str) -> str:
    text = PAGE.read_text()
    section = text[text.index(f"### {title}\n"):]
    return section[:section.index("\n### ", 1)]


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def _commands(section: str) -> list[list[str]]:
    return [[sys.executable if word == ".venv/bin/python" else word
             for word in shlex.split(line)]
            for line in _blocks(section, "sh")[0].splitlines() if line.strip()]


def test_the_page_prints_the_plugin_files_as_they_are():
    family = _blocks(_section("A new model family"), "python")
    mode = _blocks(_section("A new training mode"), "python")
    evaluator = _blocks(_section("A new evaluator kind"), "python")
    assert family == [(TESTS / name).read_text() for name in FAMILY_FILES]
    assert mode == [(TESTS / name).read_text() for name in MODE_FILES]
    assert evaluator == [(TESTS / "plugin_evaluator.py").read_text()]


def _main(argv, capsys):
    code = train.main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out + captured.err


@pytest.mark.parametrize("flag, expected", [
    ("--config.model.kernal_size=3", "Did you mean 'model.kernel_size'"),
    ("--config.model.kernel_size=0", "'model.kernel_size' must be"),
    ("--config.data.pack=True", "set --config.data.pack=False"),
])
def test_the_plugin_familys_spec_refuses_before_anything_runs(tmp_path, capsys, monkeypatch,
                                                              flag, expected):
    monkeypatch.syspath_prepend(str(TESTS))
    code, err = _main(["--module=plugin_family", f"--config={TESTS / FAMILY_FILES[1]}",
                       f"--workdir={tmp_path / 'run'}", flag], capsys)
    assert code == 2 and expected in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_plugin_family_commands_run_as_printed(tmp_path):
    """summary, train, eval and plan of the conv_lm family from the folder holding the
    page's two files, with nothing under t5x_like/ knowing the family."""
    for name in FAMILY_FILES:
        shutil.copy(TESTS / name, tmp_path / name)
    commands = _commands(_section("A new model family"))
    assert [argv[2] for argv in commands] == [
        "t5x_like.summary", "t5x_like.train", "t5x_like.eval", "t5x_like.plan"]
    outputs = []
    for argv in commands:
        result = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, (argv, result.stderr[-3000:])
        assert "Traceback" not in result.stderr, (argv, result.stderr[-3000:])
        outputs.append(result.stdout + result.stderr)
    summary, trained, evaluated, plan = outputs
    # vocab 8192 x d_model 32, and per layer: taps 4 x 32, two RMSNorm scales, the gated
    # MLP's 3 x 32 x 128; then the final norm
    per_layer = 4 * 32 + 2 * 32 + 3 * 32 * 128
    assert f"params: {8192 * 32 + 2 * per_layer + 32}" in summary
    rows = [json.loads(line) for line in
            (tmp_path / "runs" / "conv_lm" / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in rows if "loss" in r}  # logged every 5 steps
    assert sorted(losses) == [1, 5] and all(np.isfinite(list(losses.values())))
    assert "eval_loss" in rows[-1] and losses[5] < losses[1]
    assert (tmp_path / "runs" / "conv_lm" / "checkpoints" / "5").is_dir()
    scores = [json.loads(line) for line in
              (tmp_path / "runs" / "conv_lm" / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert [(s["task"], s["step"]) for s in scores] == [("embedded_austen_cloze", 5)]
    assert 0.0 <= scores[0]["acc"] <= 1.0 and 0.0 <= scores[0]["acc_norm"] <= 1.0  # lm-eval's
    # the structure's own FLOPs: 64 tokens, 2 layers of conv taps and the MLP, the output
    # projection; forward and backward (x3), batch 16
    per_token = 2 * (2 * 4 * 32 + 3 * 2 * 32 * 128) + 2 * 32 * 8192
    assert f"model FLOPs per step: {3 * 16 * 64 * per_token:.3e}" in plan
    assert "compiled FLOPs per device per step" in plan


def _metrics(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_training_mode_of_ones_own_trains_resumes_exactly_and_evaluates(tmp_path, capsys,
                                                                            monkeypatch):
    """The page's three commands in-process (the module imported from the folder holding
    the page's files): the anchored run starts at its anchor (KL 0 at step 1) and moves
    away from it; resumed from its step-2 checkpoint it logs steps 3 and 4 bit for bit;
    ``eval`` scores each of its checkpoints."""
    for name in MODE_FILES:
        shutil.copy(TESTS / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    commands = [argv[2:] for argv in _commands(_section("A new training mode"))]
    assert [argv[0] for argv in commands] == ["t5x_like.train", "t5x_like.train",
                                              "t5x_like.eval"]
    for argv in commands[:2]:
        code, out = _main(argv[1:], capsys)
        assert code == 0, out
    rows = {r["step"]: r for r in _metrics(tmp_path / "runs" / "anchored") if "loss" in r}
    assert sorted(rows) == [1, 2, 3, 4] and "eval_loss" in rows[4]
    assert rows[1]["kl_to_anchor"] == pytest.approx(0.0, abs=1e-6)  # the anchor is the start
    assert 0.0 < rows[2]["kl_to_anchor"] < rows[4]["kl_to_anchor"]
    base = {r["step"]: r["loss"] for r in _metrics(tmp_path / "runs" / "base") if "loss" in r}
    assert rows[1]["loss"] == pytest.approx(base[4], rel=0.2)  # it starts where the base ended
    # Resumed from step 2: the same step 4, the anchor read again from the base run.
    resumed = tmp_path / "runs" / "resumed"
    shutil.copytree(tmp_path / "runs" / "anchored", resumed)
    shutil.rmtree(resumed / "checkpoints" / "4")
    (resumed / "metrics.jsonl").unlink()
    argv = [word.replace("runs/anchored", "runs/resumed") for word in commands[1][1:]]
    code, out = _main(argv, capsys)
    assert code == 0 and "Resumed from" in out, out
    again = {r["step"]: r for r in _metrics(resumed) if "loss" in r}
    assert sorted(again) == [3, 4]
    assert [(again[s]["loss"], again[s]["kl_to_anchor"]) for s in (3, 4)] == [
        (rows[s]["loss"], rows[s]["kl_to_anchor"]) for s in (3, 4)]  # bit for bit
    assert eval_command.main(commands[2][1:]) == 0
    scores = _metrics(tmp_path / "runs" / "anchored" / "eval")
    assert [(s["task"], s["step"]) for s in scores] == [("embedded_austen_cloze", 2),
                                                        ("embedded_austen_cloze", 4)]


@pytest.mark.parametrize("flags, expected", [
    (["--config.modes.anchor.beta=0.5"], "init_from is empty; set --config.init_from=RUN"),
    (["--config.modes.anchr.beta=0.5"], "Did you mean 'anchor'"),
    (["--config.modes.anchor.bta=0.5"], "Did you mean 'modes.anchor.beta'"),
    (["--config.modes.anchor.beta=-1"], "'modes.anchor.beta' must be a finite number >= 0"),
])
def test_a_training_modes_settings_are_checked_before_anything_runs(tmp_path, capsys,
                                                                    monkeypatch, flags,
                                                                    expected):
    monkeypatch.syspath_prepend(str(TESTS))
    code, err = _main(["--module=plugin_mode", f"--config={TESTS / MODE_FILES[1]}",
                       f"--workdir={tmp_path / 'run'}", *flags], capsys)
    assert code == 2 and expected in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_a_modes_section_without_its_module_names_the_flag(tmp_path, capsys, monkeypatch):
    from t5x_like.config import mode_specs
    # as in a fresh process without --module (an earlier test may have imported it)
    monkeypatch.delitem(mode_specs.MODE_SPECS, "anchor", raising=False)
    code, err = _main([f"--config={TESTS / MODE_FILES[1]}", f"--workdir={tmp_path / 'run'}",
                       "--config.modes.anchor.beta=0.5"], capsys)
    assert code == 2 and "no mode 'anchor' is registered" in err and "--module" in err, err


def test_an_evaluator_kind_of_ones_own_logs_under_its_name(tmp_path, capsys, monkeypatch):
    """The page's command: ``norm/param_norm`` at steps 2 and 4, the global norm of the
    params saved at step 4."""
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.chdir(REPO)
    argv = _commands(_section("A new evaluator kind"))[0]
    assert argv[1:3] == ["-m", "t5x_like.train"]
    argv = [word.replace("runs/", f"{tmp_path}/runs/") for word in argv[3:]]
    code, out = _main(argv, capsys)
    assert code == 0, out
    workdir = tmp_path / "runs" / "norms"
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    norms = {r["step"]: r["norm/param_norm"] for r in rows if "norm/param_norm" in r}
    assert sorted(norms) == [2, 4]
    source = param_source.resolve(str(workdir))
    params = param_source.load_params(
        source, 4, param_source.config_from_saved(source.saved_config(4)))
    expected = np.sqrt(sum(np.sum(np.square(np.asarray(leaf, np.float64)))
                           for leaf in jax.tree.leaves(params)))
    assert norms[4] == pytest.approx(expected, rel=1e-5)
    assert norms[2] != norms[4]


def test_an_evaluator_kinds_settings_are_checked_by_name(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.chdir(REPO)
    code, err = _main(["--module=plugin_evaluator", "--config=configs/quickstart.py",
                       f"--workdir={tmp_path / 'run'}", "--config.evals.norm.kind=param_norm",
                       "--config.evals.norm.sqared=True"], capsys)
    assert code == 2 and "Did you mean 'evals.norm.squared'" in err, err
    assert not (tmp_path / "run").exists()
