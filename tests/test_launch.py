"""The cluster launchers (launch/): golden dry runs, and the failure cases against a fake
``gcloud`` (and ``xpk``, ``sbatch``) first on PATH.

The fake gcloud records its argv, answers ``queued-resources describe`` from a scripted
list of states, and runs each ssh ``--command`` for real with ``bash`` in a folder that
stands for that worker's home, so setup, run, status and stop execute the very scripts a
TPU VM would. A fake ``uv`` makes the workers' venv, whose ``python`` only records its
argv and sleeps: that is the "training process".

Regenerate the golden files after an intended change: UPDATE_GOLDEN=1 pytest tests/test_launch.py
"""

import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time

import pytest

from launch import __main__ as launcher
from launch import accelerators
from launch.commands import Command
from t5x_like import cli

# Snapshots of our own dry runs (no independent source holds these transcripts); the fake
# gcloud/xpk/sbatch tests below run the same scripts for real.
GOLDEN_DIR = pathlib.Path(__file__).parent / "golden" / "launch"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "https://github.com/example/t5x_like.git"

V5E = ["--name=t5-v5e", "--project=my-project", "--zone=us-west4-a",
       "--accelerator_type=v5litepod-16"]
V5P = ["--name=t5-v5p", "--project=my-project", "--zone=us-east5-a",
       "--accelerator_type=v5p-64", "--node_count=2"]
GKE = ["--cluster=tpu-cluster", "--workload=t5-2x-v5p", "--project=my-project",
       "--zone=us-east5-a"]
TRAIN = ["--config=configs/t5_1_1_base.py"]

GOLDENS = {
    "tpu_v5e_16_single_slice.txt": [
        ["tpu", "create", *V5E, "--spot"],
        ["tpu", "setup", *V5E, f"--commit={COMMIT}", f"--repo={REPO}"],
        ["tpu", "run", *V5E, *TRAIN, "--workdir=gs://my-bucket/runs/t5-v5e",
         "--env=TPU_STDERR_LOG_LEVEL=2", "--", "--config.batch_size=256"],
        ["tpu", "status", *V5E],
        ["tpu", "logs", *V5E, "--worker=3", "--follow"],
        ["tpu", "stop", *V5E],
        ["tpu", "delete", *V5E],
    ],
    "tpu_2x_v5p_64_multislice.txt": [
        ["tpu", "create", *V5P, "--reserved"],
        ["tpu", "setup", *V5P, f"--commit={COMMIT}", f"--repo={REPO}"],
        ["tpu", "run", *V5P, *TRAIN, "--workdir=gs://my-bucket/runs/t5-v5p", "--",
         "--config.batch_size=1024"],
        ["tpu", "stop", *V5P],
        ["tpu", "delete", *V5P],
    ],
    "gke_2x_v5p_64.txt": [
        ["gke", "run", *GKE, "--tpu_type=v5p-64", "--num_slices=2", *TRAIN,
         "--workdir=gs://my-bucket/runs/t5-gke", "--max_restarts=10", "--",
         "--config.batch_size=1024"],
        ["gke", "run", *GKE, "--tpu_type=v5litepod-16", *TRAIN,
         "--workdir=gs://my-bucket/runs/t5-gke-v5e",
         "--docker_image=us-docker.pkg.dev/my-project/t5x-like/train:0123456"],
        ["gke", "status", *GKE],
        ["gke", "delete", *GKE],
    ],
    "slurm_2x8_gpus.txt": [
        ["slurm", "--nodes=2", "--gpus_per_node=8", "--partition=a3", "--time=24:00:00", *TRAIN,
         "--workdir=/shared/runs/t5", "--", "--config.batch_size=256"],
    ],
}

