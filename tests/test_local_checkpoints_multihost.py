"""The local checkpoint tier of a multi-process run (``checkpoint_per_host``): 2 processes
of 4 devices, each with its own local folder (as each host has its own disk), save their
own shards there; the workdir's copy is the union of the hosts' shares, sealed once all
have landed, and restores on one process; each host's own copy restores the run on the
same layout; a host that lost its copy sends every host to the workdir's."""

import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from test_elastic_resume import LOSS_RTOL, REPO, SETTINGS, _env, _records

from t5x_like.checkpoints import checkpoint_store
from t5x_like.system import storage

# FSDP over both processes' devices: each host holds its own part of every parameter.
MESH = ["--config.mesh.data=1", "--config.mesh.fsdp=-1", "--config.checkpoint.every_steps=2"]


def _train(workdir, steps, processes, local_dir=None, devices=4):
    local = [f"--config.checkpoint.local_dir={local_dir}"] if local_dir else []
    flags = [*SETTINGS, *MESH, *local, f"--workdir={workdir}",
             f"--config.num_train_steps={steps}"]
    command = ([sys.executable, "-m", "t5x_like.launch_local", f"--num_processes={processes}",
                f"--devices_per_process={devices}", "--timeout_s=240", "--", *flags]
               if processes > 1 else [sys.executable, "-m", "t5x_like.train", *flags])
    done = subprocess.run(command, cwd=REPO, env=_env(devices), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def _resumed_from(output: str) -> str:
    """Process 0's "Resumed from FOLDER at step N." line (the others' are prefixed)."""
    [(folder, _)] = re.findall(r"^Resumed from (\S+) at step (\d+)\.$", output, re.M)
    return folder


def _files(folder) -> set[str]:
    return {storage.relative_name(p, folder) for p in storage.files_under(folder)}


@pytest.mark.slow
def test_hosts_save_their_own_shards_and_the_workdir_holds_their_sealed_union(tmp_path):
    workdir, local = tmp_path / "run", tmp_path / "local"
    _train(workdir, 4, 2, local)
    hosts = [checkpoint_store.local_tier(local, workdir / "checkpoints", p) for p in (0, 1)]
    durable = workdir / "checkpoints" / "4"
    # Each host's copy is its own (host 1's holds array chunks host 0's does not), and the
    # workdir's is their union under one manifest; no landing marks are left.
    mine = [_files(host / "4") for host in hosts]
    chunks = {name for name in mine[1] if name.startswith("state/") and name.count("/") >= 2
              and not name.endswith(".zarray")}
    assert chunks - mine[0], "host 1 wrote no shard of its own"
    union = (mine[0] | chunks) - {checkpoint_store.MANIFEST}
    assert _files(durable) - {checkpoint_store.MANIFEST} == union
    assert checkpoint_store.manifest_problem(durable) is None
    assert checkpoint_store.has_manifest(durable)
    assert not list((workdir / "checkpoints").glob("*.landed"))
    shutil.copytree(workdir, tmp_path / "elsewhere")

    # The same hosts, the same layout: each restores its own copy.
    resumed = _train(workdir, 6, 2, local)
    assert _resumed_from(resumed) == str(hosts[0] / "4")
    # One process of 4 devices, no local tier: the workdir's union restores, and the
    # steps after it are the two-process run's.
    alone = _train(tmp_path / "elsewhere", 6, 1)
    assert _resumed_from(alone) == str(tmp_path / "elsewhere" / "checkpoints" / "4")
    two, one = _records(workdir), _records(tmp_path / "elsewhere")
    for step in (5, 6):
        assert one[step]["batch_checksum"] == two[step]["batch_checksum"]
        np.testing.assert_allclose(one[step]["loss"], two[step]["loss"], rtol=LOSS_RTOL)

    # Host 1 lost its disk: every host reads the workdir's copy of step 6.
    shutil.rmtree(hosts[1].parent)
    again = _train(workdir, 8, 2, local)
    assert _resumed_from(again) == str(workdir / "checkpoints" / "6")
    assert sorted(_records(workdir)) == list(range(1, 9))


def test_the_share_of_a_host_is_its_array_chunks():
    from t5x_like.checkpoints import checkpoint_per_host
    assert checkpoint_per_host.host_share("state/params.decoder.kernel/0.1")
    assert not checkpoint_per_host.host_share("state/params.decoder.kernel/.zarray")
    assert not checkpoint_per_host.host_share("state/_METADATA")
    assert not checkpoint_per_host.host_share("config/metadata")
    assert not checkpoint_per_host.host_share("commit_success.txt")


def test_a_host_waits_for_every_share_before_sealing(tmp_path):
    from t5x_like.checkpoints import checkpoint_per_host
    step = tmp_path / "checkpoints" / "6"
    (step / "state").mkdir(parents=True)
    (step / "state" / "x").write_text("x")
    commit = tmp_path / "commit_success.txt"
    commit.write_text("done")
    lines = []
    checkpoint_per_host.mark_landed(tmp_path / "checkpoints", 6, 0)
    assert not checkpoint_per_host.seal_when_landed(
        tmp_path / "checkpoints", 6, 2, checkpoint_store.write_manifest, storage.path(commit),
        lines.append, timeout_s=0.3)
    assert not checkpoint_store.has_manifest(step) and "processes [1]" in lines[0]
    checkpoint_per_host.mark_landed(tmp_path / "checkpoints", 6, 1)
    assert checkpoint_per_host.seal_when_landed(
        tmp_path / "checkpoints", 6, 2, checkpoint_store.write_manifest, storage.path(commit),
        lines.append, timeout_s=0.3)
    assert checkpoint_store.manifest_problem(step) is None
    assert (step / "commit_success.txt").exists() and not (tmp_path / "checkpoints" /
                                                             "6.landed").exists()
    assert pathlib.Path(step / checkpoint_store.MANIFEST).exists()
