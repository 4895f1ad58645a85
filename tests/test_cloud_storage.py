"""gs:// and s3:// paths, against emulators the tests start on loopback.

The fast tests drive ``t5x_like.system.storage`` and the readers and writers built on it
in-process; the slow one trains into a bucket, is stopped with SIGTERM, resumes and is
evaluated, every path a ``gs://`` URL.
"""

import gzip
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import gcp_storage_emulator  # noqa: F401  (installed by the dev extra: a missing one must fail, not skip)
import gcsfs
import pytest
from storage_emulators import gcs_emulator, s3_emulator

REPO = pathlib.Path(__file__).resolve().parents[1]


def _forget_cached_filesystems():
    """fsspec keeps one filesystem per protocol; a new emulator has a new address."""
    import s3fs
    gcsfs.GCSFileSystem.clear_instance_cache()
    s3fs.S3FileSystem.clear_instance_cache()


def _clients_pointed_at(emulator):
    """The emulator's environment set for this process's clients while the module runs."""
    with emulator() as env, pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        _forget_cached_filesystems()
        yield env
    _forget_cached_filesystems()


@pytest.fixture(scope="module")
def gcs():
    yield from _clients_pointed_at(gcs_emulator)


@pytest.fixture(scope="module")
def s3():
    import moto  # noqa: F401  (installed by the dev extra: a missing one must fail, not skip)
    yield from _clients_pointed_at(s3_emulator)


@pytest.mark.parametrize("bucket_fixture", ["gcs", "s3"])
def test_append_log_keeps_every_line_across_writers(bucket_fixture, request):
    request.getfixturevalue(bucket_fixture)
    from t5x_like.system import storage
    scheme = "gs" if bucket_fixture == "gcs" else "s3"
    file = storage.path(f"{scheme}://t5xl-test/append/metrics.jsonl")
    first = storage.AppendLog(file)
    first.append('{"step": 1}\n')
    first.append('{"step": 2}\n')
    first.close()
    resumed = storage.AppendLog(file)  # a resumed run reopens the same log
    resumed.append('{"step": 3}\n')
    resumed.close()
    assert [json.loads(line)["step"] for line in file.read_text().splitlines()] == [1, 2, 3]


def test_files_under_a_bucket_folder_keep_their_scheme_and_move_as_a_tree(gcs):
    from t5x_like.system import storage
    folder = storage.path("gs://t5xl-test/tree/7")
    for name in ("a.json", "state/x", "state/deep/y"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(name)
    files = storage.files_under(folder)
    assert [str(f) for f in files] == [
        "gs://t5xl-test/tree/7/a.json", "gs://t5xl-test/tree/7/state/deep/y",
        "gs://t5xl-test/tree/7/state/x"]
    assert storage.file_size(files[0]) == len("a.json")
    target = storage.path("gs://t5xl-test/tree/aside/7")
    storage.move_tree(folder, target)
    assert not folder.exists()
    assert (target / "state" / "deep" / "y").read_text() == "state/deep/y"


def test_text_sources_read_bucket_files_like_local_ones(gcs, tmp_path):
    from t5x_like.data.sources import JsonlSource, TextLineSource
    from t5x_like.system import storage
    lines = [f"line {i}" for i in range(10)]
    storage.path("gs://t5xl-test/corpus/b.txt").write_text("\n".join(lines[5:]) + "\n")
    storage.path("gs://t5xl-test/corpus/a.txt.gz").write_bytes(
        gzip.compress(("\n".join(lines[:5]) + "\n").encode()))
    (tmp_path / "a.txt").write_text("\n".join(lines[:5]) + "\n")
    (tmp_path / "b.txt").write_text("\n".join(lines[5:]) + "\n")
    remote = TextLineSource(["gs://t5xl-test/corpus/*"], holdout_every=4)
    assert remote.files() == ["gs://t5xl-test/corpus/a.txt.gz", "gs://t5xl-test/corpus/b.txt"]
    local = TextLineSource([str(tmp_path / "*.txt")], holdout_every=4)
    assert remote.documents() == local.documents() == [  # every 4th line of a file held out
        "line 0", "line 1", "line 2", "line 4", "line 5", "line 6", "line 7", "line 9"]
    storage.path("gs://t5xl-test/jsonl/x.jsonl").write_text(
        '{"text": "a"}\n{"text": "b"}\n')
    assert JsonlSource("gs://t5xl-test/jsonl/*.jsonl", holdout_every=2).get("train") == [
        {"text": "a"}]
    with pytest.raises(FileNotFoundError, match="No file matches 'gs://t5xl-test/none/"):
        TextLineSource(["gs://t5xl-test/none/*.txt"]).files()


def test_checkpoint_manifest_and_damage_check_work_in_a_bucket(gcs):
    from t5x_like.checkpoints import checkpoint_store
    from t5x_like.system import storage
    folder = storage.path("gs://t5xl-test/manifest/3")
    (folder / "state").mkdir(parents=True, exist_ok=True)
    (folder / "state" / "data").write_bytes(b"\x00" * 100)
    (folder / "config").mkdir(parents=True, exist_ok=True)
    (folder / "config" / "metadata").write_text("{}")
    checkpoint_store.write_manifest(folder)
    assert checkpoint_store.has_manifest(folder)
    assert checkpoint_store.manifest_problem(folder) is None
    (folder / "state" / "data").write_bytes(b"\x01" * 100)
    assert "does not match its checksum" in checkpoint_store.manifest_problem(folder)


def test_a_missing_bucket_is_refused_before_any_work(gcs):
    from t5x_like import cli_flags, errors
    with pytest.raises(errors.UserError, match="cannot write there"):
        cli_flags.check_writable_folder("gs://no-such-bucket/run")


def test_a_pretrained_folder_round_trips_through_a_bucket(gcs):
    import numpy as np

    from t5x_like.checkpoints import pretrained
    from t5x_like.data import vocabularies
    from t5x_like.system import storage
    params = {"dense": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)}}
    config = {"family": "decoder", "d_model": 3}
    pretrained.save_pretrained("gs://t5xl-test/pretrained", config, params,
                               vocabulary=vocabularies.ByteVocabulary())
    folder = storage.path("gs://t5xl-test/pretrained")
    assert (folder / "tokenizer" / "tokenizer.json").is_file()
    loaded_config, loaded = pretrained.load_pretrained("gs://t5xl-test/pretrained")
    assert loaded_config == config
    np.testing.assert_array_equal(loaded["dense"]["kernel"], params["dense"]["kernel"])
    from t5x_like.data import hf_tokenizers
    assert hf_tokenizers.load("gs://t5xl-test/pretrained/tokenizer").encode("hi") == \
        vocabularies.ByteVocabulary().encode("hi")


