"""Fault injection: damaged checkpoints, kill -9 mid-save, refused resumes, divergence
without NaN, and every bad input the reliability table lists (message + exit 2)."""

import functools
import json
import os
import pathlib
import random
import shlex
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config

from t5x_like import cli_flags, errors, resolving, train
from t5x_like.checkpoints import checkpoint_store
from t5x_like.errors import UserError
from t5x_like.resilience import divergence

REPO = pathlib.Path(__file__).resolve().parents[1]


# -- checkpoint damage ------------------------------------------------------------

def small_state(step: int) -> dict:
    return {"params": {"w": jnp.arange(2048, dtype=jnp.float32) + step,
                       "b": jnp.full((4, 8), float(step))},
            "opt_state": {"count": jnp.asarray(step, jnp.int32)}}


def abstract_of(state):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        state)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> pathlib.Path:
    """A workdir whose checkpoints/ holds steps 5 and 10, both sealed with manifests."""
    workdir = tmp_path_factory.mktemp("saved_run")
    checkpointer = checkpoint_store.Checkpointer(workdir / "checkpoints", keep=3)
    for step in (5, 10):
        checkpointer.save(step, small_state(step), {"position": step}, {"task": "t"})
    checkpointer.close()
    return workdir


def fresh_copy(saved_run, tmp_path) -> pathlib.Path:
    workdir = tmp_path / "run"
    shutil.copytree(saved_run, workdir)
    return workdir


def restore(workdir, log=None):
    checkpointer = checkpoint_store.Checkpointer(workdir / "checkpoints", keep=3,
                                              log=log or (lambda line: None))
    abstract = abstract_of(small_state(0))
    try:
        return checkpointer.restore_newest(lambda step: checkpointer.restore(step, abstract))
    finally:
        checkpointer.close()


def step_files(workdir, step=10) -> list[str]:
    folder = workdir / "checkpoints" / str(step)
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def file_kind(relative: str) -> str:
    """One representative per kind of file: array chunks share a kind."""
    parts = relative.split("/")
    if "d" in parts[:-1]:
        return "/".join(parts[:parts.index("d") + 1]) + "/<array data>"
    return relative


def damage(path: pathlib.Path, how: str, rng: random.Random) -> None:
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    else:  # random bytes of the same length (at least one byte differs)
        size = max(path.stat().st_size, 1)
        data = bytes(rng.getrandbits(8) for _ in range(size))
        if data == path.read_bytes():
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        path.write_bytes(data)


FAULTS = ("truncate", "random", "delete")


def kinds_of_files(saved_run) -> dict[str, str]:
    kinds = {}
    for relative in step_files(saved_run):
        kinds.setdefault(file_kind(relative), relative)
    return kinds


def test_every_kind_of_file_damaged_falls_back_to_the_previous_step(saved_run, tmp_path):
    """Each file kind x (truncate, random bytes, delete) in the newest step: the resume
    loads step 5, and step 10 is moved aside whole (never deleted). Our own manifest
    is the one file whose damage loses nothing: step 10 still restores, and is
    re-sealed."""
    kinds = kinds_of_files(saved_run)
    assert {"state/manifest.ocdbt", "config/metadata", "data/metadata", "_CHECKPOINT_METADATA",
            checkpoint_store.MANIFEST} <= set(kinds), kinds
    assert any(k.endswith("<array data>") for k in kinds)
    rng = random.Random(0)
    trials = 0
    for kind, relative in sorted(kinds.items()):
        for how in FAULTS:
            workdir = tmp_path / f"t{trials}"
            shutil.copytree(saved_run, workdir)
            damage(workdir / "checkpoints" / "10" / relative, how, rng)
            lines = []
            restored = restore(workdir, lines.append)
            trials += 1
            state, data, _ = restored.value
            if relative == checkpoint_store.MANIFEST:
                assert restored.step == 10 and not restored.moved_aside, (kind, how)
                assert checkpoint_store.has_manifest(workdir / "checkpoints" / "10")
                continue
            assert restored.step == 5, (kind, how)
            assert float(state["params"]["b"][0, 0]) == 5.0 and data == {"position": 5}
            kept = workdir / "damaged_checkpoints" / "10"
            assert kept.is_dir() and not (workdir / "checkpoints" / "10").exists(), (kind, how)
            assert (workdir / "damaged_checkpoints" / "10.reason.txt").read_text()
            assert len(lines) == 1 and "checkpoints/10" in lines[0], lines
            assert "\n" not in lines[0] and len(lines[0]) < 500
            shutil.rmtree(workdir)
    assert trials == 3 * len(kinds)