FAKE_GCLOUD = """#!{python} -S
import json, os, pathlib, subprocess, sys

root = pathlib.Path(os.environ["FAKE_CLOUD"])
argv = sys.argv[1:]
with open(root / "calls.jsonl", "a") as calls:
    calls.write(json.dumps(["gcloud"] + argv) + "\\n")
words = [a for a in argv if not a.startswith("-")]
flags = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
cloud = json.loads((root / "cloud.json").read_text())


def ssh(node, worker):
    if f"{{node}}/{{worker}}" in cloud.get("unreachable", []):
        print(f"ssh: connect to host 10.0.0.{{worker}} port 22: Connection timed out",
              file=sys.stderr)
        return 255
    home = root / "hosts" / f"{{node}}-w{{worker}}"
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HOME=str(home))
    return subprocess.run(["bash", "-c", flags["command"]], env=env, cwd=home).returncode


def ssh_many(nodes, worker_flag):
    workers = range(cloud["workers"]) if worker_flag == "all" else [int(worker_flag)]
    codes = [ssh(node, w) for node in nodes for w in workers]
    return next((c for c in codes if c), 0)


if words[:3] == ["compute", "tpus", "queued-resources"]:
    verb, name = words[3], words[4]
    if verb == "describe":
        states = cloud["states"]
        state = states.pop(0) if len(states) > 1 else states[0]
        (root / "cloud.json").write_text(json.dumps(cloud))
        body = {{"name": f"projects/p/locations/z/queuedResources/{{name}}",
                 "state": {{"state": state}}}}
        if state == "FAILED":
            body["state"]["failedData"] = {{"error": {{
                "code": 8, "message": "There is no more capacity in the zone"}}}}
        print(json.dumps(body))
        sys.exit(0)
    if verb == "ssh":
        sys.exit(ssh_many(cloud["nodes"], flags["worker"]))
    print(f"{{verb}} [{{name}}] done")
    sys.exit(0)
if words[:4] == ["compute", "tpus", "tpu-vm", "ssh"]:
    sys.exit(ssh_many([words[4]], flags["worker"]))
sys.exit(f"fake gcloud: unexpected {{argv}}")
"""

FAKE_RECORDER = """#!{python} -S
import json, os, pathlib, sys
root, name = pathlib.Path(os.environ["FAKE_CLOUD"]), os.path.basename(sys.argv[0])
with open(root / "calls.jsonl", "a") as calls:
    calls.write(json.dumps([name] + sys.argv[1:]) + "\\n")
(root / f"{{name}}_env.json").write_text(json.dumps(dict(os.environ)))
"""

# The workers' uv: `uv venv` makes a python that records its argv and environment, then
# sleeps (the training process; its environment is written before its argv, which
# appears whole, so a test that sees the argv reads both); `uv pip install` does nothing.
FAKE_UV = """#!/bin/sh
if [ "$1" = venv ]; then
  mkdir -p .venv/bin
  printf '#!/bin/sh\\nenv > "$HOME/train_env"\\nprintf "%%s\\\\n" "$@" > "$HOME/argv.tmp"\\nmv "$HOME/argv.tmp" "$HOME/train_argv"\\nexec sleep 60\\n' > .venv/bin/python
  chmod +x .venv/bin/python
fi
"""


