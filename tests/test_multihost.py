"""Multi-process runs: how a process decides to join, and a real 2-process run
over loopback against one process with the same 8 devices."""

import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from t5x_like import resolving, train
from t5x_like.engine import partitioning
from t5x_like.resilience.workdir_lock import pid_alive

REPO = pathlib.Path(__file__).resolve().parents[1]
NO_CLUSTER = lambda: None  # noqa: E731


def test_single_process_when_nothing_says_otherwise():
    assert partitioning.distributed_settings(environ={}, detect_cluster=NO_CLUSTER) is None


def test_flags_give_an_explicit_setup():
    settings = partitioning.distributed_settings("10.0.0.1:8476", 4, 3, environ={},
                                                 detect_cluster=NO_CLUSTER)
    assert settings == partitioning.DistributedSettings("10.0.0.1:8476", 4, 3)


def test_environment_gives_the_setup_and_flags_override_it():
    environ = {partitioning.ENV_COORDINATOR: "host:1234", partitioning.ENV_NUM_PROCESSES: "2",
               partitioning.ENV_PROCESS_ID: "1"}
    assert partitioning.distributed_settings(environ=environ).process_id == 1
    assert partitioning.distributed_settings(process_id=0, environ=environ).process_id == 0


def test_a_detected_cluster_lets_jax_read_it():
    settings = partitioning.distributed_settings(environ={}, detect_cluster=lambda: "GceTpuCluster")
    assert settings.coordinator_address is None and settings.detected == "GceTpuCluster"


def test_cluster_detection_skips_opt_in_clusters_as_jax_does(monkeypatch):
    from jax._src import clusters

    def cluster(name, present, opt_in):
        return type(name, (), {"opt_in_only_method": opt_in,
                               "is_env_present": staticmethod(lambda: present)})
    # mpi4py installed on a single GPU box: "present", but JAX joins it only when asked.
    monkeypatch.setattr(clusters.ClusterEnv, "_cluster_types",
                        [cluster("Mpi4pyCluster", True, True), cluster("SlurmCluster", False, False)])
    assert partitioning.detected_cluster() is None
    monkeypatch.setattr(clusters.ClusterEnv, "_cluster_types",
                        [cluster("Mpi4pyCluster", True, True), cluster("SlurmCluster", True, False)])
    assert partitioning.detected_cluster() == "SlurmCluster"


@pytest.mark.parametrize("kwargs, message", [
    (dict(coordinator_address="h:1"), r"incomplete: got \['coordinator_address'\], missing "
                                      r"\['num_processes', 'process_id'\]"),
    (dict(coordinator_address="h:1", num_processes=2, process_id=2), r"process_id=2 must be in"),
    (dict(coordinator_address="h", num_processes=2, process_id=0), "needs a port"),
])
def test_bad_multi_process_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        partitioning.distributed_settings(**kwargs, environ={}, detect_cluster=NO_CLUSTER)


def test_local_processes_keep_the_callers_xla_flags_with_their_own_device_count():
    from t5x_like import launch_local
    env = launch_local.process_env(
        {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_dump_to=/tmp/d"},
        1, 2, 4, 1234)
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/d --xla_force_host_platform_device_count=4"
    assert launch_local.process_env({}, 0, 2, 2, 1)["XLA_FLAGS"] == (
        "--xla_force_host_platform_device_count=2")


def test_cli_reports_incomplete_multi_process_flags(tmp_path):
    result = subprocess.run([sys.executable, "-m", "t5x_like.train",
                             "--config=configs/quickstart.py", f"--workdir={tmp_path}",
                             "--num_processes=2"], cwd=REPO, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu",
                                 "PYTHONPATH": str(REPO)}, timeout=120)
    assert result.returncode == 2
    assert "Multi-process setup error" in result.stderr and "missing" in result.stderr


TINY = ["--config.model.d_model=32", "--config.model.d_ff=64", "--config.model.num_heads=2",
        "--config.model.head_dim=16", "--config.model.num_encoder_layers=1",
        "--config.model.num_decoder_layers=1", "--config.batch_size=16",
        "--config.task_feature_lengths.inputs=32", "--config.task_feature_lengths.targets=8",
        "--config.eval_batches=1", "--config.log_every_steps=1",
        "--config.checkpoint_every_steps=2", "--config.eval_every_steps=100",
        "--config.mesh.data=2", "--config.mesh.fsdp=4"]
# data_streams is left at its default: 8 streams for a batch of 16 on 1 process and on 2,
# hence the same batches, while each process reads only its 4 streams.


SLEEPER = """
import os, pathlib, sys, time
pathlib.Path(sys.argv[1], str(os.getpid())).touch()
time.sleep(600)
"""