@pytest.mark.parametrize("relative, how", [
    ("state/manifest.ocdbt", "truncate"), ("data/metadata", "random"),
    ("config/metadata", "delete"), ("state/_METADATA", "truncate")])
def test_checkpoints_without_a_manifest_fall_back_on_the_restore_error(
        saved_run, tmp_path, relative, how):
    """Checkpoints from before manifests (or whose finish was cut off): the restore
    itself fails, one line names why, and the previous step loads. (Changed array
    bytes are only sure to be found through the manifest's checksums.)"""
    workdir = fresh_copy(saved_run, tmp_path)
    folder = workdir / "checkpoints" / "10"
    (folder / checkpoint_store.MANIFEST).unlink()
    damage(folder / relative, how, random.Random(1))
    lines = []
    restored = restore(workdir, lines.append)
    assert restored.step == 5
    assert restored.moved_aside[0][0] == 10 and len(lines) == 1
    assert (workdir / "damaged_checkpoints" / "10").is_dir()


@pytest.mark.parametrize("with_manifest", [True, False])
def test_a_step_with_state_but_no_data_item_falls_back(saved_run, tmp_path, with_manifest):
    """The half-copied folder of the report: state/ present, data/ gone."""
    workdir = fresh_copy(saved_run, tmp_path)
    folder = workdir / "checkpoints" / "10"
    shutil.rmtree(folder / "data")
    if not with_manifest:
        (folder / checkpoint_store.MANIFEST).unlink()
    restored = restore(workdir)
    assert restored.step == 5 and (workdir / "damaged_checkpoints" / "10" / "state").is_dir()


def test_when_no_step_restores_nothing_is_moved_and_all_are_named(saved_run, tmp_path):
    workdir = fresh_copy(saved_run, tmp_path)
    for step in (5, 10):
        (workdir / "checkpoints" / str(step) / "state" / "manifest.ocdbt").write_bytes(b"x")
    with pytest.raises(checkpoint_store.CheckpointsUnreadable) as error:
        restore(workdir)
    message = str(error.value)
    assert "checkpoints/5" in message and "checkpoints/10" in message
    assert "Nothing was moved" in message
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["10", "5"]


def test_intact_checkpoint_of_another_model_is_refused_not_moved(saved_run, tmp_path):
    workdir = fresh_copy(saved_run, tmp_path)
    checkpointer = checkpoint_store.Checkpointer(workdir / "checkpoints", keep=3)
    other = abstract_of({"params": {"w": jnp.zeros(7)}, "opt_state": {}})
    with pytest.raises(checkpoint_store.IntactButIncompatible, match="matches its manifest"):
        checkpointer.restore_newest(lambda step: checkpointer.restore(step, other))
    checkpointer.close()
    assert not (workdir / "damaged_checkpoints").exists()


def test_rotation_never_deletes_the_newest_verified_step(tmp_path):
    checkpointer = checkpoint_store.Checkpointer(tmp_path / "checkpoints", keep=2, keep_every=0)
    checkpointer._verified = {5}
    assert checkpointer.steps_to_delete([5, 10, 15, 20]) == [10]
    checkpointer._verified = {5, 20}
    assert checkpointer.steps_to_delete([5, 10, 15, 20]) == [5, 10]
    checkpointer.close()


def test_saves_are_sealed_and_rotated(tmp_path):
    checkpointer = checkpoint_store.Checkpointer(tmp_path / "checkpoints", keep=2)
    for step in (1, 2, 3, 4):
        checkpointer.save(step, small_state(step), {"position": step}, {})
    checkpointer.close()
    assert checkpointer.all_steps() == [3, 4]
    for step in (3, 4):
        folder = tmp_path / "checkpoints" / str(step)
        assert checkpoint_store.manifest_problem(folder) is None
        assert checkpoint_store.has_manifest(folder)


