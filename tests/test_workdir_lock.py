"""One writer per workdir: a second train is refused naming the owner, a dead owner's
lock is taken over, heartbeats and releases, and a gs:// lock (emulator) raced by
several writers ends with exactly one owner."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import gcsfs
import pytest
from conftest import tiny_config
from storage_emulators import gcs_emulator

from t5x_like import train, workdir_lock
from t5x_like.workdir_lock import LOCK_NAME, Owner, WorkdirBusy, WorkdirLock

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = ["--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
        "--config.model.d_model=32", "--config.model.num_heads=2", "--config.model.head_dim=16",
        "--config.model.d_ff=64", "--config.batch_size=8",
        "--config.task_feature_lengths.inputs=32", "--config.task_feature_lengths.targets=8",
        "--config.eval_every_steps=0", "--config.log_every_steps=1000"]


def plant(folder, host: str, pid: int, heartbeat_age_s: float, token: str = "planted"):
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time()
    text = Owner(host, pid, now - heartbeat_age_s - 60, now - heartbeat_age_s, token).to_text()
    (folder / LOCK_NAME).write_text(text)


def test_a_live_owner_on_another_host_is_named_with_how_to_stop_it(tmp_path):
    plant(tmp_path, "pod-host-7", 4242, heartbeat_age_s=5)
    with pytest.raises(WorkdirBusy) as refused:
        WorkdirLock(tmp_path, stale_after_s=300).acquire()
    message = str(refused.value)
    assert "\n" not in message
    assert "host pod-host-7, pid 4242" in message and "`kill 4242` on pod-host-7" in message
    assert str(tmp_path / LOCK_NAME) in message
    assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == "planted"  # untouched


# Test ids must not depend on the process (pytest-xdist's workers collect them apart):
# "dead" and "self" pids are resolved inside the test.
@pytest.mark.parametrize("host, pid, age, why", [
    ("pod-host-7", 4242, 301.0, "no heartbeat for"),             # stale heartbeat, any host
    (socket.gethostname(), "dead", 0.0, "is no longer running"),  # same host, pid gone
    (socket.gethostname(), "self", 0.0, "is this process"),       # pid reused by this one
], ids=["stale-heartbeat", "dead-pid", "reused-pid"])
def test_a_gone_owner_is_taken_over_with_one_line(tmp_path, host, pid, age, why):
    if pid == "dead":
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        pid = dead.pid
    elif pid == "self":
        pid = os.getpid()
    plant(tmp_path, host, pid, heartbeat_age_s=age)
    lines = []
    lock = WorkdirLock(tmp_path, stale_after_s=300, log=lines.append)
    lock.acquire()
    try:
        assert len(lines) == 1 and "Took over the workdir lock" in lines[0] and why in lines[0]
        assert f"pid {pid}" in lines[0]
        held = json.loads((tmp_path / LOCK_NAME).read_text())
        assert (held["pid"], held["host"]) == (os.getpid(), socket.gethostname())
    finally:
        lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_heartbeat_refreshes_and_notices_a_takeover(tmp_path):
    lines = []
    with WorkdirLock(tmp_path, stale_after_s=2.0, log=lines.append, heartbeat_s=0.2) as lock:
        first = json.loads((tmp_path / LOCK_NAME).read_text())["heartbeat"]
        time.sleep(0.7)
        assert json.loads((tmp_path / LOCK_NAME).read_text())["heartbeat"] > first
        # A second holder in this process is refused, not taken over (its pid is ours).
        with pytest.raises(WorkdirBusy):
            WorkdirLock(tmp_path, stale_after_s=2.0).acquire()
        plant(tmp_path, "pod-host-9", 77, heartbeat_age_s=0)  # another writer took over
        deadline = time.monotonic() + 5
        while lock.lost is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "pod-host-9" in lock.lost
        with pytest.raises(workdir_lock.UserError, match="without saving: the workdir lock"):
            train._check_still_ours(lock, 40)
    # Release leaves the successor's lock in place.
    assert json.loads((tmp_path / LOCK_NAME).read_text())["host"] == "pod-host-9"


@pytest.mark.slow
def test_second_train_is_refused_and_a_killed_train_is_taken_over(tmp_path, capsys):
    """A real train holds the lock; a second one exits 2 naming it, before building
    anything; after ``kill -9`` of the first, a new run takes the lock over and trains."""
    workdir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", XLA_FLAGS="")
    owner = subprocess.Popen(
        [sys.executable, "-m", "t5x_like.train", "--config=configs/quickstart.py",
         f"--workdir={workdir}", "--quiet", *TINY, "--config.num_train_steps=100000",
         "--config.checkpoint_every_steps=100000"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (workdir / LOCK_NAME).exists():
            assert owner.poll() is None, owner.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the first train never took the lock"
            time.sleep(0.1)
        capsys.readouterr()
        started = time.monotonic()
        code = train.main(["--config=configs/quickstart.py", f"--workdir={workdir}",
                           *TINY, "--config.num_train_steps=2"])
        refused_in = time.monotonic() - started
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        assert f"host {socket.gethostname()}, pid {owner.pid}" in err
        assert f"`kill {owner.pid}`" in err and "since" in err
        assert refused_in < 20  # refused before compiling or restoring anything
        assert json.loads((workdir / LOCK_NAME).read_text())["pid"] == owner.pid
    finally:
        owner.kill()  # kill -9: the lock file stays behind
        owner.wait()
    config = tiny_config(num_train_steps=2, eval_every_steps=0, checkpoint_every_steps=2)
    result = train.run(config, str(workdir), quiet=True)
    err = capsys.readouterr().err
    assert result["step"] == 2
    assert f"Took over the workdir lock {workdir / LOCK_NAME}" in err
    assert f"pid {owner.pid} is no longer running" in err
    assert not (workdir / LOCK_NAME).exists()  # released at the end
    assert (workdir / "checkpoints" / "2").is_dir()


@pytest.fixture(scope="module")
def gcs():
    with gcs_emulator() as env, pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        gcsfs.GCSFileSystem.clear_instance_cache()
        yield env
    gcsfs.GCSFileSystem.clear_instance_cache()


def _race(workdir: str, writers: int) -> tuple[list, list]:
    """``writers`` threads acquire the same lock at once: ``(winners, refusals)``."""
    barrier = threading.Barrier(writers)
    winners, refused = [], []

    def writer():
        lock = WorkdirLock(workdir, stale_after_s=300, log=lambda line: None)
        barrier.wait()
        try:
            lock.acquire()
            winners.append(lock)
        except WorkdirBusy as e:
            refused.append(str(e))
    threads = [threading.Thread(target=writer) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return winners, refused


def test_gcs_lock_raced_by_writers_has_exactly_one_owner(gcs):
    from google.cloud import storage as gcs_client
    bucket = gcs_client.Client().bucket("t5xl-test")
    for trial in range(3):
        workdir = f"gs://t5xl-test/race{trial}"
        if trial == 2:  # a stale owner's lock: the takeover is raced too
            now = time.time()
            bucket.blob(f"race{trial}/{LOCK_NAME}").upload_from_string(
                Owner("gone-host", 1, now - 900, now - 900, "stale").to_text())
        winners, refused = _race(workdir, writers=4)
        assert len(winners) == 1 and len(refused) == 3, (winners, refused)
        assert all(f"pid {os.getpid()}" in message for message in refused)
        held = json.loads(bucket.blob(f"race{trial}/{LOCK_NAME}").download_as_bytes())
        assert held["token"] == winners[0].owner.token
        assert winners[0].refresh()  # a heartbeat is a conditional write on its generation
        winners[0].release()
        assert bucket.get_blob(f"race{trial}/{LOCK_NAME}") is None
