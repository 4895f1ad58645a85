"""The docs' examples are code: the small-task example of docs/data_and_tasks.md runs as
printed, every command the README and docs/ show answers --help without a traceback,
every command of the README's table is also a ``t5xl`` subcommand, and every relative
link (and its anchor) of the README and docs/ resolves."""

import json
import os
import re
import shlex
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import pytest

from t5x_like import cli

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    return dict(env, **extra)


def _fenced_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def _shell_lines(block: str) -> list[str]:
    """One command per line, with backslash continuations joined."""
    return [line.strip() for line in block.replace("\\\n", " ").splitlines()
            if line.strip() and not line.strip().startswith("#")]


def _run(argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, **kwargs)


@pytest.mark.slow
def test_the_export_round_trip_runs_as_printed(tmp_path):
    """docs/models_and_conversion.md's round trip: train, export and infer as printed,
    then its Python: transformers' answers from ``tokenizer(text)`` and ``generate`` with
    defaults equal ours (``runs/`` and ``hf/`` become temporary folders)."""
    page = (REPO / "docs" / "models_and_conversion.md").read_text()
    section = page[page.index("### Train here, use anywhere"):]
    commands = _shell_lines(_fenced_blocks(section, "sh")[0])
    assert [shlex.split(c)[2] for c in commands] == [
        "t5x_like.train", "t5x_like.convert", "t5x_like.infer"]
    for command in commands:
        argv = [sys.executable if word == ".venv/bin/python" else
                word.replace("=runs/", f"={tmp_path}/runs/").replace("=hf/", f"={tmp_path}/hf/")
                for word in shlex.split(command)]
        result = _run(argv, env=_env(), timeout=600)
        assert result.returncode == 0, (command, result.stderr[-3000:])
    script = _fenced_blocks(section, "python")[0]
    script = script.replace('"hf/', f'"{tmp_path}/hf/').replace('"runs/', f'"{tmp_path}/runs/')
    result = _run([sys.executable, "-c", script], env=_env(HF_HUB_OFFLINE="1"), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 4, result.stdout
    for line in lines:
        theirs, ours = re.fullmatch(r".*= transformers: (.*) ours: (.*)", line).groups()
        assert theirs == ours, line


@pytest.mark.slow
def test_the_small_task_example_runs_as_printed(tmp_path):
    """Registering a task from a user module, `tasks show`, training 20 steps and `eval`,
    with the page's own code: only `.venv/bin/python` becomes this interpreter and
    `runs/` a temporary folder."""
    page = (REPO / "docs" / "data_and_tasks.md").read_text()
    module = next(b for b in _fenced_blocks(page, "python") if b.startswith("# my_tasks.py"))
    (tmp_path / "my_tasks.py").write_text(module)
    section = page[page.index("# my_tasks.py"):]
    commands = _shell_lines(_fenced_blocks(section, "sh")[0])
    assert [shlex.split(c)[2] for c in commands] == [
        "t5x_like.tasks", "t5x_like.tasks", "t5x_like.train", "t5x_like.eval"]
    env = _env(PYTHONPATH=str(tmp_path))
    outputs = []
    for command in commands:
        argv = [sys.executable if word == ".venv/bin/python" else
                word.replace("runs/", f"{tmp_path}/runs/") for word in shlex.split(command)]
        result = _run(argv, env=env, timeout=600)
        assert result.returncode == 0, (command, result.stderr[-3000:])
        assert "Traceback" not in result.stderr, (command, result.stderr[-3000:])
        # Evaluation opens checkpoints read-only without orbax's warnings about it.
        assert "WARNING:absl" not in result.stderr, (command, result.stderr[-3000:])
        outputs.append(result.stdout + result.stderr)
    show, sample, trained, evaluated = outputs
    assert "my_authors" in show and "examples: train 32, validation 8" in show
    assert sample.count("--- example") == 2
    assert "held-out loss" in trained and "Held-out evaluation is off" not in trained
    lines = [json.loads(line) for line in
             (tmp_path / "runs" / "my_authors_eval" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["task"], r["step"]) for r in lines] == [("my_authors", 20)]
    assert set(lines[0]) >= {"accuracy", "macro_f1"}
    predictions = [json.loads(line) for line in (
        tmp_path / "runs" / "my_authors_eval" / "predictions" / "my_authors" /
        "step_20.jsonl").read_text().splitlines()]
    assert len(predictions) == 8  # every held-out record, once
    assert all(p["options"] == ["austen", "shakespeare"] and len(p["option_scores"]) == 2
               for p in predictions)


@pytest.mark.slow
def test_the_harness_example_runs_as_printed(tmp_path):
    """docs/evaluation.md's lm-evaluation-harness example: training a small decoder, the
    harness command on data/lm_eval's tagged suite, and the page's Python block through
    lm-eval's own simple_evaluate (only `runs/` becomes a temporary folder)."""
    page = (REPO / "docs" / "evaluation.md").read_text()
    section = page[page.index("## lm-evaluation-harness on our checkpoints"):]
    section = section[:section.index("\n## ", 1)]
    commands = _shell_lines(_fenced_blocks(section, "sh")[0])
    assert [shlex.split(c)[2] for c in commands] == ["t5x_like.train", "t5x_like.harness"]
    for command in commands:
        argv = [sys.executable if word == ".venv/bin/python" else
                word.replace("runs/", f"{tmp_path}/runs/") for word in shlex.split(command)]
        result = _run(argv, env=_env(), timeout=900)
        assert result.returncode == 0, (command, result.stderr[-3000:])
        assert "Traceback" not in result.stderr, (command, result.stderr[-3000:])
    assert "austen_cloze_generate" in result.stdout and "bits_per_byte" in result.stdout
    results = json.loads((tmp_path / "runs" / "gpt2_harness_eval" / "results.json")
                         .read_text())["results"]
    assert set(results) == {"austen_cloze", "austen_cloze_generate", "austen_perplexity"}
    assert 0 < results["austen_perplexity"]["byte_perplexity,none"] < 256
    code = _fenced_blocks(section, "python")[0].replace("runs/", f"{tmp_path}/runs/")
    result = _run([sys.executable, "-c", code], env=_env(), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = eval(result.stdout.strip().splitlines()[-1], {"np": __import__("numpy")})
    assert printed["acc,none"] == pytest.approx(results["austen_cloze"]["acc,none"])


def _documented_commands() -> list[list[str]]:
    """``[module, subcommand?]`` of every ``python -m ...`` the README and docs/ show."""
    found = set()
    pattern = re.compile(r"python3? -m ((?:t5x_like(?:\.\w+)+)|launch)(?: ([a-z_][a-z_-]*))?")
    for page in DOCS:
        for module, sub in pattern.findall(page.read_text()):
            found.add((module, sub))
    return [[m, s] if s else [m] for m, s in sorted(found)]


def test_the_docs_show_the_commands_this_test_checks():
    modules = {c[0] for c in _documented_commands()}
    assert {"t5x_like.train", "t5x_like.eval", "t5x_like.infer", "t5x_like.plan", "launch",
            "t5x_like.convert", "t5x_like.tasks", "t5x_like.peft"} <= modules


@pytest.mark.slow
def test_every_documented_command_answers_help_without_a_traceback():
    def help_of(command):
        return command, _run([sys.executable, "-m", *command, "--help"], env=_env(),
                             timeout=300)
    with futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(help_of, _documented_commands()))
    for command, result in results:
        assert result.returncode == 0, (command, result.stderr[-2000:])
        assert "Traceback" not in result.stderr, (command, result.stderr[-2000:])
        assert "usage:" in result.stdout, (command, result.stdout[-500:])


def test_every_command_of_the_readme_table_is_a_t5xl_command():
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("## Commands"):readme.index("## Layout")]
    names = {cell.split()[0] for row in table.splitlines() if row.startswith("| `")
             for cell in re.findall(r"`([^`]+)`", row.split("|")[1])
             if not cell.startswith("python")}
    assert names and names <= set(cli.COMMANDS), names - set(cli.COMMANDS)


