"""One writer per workdir: a second train is refused naming the owner, a dead owner's
lock is taken over, heartbeats and releases, and a lock raced by four writer processes
(on a local disk, and on gs:// through the GCS emulator) ends with exactly one owner."""

import contextlib
import json
import os
import pathlib
import select
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import tiny_config
from storage_emulators import gcs_fixture  # noqa: F401  (the module's `gcs` fixture)

from t5x_like import train
from t5x_like.resilience import holding, workdir_lock
from t5x_like.resilience.workdir_lock import LOCK_NAME, Owner, WorkdirBusy, WorkdirLock

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
            holding.check_still_ours(lock, 40)
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


# A writer process: answers one JSON line per command read from stdin. ``acquire WORKDIR
# T0`` waits until the unix time T0 (so that every racer starts within a millisecond or
# so of the others), then acquires; ``refresh`` rewrites the heartbeat of what it holds;
# ``release`` releases it.
RACER = textwrap.dedent("""
    import json, os, sys, time
    from t5x_like.resilience.workdir_lock import WorkdirBusy, WorkdirLock

    held = None
    for line in sys.stdin:
        command, *args = line.split()
        reply = {"pid": os.getpid()}
        if command == "acquire":
            logged = []
            lock = WorkdirLock(args[0], stale_after_s=300, log=logged.append)
            while time.time() < float(args[1]):
                pass
            try:
                lock.acquire()
                held = lock
                reply.update(won=True, token=lock.owner.token, logged=logged)
            except WorkdirBusy as e:
                reply.update(won=False, refused=str(e), logged=logged)
        elif command == "refresh":
            reply["refreshed"] = held.refresh()
        elif command == "release":
            held.release()
            held, reply["released"] = None, True
        print(json.dumps(reply), flush=True)
""")
RACERS = 4
TIMEOUT_S = 60  # for every answer of every racer; the whole race is killed past it


class Racers:
    """``RACERS`` writer processes, each a real ``WorkdirLock`` in its own interpreter."""

    def __init__(self):
        env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
        self.procs = [subprocess.Popen([sys.executable, "-c", RACER], cwd=REPO, env=env,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
                      for _ in range(RACERS)]

    def ask(self, command: str, procs=None) -> list[dict]:
        procs = self.procs if procs is None else procs
        for proc in procs:
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
        deadline = time.monotonic() + TIMEOUT_S
        replies = []
        for proc in procs:
            ready, _, _ = select.select([proc.stdout], [], [], max(deadline - time.monotonic(), 0))
            assert ready, f"racer {proc.pid} gave no answer to {command!r} within {TIMEOUT_S} s"
            line = proc.stdout.readline()
            if not line:  # it died: say how
                proc.wait(timeout=10)
                raise AssertionError(f"racer {proc.pid} exited {proc.returncode} on {command!r}: "
                                     f"{proc.stderr.read()[-3000:]}")
            replies.append(json.loads(line))
        return replies

    def race(self, workdir: str) -> tuple[dict, list[dict]]:
        """Every racer acquires ``workdir``'s lock at the same instant: the one winner,
        and the refusals."""
        replies = self.ask(f"acquire {workdir} {time.time() + 0.5}")
        winners = [r for r in replies if r["won"]]
        refused = [r for r in replies if not r["won"]]
        assert len(winners) == 1 and len(refused) == RACERS - 1, replies
        [winner] = winners
        # Each refusal names the one live owner: the winner's process.
        for r in refused:
            assert f"pid {winner['pid']}," in r["refused"] and "Another train is writing" in \
                r["refused"], r
        return winner, refused

    def winner(self, reply: dict):
        return next(p for p in self.procs if p.pid == reply["pid"])

    def close(self):
        for proc in self.procs:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def racers():
    group = Racers()
    try:
        yield group
    finally:
        group.close()


def _check_trials(group: Racers, workdir_of, read_lock, plant_stale):
    """Three races: a free workdir twice, then one whose lock has a stale owner (the
    takeover is raced too). Exactly one process wins each; the lock names it; it can
    heartbeat (a conditional write on its own version) and releases the lock."""
    for trial in range(3):
        workdir = workdir_of(trial)
        if trial == 2:
            plant_stale(trial)
        winner, refused = group.race(workdir)
        held = json.loads(read_lock(trial))
        assert (held["token"], held["pid"]) == (winner["token"], winner["pid"])
        took_over = [r for r in (winner, *refused) if r["logged"]]
        if trial == 2:
            assert took_over == [winner] and "Took over the workdir lock" in winner["logged"][0]
            assert "no heartbeat for" in winner["logged"][0]
        else:
            assert took_over == []
        process = group.winner(winner)
        assert group.ask("refresh", [process]) == [{"pid": winner["pid"], "refreshed": True}]
        assert json.loads(read_lock(trial))["heartbeat"] >= held["heartbeat"]
        group.ask("release", [process])
        assert read_lock(trial) is None


def test_local_lock_raced_by_writer_processes_has_exactly_one_owner(tmp_path):
    def read_lock(trial):
        file = tmp_path / f"race{trial}" / LOCK_NAME
        return file.read_text() if file.exists() else None
    with racers() as group:
        _check_trials(group, lambda trial: str(tmp_path / f"race{trial}"), read_lock,
                      lambda trial: plant(tmp_path / f"race{trial}", "gone-host", 1, 900))


def test_gcs_lock_raced_by_writer_processes_has_exactly_one_owner(gcs):
    from google.cloud import storage as gcs_client
    bucket = gcs_client.Client().bucket("t5xl-test")

    def read_lock(trial):
        blob = bucket.get_blob(f"race{trial}/{LOCK_NAME}")
        return None if blob is None else blob.download_as_bytes().decode()

    def plant_stale(trial):
        now = time.time()
        bucket.blob(f"race{trial}/{LOCK_NAME}").upload_from_string(
            Owner("gone-host", 1, now - 900, now - 900, "stale").to_text())
    with racers() as group:
        _check_trials(group, lambda trial: f"gs://t5xl-test/race{trial}", read_lock, plant_stale)