def test_the_local_launchers_processes_die_with_it(tmp_path):
    """``kill -9`` of launch_local (what a test's timeout does to it) takes its processes
    with it: left running, two trainers of a killed rehearsal would train on for the rest
    of the run, slowing every test after it."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    started = tmp_path / "started"
    started.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "t5x_like.launch_local", "--num_processes=2",
         "--devices_per_process=1", "--module=sleeper", "--", str(started)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    pids = []
    try:
        deadline = time.monotonic() + 60
        while len(pids) < 2:
            assert launcher.poll() is None, launcher.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the processes never started"
            time.sleep(0.05)
            pids = [int(p.name) for p in started.iterdir()]
        launcher.kill()
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(map(pid_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in pids if pid_alive(pid)], "processes outlived their launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _losses(workdir) -> dict[int, float]:
    lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


@pytest.mark.slow
def test_two_processes_of_four_devices_match_one_process_of_eight(tmp_path):
    """Also covers orbax saving and restoring across processes: the 2-process run
    stops at step 4 and a second launch resumes it to step 6."""
    config_args = ["--config=configs/quickstart.py", f"--workdir={tmp_path / 'two'}", *TINY]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for steps, resumed in ((4, False), (6, True)):
        result = subprocess.run(
            [sys.executable, "-m", "t5x_like.launch_local", "--num_processes=2",
             "--devices_per_process=4", "--timeout_s=240", "--", *config_args,
             f"--config.num_train_steps={steps}"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        assert ("Resumed from" in result.stderr) == resumed
        assert "[p1] step" not in result.stderr  # only process 0 reports progress
    steps = [json.loads(line)["step"]
             for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 7))  # one writer: no step logged twice

    config = resolving.load_and_validate(str(REPO / "configs" / "quickstart.py"),
                                     [a[len("--config."):] for a in TINY] + ["num_train_steps=6"])
    train.run(config, str(tmp_path / "one"), quiet=True)
    two, one = _losses(tmp_path / "two"), _losses(tmp_path / "one")
    assert sorted(two) == list(range(1, 7))
    np.testing.assert_allclose([two[s] for s in range(1, 7)], [one[s] for s in range(1, 7)],
                               rtol=1e-5)


@pytest.mark.slow
def test_eval_of_two_processes_equals_one_process(tmp_path):
    """eval on 2 processes x 4 devices (params sharded over both, each process
    converting only the rows its devices hold) writes what one process of 8 devices
    writes: metrics, greedy predictions, and every score of rank classification."""
    config = resolving.load_and_validate(str(REPO / "configs" / "quickstart.py"),
                                     [a[len("--config."):] for a in TINY]
                                     + ["num_train_steps=2"])
    train.run(config, str(tmp_path / "run"), quiet=True)
    eval_args = [f"--checkpoint={tmp_path / 'run'}", "--mixture=embedded_bench",
                 "--max_examples=8", "--batch_size=8", "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-m", "t5x_like.launch_local", "--num_processes=2",
         "--devices_per_process=4", "--timeout_s=240", "--module=t5x_like.eval", "--",
         *[a for a in eval_args if a != "--quiet"], f"--output_dir={tmp_path / 'two'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    made = dict(map(int, pair) for pair in re.findall(
        r"process (\d) of 2: converted (\d+) model rows", result.stdout + result.stderr))
    # The batch is split over both processes' devices: each converts about half of the
    # rows (plus each batch's first row, which gives the arrays their shapes).
    assert set(made) == {0, 1} and all(n < 0.6 * sum(made.values()) for n in made.values())
    from t5x_like import eval as eval_cli
    assert eval_cli.main([*eval_args, f"--output_dir={tmp_path / 'one'}"]) == 0

    def records(folder):
        return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    one, two = records(tmp_path / "one"), records(tmp_path / "two")
    assert len(one) == len(two) == 6  # one line per task, written once
    for a, b in zip(one, two, strict=False):
        assert a.keys() == b.keys() and a["task"] == b["task"]
        for key in a:
            if isinstance(a[key], float):
                np.testing.assert_allclose(b[key], a[key], rtol=1e-5, err_msg=key)
    for path in sorted((tmp_path / "one" / "predictions").rglob("*.jsonl")):
        mirror = tmp_path / "two" / path.relative_to(tmp_path / "one")
        ours = [json.loads(line) for line in path.read_text().splitlines()]
        theirs = [json.loads(line) for line in mirror.read_text().splitlines()]
        assert [r.get("prediction") for r in ours] == [r.get("prediction") for r in theirs]
        for a, b in zip(ours, theirs, strict=True):
            np.testing.assert_allclose(b.get("option_scores", b.get("score", 0.0)),
                                       a.get("option_scores", a.get("score", 0.0)), rtol=1e-5)
    assert any("option_scores" in json.loads(line) for path in
               (tmp_path / "one" / "predictions").rglob("*.jsonl")
               for line in path.read_text().splitlines())


@pytest.mark.slow
def test_two_processes_fall_back_together_past_a_damaged_step(tmp_path):
    """The array data process 1 wrote for the newest step is truncated and the step has
    no manifest (a checkpoint from before manifests): only process 1's read fails (each
    reads its own shards), yet the processes keep their collectives in step, agree that
    the step is damaged, process 0 moves it aside, and both resume from the previous
    step. (Before Checkpointer._restore_in_step, gloo aborted both processes.)"""
    # FSDP over all 8 devices: each process writes the array data of its own shards (on
    # data=2 every small array is a replica, written whole by process 0 alone).
    config_args = ["--config=configs/quickstart.py", f"--workdir={tmp_path}",
                   *[a for a in TINY if not a.startswith("--config.mesh.")],
                   "--config.mesh.data=1", "--config.mesh.fsdp=8"]
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def launch(steps):
        return subprocess.run(
            [sys.executable, "-m", "t5x_like.launch_local", "--num_processes=2",
             "--devices_per_process=4", "--timeout_s=240", "--", *config_args,
             f"--config.num_train_steps={steps}"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)

    first = launch(4)
    assert first.returncode == 0, first.stderr[-3000:]
    newest = tmp_path / "checkpoints" / "4"
    (newest / "manifest.t5x_like.json").unlink()
    chunks = sorted(newest.glob("state/ocdbt.process_1/d/*"))
    assert chunks
    for chunk in chunks:  # the array data process 1 wrote
        chunk.write_bytes(chunk.read_bytes()[:16])
    second = launch(6)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming from step 2" in second.stderr and "at step 2." in second.stderr
    assert (tmp_path / "damaged_checkpoints" / "4" / "state").is_dir()
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()
                  if p.name.isdigit())[-1] == 6


REWARD_MODULE = '''import zlib

from t5x_like.metrics.rewards import RewardRegistry


def text_score(completions, examples):
    """A dense reward: 0 to 1 by the completion's CRC (sampled completions differ)."""
    return [zlib.crc32(c.encode()) % 5 / 4 for c in completions]