def _outside_code(text: str) -> str:
    """The page without fenced code blocks and inline code spans (links there are code)."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading (github-slugger): the rendered text lowercased,
    punctuation and symbols dropped (letters, digits, ``_``, ``-`` and spaces stay), each
    space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"\*+", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's slug (a repeated one gets -1, -2, ... as on GitHub) and HTML ids."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", page.read_text(), flags=re.S | re.M)
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6}[ \t]+(.*?)[ \t#]*$", text, flags=re.M):
        slug = github_slug(heading)
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found | set(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))


def test_github_slugs_follow_githubs_rules():
    assert github_slug("Does pretraining help? One recipe on 2 CPU cores") == \
        "does-pretraining-help-one-recipe-on-2-cpu-cores"
    assert github_slug("`t5xl plan`: before launch") == "t5xl-plan-before-launch"
    assert github_slug("Routing & dispatch (top-k)") == "routing--dispatch-top-k"
    assert github_slug("[Models](models.md) and __init__") == "models-and-__init__"


def test_every_relative_link_in_the_readme_and_docs_resolves():
    """Markdown links ``[text](path)``, ``[text](path#anchor)`` and ``[text](#anchor)`` in
    README.md and docs/*.md: the file (or folder) exists, and an anchor into a .md page
    names one of its headings by GitHub's slug rules; a repository file a code span names
    exists."""
    broken = []
    for page in DOCS:
        for target in re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)",
                                 _outside_code(page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}: ({target})"
            if not file.exists():
                broken.append(f"{where}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{where}: no heading with that anchor in {file.name}")
        # Repository files named in code spans (`t5x_like/train.py`) exist too.
        for path in re.findall(r"`((?:t5x_like|launch|tests|benchmarks|configs)/[\w./-]+\.(?:py|md|txt|json))"
                               r"(?:::[\w\[\]-]+)?`", page.read_text()):
            if not (REPO / path).exists():
                broken.append(f"{page.relative_to(REPO)}: `{path}`: no such file")
    assert not broken, "\n".join(broken)