def _slice_programs_compiled(save) -> list[str]:
    """The on-device slice programs compiled (or read from the cache) while ``save`` runs."""
    from jax._src import compiler
    from jax._src.lib.mlir import ir
    names, original = [], compiler.compile_or_get_cached

    def recording(backend, computation, *args, **kwargs):
        names.append(ir.StringAttr(computation.operation.attributes["sym_name"]).value)
        return original(backend, computation, *args, **kwargs)
    compiler.compile_or_get_cached = recording
    try:
        save()
    finally:
        compiler.compile_or_get_cached = original
    return [name for name in names if "slice" in name]


def test_replicated_arrays_are_split_between_replicas_only_when_large(tmp_path):
    """Replica-parallel saving slices a replicated array on device, a program per shape:
    worth it for a large array (each replica writes its part), not for a bias. Replicated
    over 8 devices, small arrays are written whole (no slice program) and a 16 MiB one
    is split; every value restores."""
    mesh = jax.make_mesh((8,), ("data",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    large = jnp.arange(4 << 20, dtype=jnp.float32)  # 16 MiB: 2 MiB a replica
    for name, state in (("small", small_state(3)), ("large", {"w": large})):
        state = jax.device_put(state, replicated)
        checkpointer = checkpoint_store.Checkpointer(tmp_path / name, keep=1, async_save=False)
        sliced = _slice_programs_compiled(functools.partial(checkpointer.save, 1, state, {}, {}))
        restored, _, _ = checkpointer.restore(1, abstract_of(state))
        checkpointer.close()
        assert bool(sliced) == (name == "large"), (name, sliced)
        for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


KILL_SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax.numpy as jnp
    from t5x_like.checkpoints import checkpoint_store
    c = checkpoint_store.Checkpointer(sys.argv[1], keep=3)
    step = 0
    while True:
        step += 1
        state = {"params": {"w": jnp.full((1 << 19,), float(step))},
                 "opt_state": {"count": jnp.asarray(step, jnp.int32)}}
        c.save(step, state, {"position": step}, {"task": "t"})
        print(step, flush=True)
""")


def test_kill_9_during_async_saves_always_leaves_a_restorable_run(tmp_path):
    """SIGKILL at random moments while 2 MB states are being saved asynchronously
    (several trials): the newest step that remains restores and holds its own values."""
    rng = random.Random(3)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for trial in range(3):
        directory = tmp_path / f"trial{trial}" / "checkpoints"
        process = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(directory)],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                   env=env)
        try:
            target = rng.randint(2, 6)
            for line in process.stdout:  # wait until `target` saves were started
                if int(line) >= target:
                    break
            import time
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            process.kill()
            process.wait(timeout=60)
        checkpointer = checkpoint_store.Checkpointer(directory, keep=3)
        abstract = {"params": {"w": jax.ShapeDtypeStruct((1 << 19,), jnp.float32)},
                    "opt_state": {"count": jax.ShapeDtypeStruct((), jnp.int32)}}
        restored = checkpointer.restore_newest(
            lambda step, checkpointer=checkpointer, abstract=abstract: checkpointer.restore(step, abstract))
        checkpointer.close()
        assert restored is not None and restored.step >= 1, trial
        state, data, _ = restored.value
        assert float(state["params"]["w"][-1]) == restored.step
        assert data == {"position": restored.step}


# -- training runs: fallback, refused resumes, divergence ----------------------------

@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> pathlib.Path:
    """A tiny 10-step run with checkpoints at 5 and 10."""
    workdir = tmp_path_factory.mktemp("trained")
    train.run(tiny_config(num_train_steps=10, checkpoint_every_steps=5, eval_every_steps=10),
              str(workdir), quiet=True, devices=jax.devices()[:1])
    return workdir


def test_train_resumes_from_the_previous_step_when_the_newest_is_damaged(
        trained_run, tmp_path, capsys):
    workdir = fresh_copy(trained_run, tmp_path)
    shard = next((workdir / "checkpoints" / "10" / "state").rglob("manifest.ocdbt"))
    shard.write_bytes(shard.read_bytes()[:20])
    result = train.run(tiny_config(num_train_steps=12, checkpoint_every_steps=5,
                                   eval_every_steps=10), str(workdir), quiet=True,
                       devices=jax.devices()[:1])
    assert result["step"] == 12
    err = capsys.readouterr().err
    assert "Moved checkpoint" in err and "resuming from step 5" in err
    assert (workdir / "damaged_checkpoints" / "10").is_dir()
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [5, 10, 12]  # 10 retrained from 5, then 12


@pytest.mark.parametrize("overrides, key", [
    ({"optimizer.name": "adamw"}, "optimizer.name"),
    ({"task": "embedded_bytes_en_span_corruption"}, "vocabulary.kind"),
    ({"task_feature_lengths": {"inputs": 16, "targets": 8}}, "task_feature_lengths"),
    ({"optimizer.grad_clip_norm": 1.0}, "optimizer.state"),
    ({"model.d_ff": 128}, "model.d_ff"),
])
def test_a_resume_that_changes_the_fingerprint_is_refused_naming_the_key(
        trained_run, tmp_path, overrides, key):
    workdir = fresh_copy(trained_run, tmp_path)
    config = tiny_config(num_train_steps=12, checkpoint_every_steps=5, **overrides)
    with pytest.raises(errors.ConfigError) as error:
        train.run(config, str(workdir), quiet=True, devices=jax.devices()[:1])
    assert key in str(error.value) and "allow_resume_changes" in str(error.value)
    assert not (workdir / "damaged_checkpoints").exists()


def test_rematerialisation_may_change_on_resume(trained_run, tmp_path):
    """remat_policy changes how the step runs, not what it stores: not in the fingerprint."""
    workdir = fresh_copy(trained_run, tmp_path)
    config = tiny_config(num_train_steps=11, checkpoint_every_steps=5,
                         **{"model.remat_policy": "full"})
    assert train.run(config, str(workdir), quiet=True, devices=jax.devices()[:1])["step"] == 11


def test_an_allowed_optimizer_change_keeps_params_and_step(trained_run, tmp_path):
    workdir = fresh_copy(trained_run, tmp_path)
    config = tiny_config(num_train_steps=11, checkpoint_every_steps=5,
                         **{"optimizer.name": "adamw", "optimizer.learning_rate": 1e-3,
                            "allow_resume_changes": ("optimizer",)})
    result = train.run(config, str(workdir), quiet=True, devices=jax.devices()[:1])
    assert result["step"] == 11
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["fingerprint"]["optimizer.name"] == "adamw"


def test_adafactor_at_learning_rate_1e6_stops_instead_of_saving_a_dead_model(tmp_path):
    """The loss sits at ln(vocab) with a zero gradient and nothing is NaN: the zero-
    gradient rule stops the run, and the checkpoint saved after the model died (step 4)
    is moved aside, so a resume starts from before it."""
    config = tiny_config(num_train_steps=12, checkpoint_every_steps=4, log_every_steps=4,
                         **{"optimizer.learning_rate": 1e6})
    with pytest.raises(divergence.Diverged, match="gradient norm has been exactly 0") as error:
        train.run(config, str(tmp_path), quiet=True, devices=jax.devices()[:1])
    assert "ln(vocab_size)" in str(error.value)
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()]
    assert (tmp_path / "damaged_checkpoints" / "4").is_dir()


def test_divergence_rules():
    monitor = divergence.DivergenceMonitor(3, 0.0, 10, vocab_size=8192)
    assert monitor.check(1, 9.5, 1.0) is None
    assert monitor.check(2, 9.0109, 0.0) is None
    assert monitor.check(3, 9.0109, 0.0) is None
    reason, first = monitor.check(4, 9.0109, 0.0)
    assert first == 2 and "ln(vocab_size)" in reason
    spikes = divergence.DivergenceMonitor(0, 5.0, 10, vocab_size=100)
    assert all(spikes.check(s, 2.0 + 0.01 * s, 1.0) is None for s in range(10))
    assert spikes.check(10, 9.0, 1.0) is None  # 4.5 x the median: noise
    reason, first = spikes.check(11, 11.0, 1.0)
    assert first == 11 and "loss_spike_factor" in reason
    assert divergence.DivergenceMonitor(0, 0.0, 10, 100).check(1, 1e9, 0.0) is None  # rules off


# -- bad inputs: one message, exit 2, no traceback --------------------------------------

def cli(main, argv, capsys) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


QUICK = ["--config=configs/quickstart.py"]


@pytest.mark.parametrize("flag, expected", [
    ("--config.optimizer.learning_rate=nan",
     "'optimizer.learning_rate' must be a finite number >= 0, got nan"),
    ("--config.optimizer.learning_rate=-1", "must be a finite number >= 0"),
    ("--config.optimizer.b2=1.5", "optimizer.b2=1.5 is a decay rate"),
    ("--config.divergence.loss_spike_factor=0.5", "ordinary noise"),
    ("--config.allow_resume_changes=optimiser", "Did you mean 'optimizer'"),
    ("--config.model.family=decoder", "model.family='decoder' has no such key"),
    ("--config.task=nope", "--module=YOUR.MODULE"),
])
def test_bad_config_values_exit_2_with_one_message(tmp_path, capsys, monkeypatch, flag, expected):
    monkeypatch.chdir(REPO)
    code, err = cli(train.main, QUICK + [f"--workdir={tmp_path}", flag], capsys)
    assert code == 2 and expected in err, err


def test_workdir_that_is_a_file_or_unwritable_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    code, err = cli(train.main, QUICK + [f"--workdir={a_file}"], capsys)
    assert code == 2 and "is a file, not a folder" in err
    code, err = cli(train.main, QUICK + [f"--workdir={a_file}/sub"], capsys)
    assert code == 2 and "is a file, so the folder cannot be created" in err
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        code, err = cli(train.main, QUICK + [f"--workdir={locked}/run"], capsys)
        assert code == 2 and "cannot write" in err
    with pytest.raises(UserError, match="cannot write"):  # read-only even for root
        cli_flags.check_writable_folder("/proc/t5x_like_run")


def test_config_file_with_a_syntax_error_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("def get_config(:\n    pass\n")
    code, err = cli(train.main, [f"--config={bad}", f"--workdir={tmp_path}/run"], capsys)
    assert code == 2 and "syntax error at line 1" in err
    raises = tmp_path / "raises.py"
    raises.write_text("from t5x_like import config_lib\n\ndef get_config():\n"
                      "    c = config_lib.default_config()\n    c.no_such_key_at_all\n")
    code, err = cli(train.main, [f"--config={raises}", f"--workdir={tmp_path}/run"], capsys)
    assert code == 2 and "line 5" in err


def test_module_flag_registers_tasks(tmp_path, capsys, monkeypatch):
    (tmp_path / "my_faults_tasks.py").write_text(textwrap.dedent("""
        from t5x_like.data import dataset_providers as dp
        base = dp.get_task_or_mixture("embedded_en_span_corruption")
        dp.TaskRegistry.add("my_faults_task", base.source, base.preprocessors,
                            base.output_features)
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    cli_flags.import_modules(["my_faults_tasks"])
    config = resolving.load_and_validate(str(REPO / "configs/quickstart.py"),
                                     ["task=my_faults_task"])
    assert config.task == "my_faults_task"
    with pytest.raises(UserError, match="cannot import"):
        cli_flags.import_modules(["no_such_module_here"])


def test_printed_continue_command_round_trips_through_the_shell(tmp_path, monkeypatch):
    workdir = tmp_path / "my run $(touch pwned); echo"
    config = tiny_config()
    text = train._summary(workdir, 30, {}, {}, "configs/my config.py", config,
                          overrides=["task=embedded_en_lm", "optimizer.learning_rate=0.01"],
                          modules=["my.tasks"])
    lines = text.splitlines()
    command = lines[lines.index("  continue training (resumes from the checkpoint):") + 1]
    argv = shlex.split(command)
    assert argv[0] == cli_flags.this_python()
    assert argv[1:] == ["-m", "t5x_like.train", "--config=configs/my config.py",
                        f"--workdir={workdir}", "--module=my.tasks",
                        "--config.task=embedded_en_lm", "--config.optimizer.learning_rate=0.01",
                        f"--config.num_train_steps={config.num_train_steps * 2}"]
    board = next(line for line in lines if "TensorBoard" in line).split(None, 1)[1]
    serve = shlex.split(board.split(" && ")[-1])  # after the install when it is missing
    assert serve == [cli_flags.this_python(), "-m", "tensorboard.main", "--logdir",
                     str(workdir / "tensorboard")]
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "executable", str(REPO / ".venv" / "bin" / "python"))
    assert cli_flags.this_python() == ".venv/bin/python"


# -- convert import of damaged Hugging Face folders --------------------------------

@pytest.fixture(scope="module")
def hf_gpt2_folder(tmp_path_factory) -> pathlib.Path:
    """A tiny GPT-2 folder written by our exporter (no torch needed)."""
    import safetensors  # noqa: F401  (installed by the dev extra: a missing one must fail, not skip)

    from t5x_like.checkpoints import hf_io
    from t5x_like.convert import hf_gpt2
    from t5x_like.engine import trainer as trainer_lib
    model_config = {"family": "decoder", "vocab_size": 64, "d_model": 16, "num_heads": 2,
                    "head_dim": 8, "d_ff": 32, "num_layers": 1, "max_length": 32,
                    "mlp_activations": ("gelu",), "use_bias": True, "layer_norm_epsilon": 1e-5,
                    "dropout_rate": 0.0, "dtype": "float32"}
    shapes = trainer_lib.parameter_shapes(model_config)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: rng.normal(size=s.shape).astype(np.float32), shapes)
    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    hf_io.write_folder(folder, hf_gpt2.hf_config_from_model_config(model_config),
                       hf_gpt2.params_to_hf(params, model_config))
    return folder