def write_executable(path: pathlib.Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def cloud(tmp_path, monkeypatch):
    """A fake cloud: gcloud, xpk and sbatch first on PATH; ``cloud.set(...)`` scripts it,
    ``cloud.calls()`` is every argv they got."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_executable(bin_dir / "gcloud", FAKE_GCLOUD.format(python=sys.executable))
    for name in ("xpk", "sbatch"):
        write_executable(bin_dir / name, FAKE_RECORDER.format(python=sys.executable))
    write_executable(bin_dir / "uv", FAKE_UV)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CLOUD", str(tmp_path))

    class Cloud:
        root = tmp_path

        def set(self, states=("ACTIVE",), nodes=("t5-v5e",), workers=4, unreachable=()):
            (tmp_path / "cloud.json").write_text(json.dumps(
                {"states": list(states), "nodes": list(nodes), "workers": workers,
                 "unreachable": list(unreachable)}))

        def calls(self):
            path = tmp_path / "calls.jsonl"
            return [json.loads(line) for line in path.read_text().splitlines()] \
                if path.exists() else []

        def home(self, node, worker):
            return tmp_path / "hosts" / f"{node}-w{worker}"

    fake = Cloud()
    fake.set()
    yield fake
    for pid_file in tmp_path.glob("hosts/*/t5x_like_logs/train.pid"):
        try:  # the sleeping "training processes" these tests started
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


@pytest.fixture
def origin(tmp_path):
    """A repository the workers can clone without a network."""
    repo = tmp_path / "origin"
    repo.mkdir()
    (repo / "constraints.txt").write_text("jax==0.10.2\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com",
           "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "--quiet"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "init"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    return str(repo), commit


def launch(*argv):
    return launcher.main(list(argv))


def dry_run_transcript(invocations, capsys) -> str:
    parts = []
    for argv in invocations:
        at = argv.index("--") if "--" in argv else len(argv)
        assert launch(*argv[:at], "--dry_run", *argv[at:]) == 0
        parts.append(f"$ python -m launch {shlex.join(argv)}\n{capsys.readouterr().out}")
    return "\n".join(parts)


@pytest.mark.parametrize("golden", sorted(GOLDENS))
def test_dry_run_matches_golden(golden, capsys, cloud):
    transcript = dry_run_transcript(GOLDENS[golden], capsys)
    path = GOLDEN_DIR / golden
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(transcript)
    assert transcript == path.read_text(), f"regenerate with UPDATE_GOLDEN=1 if intended: {path}"
    assert cloud.calls() == []  # a dry run runs nothing


@pytest.mark.parametrize("golden", sorted(GOLDENS))
def test_dry_run_needs_only_the_standard_library(golden):
    """docs/launching.md: the launcher runs where the project is not installed. ``-S``
    leaves site-packages (JAX, ml_collections, this project's install) off the path, so
    any import beyond the standard library and the repository's own stdlib-only modules
    fails here."""
    repo = pathlib.Path(__file__).resolve().parents[1]
    parts = []
    for argv in GOLDENS[golden]:
        at = argv.index("--") if "--" in argv else len(argv)
        done = subprocess.run([sys.executable, "-S", "-E", "-m", "launch", *argv[:at], "--dry_run",
                               *argv[at:]], cwd=repo, capture_output=True, text=True, timeout=60,
                              env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")})
        assert done.returncode == 0, done.stderr
        parts.append(f"$ python -m launch {shlex.join(argv)}\n{done.stdout}")
    assert "\n".join(parts) == (GOLDEN_DIR / golden).read_text()


def test_dry_run_lines_are_exact_argv():
    argv = ("gcloud", "--command=set -eu; echo \"$HOME\" 'x'", "a b", "--zone=us-west4-a", "")
    assert tuple(shlex.split(Command(argv).render())) == argv
    assert Command(argv).render().startswith("gcloud --command='set -eu;")


def test_accelerator_types_give_host_counts():
    assert accelerators.parse("v5litepod-16").hosts == 4
    assert accelerators.parse("v5litepod-8").hosts == 1
    assert accelerators.parse("v5p-64").hosts == 8
    assert accelerators.parse("v4-32").hosts == 4
    assert accelerators.parse("v6e-256").hosts == 64
    assert accelerators.parse("v5p-64").default_runtime_version == "v2-alpha-tpuv5"
    assert accelerators.parse("v5litepod-16").default_runtime_version == "v2-alpha-tpuv5-lite"


def test_create_reports_a_queued_resource_that_fails_to_provision(cloud, capsys):
    cloud.set(states=["WAITING_FOR_RESOURCES", "PROVISIONING", "FAILED"])
    assert launch("tpu", "create", *V5E, "--spot", "--poll_s=0") == 1
    err = capsys.readouterr().err
    assert "t5-v5e: WAITING_FOR_RESOURCES" in err and "t5-v5e: PROVISIONING" in err
    assert "Queued resource t5-v5e FAILED" in err
    assert "There is no more capacity in the zone" in err
    assert "python -m launch tpu delete --name=t5-v5e" in err
    calls = cloud.calls()
    assert calls[0][:5] == ["gcloud", "compute", "tpus", "queued-resources", "create"]
    assert "--spot" in calls[0] and "--accelerator-type=v5litepod-16" in calls[0]
    assert sum("describe" in c for c in calls) == 3


def test_create_waits_until_active(cloud, capsys):
    cloud.set(states=["WAITING_FOR_RESOURCES", "ACTIVE"])
    assert launch("tpu", "create", *V5E, "--poll_s=0") == 0
    assert "t5-v5e: ACTIVE" in capsys.readouterr().err


@pytest.mark.parametrize("state", ["SUSPENDING", "SUSPENDED"])
def test_status_reports_a_preempted_queued_resource(cloud, capsys, state):
    cloud.set(states=[state])
    assert launch("tpu", "status", *V5E) == 1
    captured = capsys.readouterr()
    assert f"queued resource t5-v5e: {state} (preempted" in captured.out
    assert "checkpoints in the workdir survive" in captured.err
    assert not any("ssh" in c for c in cloud.calls())  # gone VMs are not contacted


def test_a_slice_preempted_after_it_was_active_is_reported(cloud, capsys):
    cloud.set(states=["PROVISIONING", "ACTIVE", "SUSPENDED"])
    assert launch("tpu", "create", *V5E, "--spot", "--poll_s=0") == 0
    capsys.readouterr()
    assert launch("tpu", "status", *V5E) == 1
    assert "SUSPENDED (preempted (or deleted): its TPU VMs are gone)" in capsys.readouterr().out
    assert launch("tpu", "run", *V5E, *TRAIN, "--workdir=gs://b/r") == 1
    assert "Queued resource t5-v5e is SUSPENDED" in capsys.readouterr().err
    assert not any("ssh" in c for c in cloud.calls())


def test_setup_names_the_one_worker_ssh_fails_on(cloud, origin, capsys):
    repo, commit = origin
    cloud.set(unreachable=["t5-v5e/2"])
    assert launch("tpu", "setup", *V5E, f"--commit={commit}", f"--repo={repo}") == 1
    err = capsys.readouterr().err
    assert "worker 2: FAILED (exit 255)" in err
    assert "Connection timed out" in err
    assert "setup failed on worker 2 (1 of 4)" in err
    for worker in (0, 1, 3):
        assert f"worker {worker}: ok" in err
        checkout = cloud.home("t5-v5e", worker) / "t5x_like"
        assert (checkout / ".venv" / "bin" / "python").exists()
        head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
        assert head == commit
    ssh_calls = [c for c in cloud.calls() if "ssh" in c]
    assert sorted(c[c.index("--zone=us-west4-a") + 1] for c in ssh_calls) == \
        [f"--worker={w}" for w in range(4)]


def test_setup_refuses_a_commit_the_repository_lacks(cloud, origin, capsys):
    repo, _ = origin
    assert launch("tpu", "setup", *V5E, f"--commit={COMMIT}", f"--repo={repo}") == 1
    assert f"commit {COMMIT} is not in {repo}: push it" in capsys.readouterr().err


def test_run_starts_everywhere_and_a_second_run_is_refused(cloud, origin, capfd):
    repo, commit = origin
    assert launch("tpu", "setup", *V5E, f"--commit={commit}", f"--repo={repo}") == 0
    assert launch("tpu", "run", *V5E, *TRAIN, "--workdir=gs://b/runs/t5", "--env=A_FLAG=x y",
                  "--", "--config.batch_size=256") == 0
    capfd.readouterr()
    for worker in range(4):
        home = cloud.home("t5-v5e", worker)
        deadline = time.monotonic() + 5
        while not (home / "train_argv").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (home / "train_argv").read_text().splitlines() == [
            "-m", "t5x_like.train", "--config=configs/t5_1_1_base.py",
            "--workdir=gs://b/runs/t5", "--config.batch_size=256"]
        env = (home / "train_env").read_text().splitlines()
        assert "PYTHONUNBUFFERED=1" in env and "A_FLAG=x y" in env
    starts = [c for c in cloud.calls() if "--worker=all" in c]
    assert len(starts) == 1

    assert launch("tpu", "run", *V5E, *TRAIN, "--workdir=gs://b/runs/t5") == 2
    err = capfd.readouterr().err
    assert "Refused: a run is already live on worker 0 (pid " in err
    assert "worker 3 (pid " in err and "python -m launch tpu stop" in err
    assert len([c for c in cloud.calls() if "--worker=all" in c]) == 1  # nothing started

    assert launch("tpu", "status", *V5E) == 0
    out = capfd.readouterr().out
    assert out.count(": training (pid ") == 4

    assert launch("tpu", "logs", *V5E, "--worker=1") == 0
    assert "=== started " in capfd.readouterr().out

    assert launch("tpu", "setup", *V5E, f"--commit={commit}", f"--repo={repo}") == 1
    assert "a run is live on" in capfd.readouterr().err  # setup keeps its code unchanged

    assert launch("tpu", "stop", *V5E) == 0
    assert capfd.readouterr().out.count("sent SIGTERM to pid") == 4


def test_run_refuses_workers_that_are_not_set_up(cloud, capsys):
    assert launch("tpu", "run", *V5E, *TRAIN, "--workdir=gs://b/r") == 2
    err = capsys.readouterr().err
    assert "t5x_like is not installed on worker 0, worker 1, worker 2, worker 3" in err
    assert not any("--worker=all" in c for c in cloud.calls())


def test_run_refuses_to_start_when_a_worker_is_unreachable(cloud, capsys):
    cloud.set(unreachable=["t5-v5e/1"])
    assert launch("tpu", "run", *V5E, *TRAIN, "--workdir=gs://b/r") == 1
    err = capsys.readouterr().err
    assert "worker 1: FAILED (exit 255)" in err
    assert "checking the workers failed on worker 1 (1 of 4)" in err
    assert "Nothing was started" in err
    assert not any("--worker=all" in c for c in cloud.calls())


def test_status_names_a_worker_whose_process_died(cloud, origin, capsys):
    repo, commit = origin
    assert launch("tpu", "setup", *V5E, f"--commit={commit}", f"--repo={repo}") == 0
    assert launch("tpu", "run", *V5E, *TRAIN, "--workdir=gs://b/r") == 0
    pid_file = cloud.home("t5-v5e", 2) / "t5x_like_logs" / "train.pid"
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    pid_file.write_text("999999999\n")  # a pid no process has
    capsys.readouterr()
    assert launch("tpu", "status", *V5E) == 1
    captured = capsys.readouterr()
    assert "worker 2: no live run" in captured.out
    assert "no live process on worker 2 while 3 workers still train" in captured.err


def test_multislice_run_addresses_every_node(cloud, capsys):
    slices = ["--name=t5-v5p", "--zone=us-east5-a", "--accelerator_type=v5p-16", "--node_count=2"]
    cloud.set(nodes=["t5-v5p-0", "t5-v5p-1"], workers=2)
    for node in ("t5-v5p-0", "t5-v5p-1"):
        for worker in range(2):  # as setup leaves them
            venv = cloud.home(node, worker) / "t5x_like" / ".venv" / "bin"
            venv.mkdir(parents=True)
            write_executable(venv / "python", "#!/bin/sh\nexit 0\n")
    assert launch("tpu", "run", *slices, *TRAIN, "--workdir=gs://b/r") == 0
    calls = cloud.calls()
    checks = [c for c in calls if c[3] == "tpu-vm"]
    assert sorted((c[5], c[7]) for c in checks) == [
        (node, f"--worker={w}") for node in ("t5-v5p-0", "t5-v5p-1") for w in (0, 1)]
    start = [c for c in calls if c[3] == "queued-resources" and c[4] == "ssh"]
    assert len(start) == 1 and "--node=all" in start[0] and "--worker=all" in start[0]
    assert "--config.mesh.dcn=0" in start[0][-1]
    for node in ("t5-v5p-0", "t5-v5p-1"):
        for worker in range(2):
            assert (cloud.home(node, worker) / "t5x_like_logs" / "train.pid").exists()


def test_gke_runs_the_dry_run_command(cloud, capsys, monkeypatch):
    monkeypatch.chdir(pathlib.Path(launcher.__file__).resolve().parents[1])
    argv = ["gke", "run", *GKE, "--tpu_type=v5p-64", "--num_slices=2", *TRAIN,
            "--workdir=gs://b/r"]
    assert launch(*argv, "--dry_run") == 0
    printed = [line for line in capsys.readouterr().out.splitlines()
               if not line.startswith("#")]
    assert launch(*argv) == 0
    assert cloud.calls() == [shlex.split(printed[0])]


def test_slurm_writes_the_script_and_submits_it(cloud, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(pathlib.Path(launcher.__file__).resolve().parents[1])
    script = tmp_path / "job.sbatch"
    assert launch("slurm", "--nodes=2", *TRAIN, "--workdir=/shared/r",
                  f"--script={script}") == 0
    text = script.read_text()
    assert "#SBATCH --ntasks-per-node=8\n#SBATCH --gpus-per-node=8" in text
    assert "srun --kill-on-bad-exit=1 env PYTHONUNBUFFERED=1 .venv/bin/python -m " \
        "t5x_like.train --config=configs/t5_1_1_base.py --workdir=/shared/r" in text
    assert cloud.calls() == [["sbatch", str(script)]]


def test_sbatch_does_not_carry_this_machines_backend_choice_to_the_gpu_nodes(
        cloud, tmp_path, monkeypatch):
    """sbatch copies the environment into the job: the JAX_PLATFORMS=cpu that importing
    t5x_like chose on a login node without GPUs must not reach the GPU nodes."""
    from t5x_like.system import platforms
    monkeypatch.chdir(pathlib.Path(launcher.__file__).resolve().parents[1])
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv(platforms.CHOSEN_MARKER, "cpu")
    assert launch("slurm", "--nodes=2", *TRAIN, "--workdir=/shared/r",
                  f"--script={tmp_path / 'job.sbatch'}") == 0
    submitted = json.loads((cloud.root / "sbatch_env.json").read_text())
    assert "JAX_PLATFORMS" not in submitted and platforms.CHOSEN_MARKER not in submitted
    monkeypatch.delenv(platforms.CHOSEN_MARKER)  # the user's own choice travels
    assert launch("slurm", "--nodes=2", *TRAIN, "--workdir=/shared/r",
                  f"--script={tmp_path / 'job.sbatch'}") == 0
    assert json.loads((cloud.root / "sbatch_env.json").read_text())["JAX_PLATFORMS"] == "cpu"


@pytest.mark.parametrize("argv, message", [
    (["tpu", "create", "--name=x", "--zone=z", "--accelerator_type=v5e-16"],
     "Cloud TPU names this type v5litepod-16; pass --accelerator_type=v5litepod-16"),
    (["tpu", "setup", "--name=x", "--zone=z", f"--commit={COMMIT}", f"--repo={REPO}"],
     "pass --accelerator_type"),
    (["tpu", "run", *V5E, "--config=configs/nope.py", "--workdir=gs://b/r"],
     "--config=configs/nope.py: no such file in this repository"),
    (["tpu", "run", *V5E, *TRAIN, "--workdir=gs://b/r", "--env=NOVALUE"],
     "--env='NOVALUE': expected NAME=VALUE"),
    (["tpu", "run", *V5E, *TRAIN, "--workdir=gs://b/r", "--", "--dry_run"],
     "--dry_run comes after `--`"),
    (["tpu", "create", "--name=x", "--zone=z", "--accelerator_type=v5p-60"],
     "a multi-host v5p slice has a multiple of 8 TensorCores"),
])
def test_bad_input_is_one_message_and_status_2(argv, message, cloud, capsys):
    assert launch(*argv, "--dry_run") == 2
    assert message in capsys.readouterr().err
    assert cloud.calls() == []


def test_t5xl_forwards_to_the_launcher(capsys):
    assert cli.main(["launch", "tpu", "delete", *V5E, "--dry_run"]) == 0
    assert "queued-resources delete t5-v5e" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["launch", "--help"])
    assert exit_info.value.code == 0
    assert "tpu" in capsys.readouterr().out
