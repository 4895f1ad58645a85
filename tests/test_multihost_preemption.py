"""Preemption of a real 2-process run: SIGTERM reaching one process only (the worker,
not the chief) must still make both save the same step and exit 0, and the saved
checkpoint must resume."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
ARGS = ["--config=configs/quickstart.py", "--config.model.d_model=32", "--config.model.d_ff=64",
        "--config.model.num_heads=2", "--config.model.head_dim=16",
        "--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
        "--config.batch_size=16", "--config.task_feature_lengths.inputs=32",
        "--config.task_feature_lengths.targets=8", "--config.eval_batches=1",
        "--config.log_every_steps=1", "--config.checkpoint_every_steps=10000",
        "--config.eval_every_steps=10000", "--config.mesh.data=2", "--config.mesh.fsdp=4"]


def _children_by_process_id(parent: int) -> dict[int, int]:
    """{T5X_LIKE_PROCESS_ID: pid} of launch_local's workers, read from /proc."""
    found = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # the process ended while we looked
            continue
        for item in environ:
            if item.startswith(b"T5X_LIKE_PROCESS_ID="):
                found[int(item.split(b"=", 1)[1])] = int(entry.name)
    return found


def _logged_steps(workdir: pathlib.Path) -> list[int]:
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.skipif(not pathlib.Path("/proc/self/environ").exists(), reason="needs /proc")
def test_sigterm_to_one_worker_saves_one_step_on_every_process_and_resumes(tmp_path):
    workdir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "t5x_like.launch_local", "--num_processes=2",
         "--devices_per_process=4", "--timeout_s=300", "--", *ARGS, f"--workdir={workdir}",
         "--config.num_train_steps=100000"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while len(_logged_steps(workdir)) < 2:
            assert launcher.poll() is None, launcher.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the run never got past step 2"
            time.sleep(0.2)
        workers = _children_by_process_id(launcher.pid)
        assert sorted(workers) == [0, 1]
        os.kill(workers[1], signal.SIGTERM)  # the chief is not told
        _, stderr = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, stderr[-3000:]
    saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert len(saved) == 1, saved
    step = saved[0]
    # Both processes stopped at the same step (a save needs every process; they exited
    # 0), and the chief, the only one that reports, said so.
    assert f"SIGTERM received: saved a checkpoint at step {step}, exiting." in stderr
    assert _logged_steps(workdir)[-1] == step

    resumed = subprocess.run(
        [sys.executable, "-m", "t5x_like.launch_local", "--num_processes=2",
         "--devices_per_process=4", "--timeout_s=240", "--", *ARGS, f"--workdir={workdir}",
         f"--config.num_train_steps={step + 2}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at step {step}" in resumed.stderr and "Resumed from" in resumed.stderr
    assert _logged_steps(workdir)[-2:] == [step + 1, step + 2]