def _rewrite_tensor(folder, suffix, grow_axis):
    from safetensors import numpy as st_numpy
    weights = st_numpy.load_file(str(folder / "model.safetensors"))
    name = next(k for k in weights if k.endswith(suffix))
    shape = list(weights[name].shape)
    shape[grow_axis] += 3
    weights[name] = np.zeros(shape, np.float32)
    st_numpy.save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return name


CONVERT_CASES = {
    "truncated safetensors": (
        lambda f: (f / "model.safetensors").write_bytes(
            (f / "model.safetensors").read_bytes()[:300]), "not a readable safetensors file"),
    "config.json is a list": (
        lambda f: (f / "config.json").write_text("[1, 2]"), "holds a JSON list, not an object"),
    "garbage config.json": (
        lambda f: (f / "config.json").write_text("{oops"), "config.json is not valid JSON"),
    "fused tensor too wide": (
        lambda f: _rewrite_tensor(f, "c_attn.weight", 1), "c_attn.weight' (shape (16, 51))"),
    "embedding too long": (
        lambda f: _rewrite_tensor(f, "wte.weight", 0), "wte.weight' (shape (67, 16))"),
}


@pytest.mark.parametrize("case", sorted(CONVERT_CASES))
def test_convert_import_of_a_damaged_folder_exits_2_naming_the_file(
        hf_gpt2_folder, tmp_path, capsys, case):
    from t5x_like.convert import __main__ as convert_cli
    folder = tmp_path / "hf"
    shutil.copytree(hf_gpt2_folder, folder)
    make_damage, expected = CONVERT_CASES[case]
    make_damage(folder)
    code, err = cli(convert_cli.main, ["import", f"--hf_dir={folder}", f"--out={tmp_path}/o"],
                    capsys)
    assert code == 2 and expected in err, err
    assert str(folder) in err
    assert not (tmp_path / "o").exists()