RewardRegistry.add("text_score", text_score)
'''
SHARED_RL = ["model.num_layers=1", "batch_size=16", "rl.temperature=1.5",
             "rl.rewards=('text_score', 'exact_answer')", "evals.held_out.every_steps=100",
             "checkpoint.every_steps=100", "logging.every_steps=1"]
# Per algorithm: its config, overrides, and the logged keys the processes must agree on.
RL_RUNS = {
    "grpo": ("gpt2_tiny_grpo_arithmetic.py",
             [*SHARED_RL, "rl.num_generations=4", "rl.dynamic_sampling_rounds=1"],
             ("loss", "reward", "rewards/text_score", "completion_length",
              "groups_without_signal", "sampling_rounds", "kl", "grad_norm")),
    # PPO's advantages are whitened over the whole batch: every process's rows.
    "ppo": ("gpt2_tiny_ppo_arithmetic.py", [*SHARED_RL, "rl.iterations=1"],
            ("loss", "policy_loss", "value_loss", "reward", "rewards/text_score", "kl",
             "scores", "completion_length", "grad_norm")),
}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", list(RL_RUNS))
def test_rl_on_two_processes_equals_one_and_resumes_across_them(tmp_path, monkeypatch,
                                                                algorithm):
    """Online RL over processes: rollouts sampled on the whole mesh, each process scoring
    its own rows (GRPO: grouping them, dynamic sampling's rounds agreed between them; PPO:
    the advantages whitened over every process's rows). From a short SFT run: 2 steps on
    2 processes x 4 devices, resumed to step 3 on 1 process of 8, logs what 3 steps on 1
    process log (loss, rewards, rounds)."""
    config_name, rl_overrides, keys = RL_RUNS[algorithm]
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "grpo_rewards.py").write_text(REWARD_MODULE)
    import grpo_rewards  # noqa: F401  (registers the reward in this process)

    sft = tmp_path / "sft"
    train.run(resolving.load_and_validate(
        str(REPO / "configs" / "finetune" / "gpt2_tiny_arithmetic_sft.py"),
        ["model.num_layers=1", "batch_size=16", "num_train_steps=2"]), str(sft), quiet=True)
    grpo = str(REPO / "configs" / "rl" / config_name)
    overrides = [*rl_overrides, f"init_from={sft}"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path)]))
    result = subprocess.run(
        [sys.executable, "-m", "t5x_like.launch_local", "--num_processes=2",
         "--devices_per_process=4", "--timeout_s=240", "--", f"--config={grpo}",
         f"--workdir={tmp_path / 'across'}", "--module=grpo_rewards",
         *[f"--config.{o}" for o in overrides], "--config.num_train_steps=2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    train.run(resolving.load_and_validate(grpo, [*overrides, "num_train_steps=3"]),
              str(tmp_path / "across"), quiet=True)
    train.run(resolving.load_and_validate(grpo, [*overrides, "num_train_steps=3"]),
              str(tmp_path / "one"), quiet=True)

    def records(name):
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]
    across, one = records("across"), records("one")
    assert [r["step"] for r in across] == [r["step"] for r in one] == [1, 2, 3]
    # The held-out rollouts at the 2-process run's last step count both processes' prompts.
    assert across[1]["eval_prompts"] == one[-1]["eval_prompts"] == 128
    assert all(0 < r["rewards/text_score"] < 1 and r.get("groups_without_signal", 0) < 1
               for r in one)
    assert all(r["grad_norm"] > 0 for r in one)
    for key in keys:
        # GRPO's loss at a ratio of 1 is minus the mean advantage, 0 up to rounding: atol
        np.testing.assert_allclose([r[key] for r in across], [r[key] for r in one],
                                   rtol=1e-5, atol=1e-6, err_msg=key)