def test_s3_checkpoint_paths_are_refused_with_the_reason(s3):
    from t5x_like.system import storage
    with pytest.raises(ValueError, match="orbax .* gs:// and local"):
        storage.check_checkpoint_location("s3://t5xl-test/run", "--workdir")
    storage.check_checkpoint_location("gs://t5xl-test/run", "--workdir")


TINY = ["--config=configs/quickstart.py", "--config.batch_size=2",
        "--config.model.d_model=16", "--config.model.d_ff=32", "--config.model.num_heads=2",
        "--config.model.head_dim=8", "--config.model.num_encoder_layers=1",
        "--config.model.num_decoder_layers=1", "--config.task_feature_lengths.inputs=16",
        "--config.task_feature_lengths.targets=8", "--config.eval_batches=1",
        "--config.log_every_steps=1"]


@pytest.mark.slow
def test_train_sigterm_resume_and_eval_all_in_a_bucket(gcs):
    from t5x_like.system import storage
    env = dict(os.environ, **gcs, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    workdir = "gs://t5xl-test/e2e/run"
    metrics = storage.path(workdir) / "metrics.jsonl"
    train = [sys.executable, "-m", "t5x_like.train", f"--workdir={workdir}", *TINY]
    process = subprocess.Popen(train + ["--config.num_train_steps=100000",
                                        "--config.checkpoint_every_steps=100000"],
                               cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not (
                metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            time.sleep(0.5)
        assert metrics.exists(), "training never logged a step"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-3000:]
    assert "SIGTERM received" in stderr
    stopped_at = json.loads(metrics.read_text().splitlines()[-1])["step"]
    checkpoints = storage.path(workdir) / "checkpoints"
    assert [int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()] == [stopped_at]
    assert (checkpoints / str(stopped_at) / "manifest.t5x_like.json").is_file()

    target = stopped_at + 3
    resumed = subprocess.run(train + [f"--config.num_train_steps={target}",
                                      f"--config.checkpoint_every_steps={target}"],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at step {stopped_at}" in resumed.stderr
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, target + 1))  # every line kept, none twice
    assert storage.files_under(storage.path(workdir) / "tensorboard")

    output_dir = "gs://t5xl-test/e2e/eval"
    evaluated = subprocess.run(
        [sys.executable, "-m", "t5x_like.eval", f"--checkpoint={workdir}",
         "--task=embedded_spam", f"--output_dir={output_dir}",
         "--max_examples=4", "--batch_size=2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    records = [json.loads(line) for line in
               (storage.path(output_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [stopped_at, target]  # every checkpoint, oldest first
    assert all(0.0 <= r["accuracy"] <= 100.0 for r in records)
    predictions = storage.path(output_dir) / "predictions" / "embedded_spam"
    assert len((predictions / f"step_{target}.jsonl").read_text().splitlines()) == 4


def test_a_bucket_path_without_its_client_library_names_the_extra(monkeypatch):
    from t5x_like import cli_flags, errors
    from t5x_like.system import storage
    monkeypatch.setitem(storage._FSSPEC_PACKAGE, "gs://", "no_such_gcs_client")
    with pytest.raises(errors.UserError,
                       match=r"--workdir=gs://b/run: gs:// paths need the no_such_gcs_client "
                             r'package: pip install -c constraints.txt -e "\.\[cloud\]"'):
        cli_flags.check_writable_folder("gs://b/run")