def test_convert_import_of_the_undamaged_folder_works(hf_gpt2_folder, tmp_path, capsys):
    from t5x_like.convert import __main__ as convert_cli
    code, _ = cli(convert_cli.main, ["import", f"--hf_dir={hf_gpt2_folder}",
                                     f"--out={tmp_path}/o"], capsys)
    assert code == 0 and (tmp_path / "o" / "model_config.json").is_file()


def test_an_empty_data_file_names_the_file_not_the_shard_count(tmp_path):
    from t5x_like import data as td
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    source = td.TextFilesSource(str(empty), holdout_every=3)
    with pytest.raises(ValueError) as error:
        source.shard("train", 0, 1)
    assert "has no examples" in str(error.value) and "fewer shards" not in str(error.value)
    assert str(empty) in str(error.value)


def test_eval_of_a_damaged_step_is_one_message(saved_run, tmp_path):
    """eval/infer open checkpoints read-only: a damaged step is named, never moved."""
    from t5x_like.checkpoints import param_sources
    workdir = fresh_copy(saved_run, tmp_path)
    folder = workdir / "checkpoints" / "10"
    damage(folder / "data" / "metadata", "truncate", random.Random(2))
    source = param_sources.resolve(str(workdir))
    with pytest.raises(UserError, match=r"checkpoints/10 is damaged \(data/metadata is"):
        source.restore_params(10, trainer=None)  # refused before any array is read
    (folder / checkpoint_store.MANIFEST).unlink()
    (folder / "config" / "metadata").unlink()
    with pytest.raises(UserError, match="checkpoints/10 has no readable config"):
        source.saved_config(10)
    assert folder.is_dir() and not (workdir / "damaged_checkpoints").exists()
