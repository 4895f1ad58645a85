"""The preprocessing cache (``data/cache.py``) and its Beam command (``cache_tasks``).

Two small tasks are cached once per module with Beam's in-process DirectRunner: one
reads two text files (file-level host sharding), one an in-memory split with empty
documents (dropped before the marker). Read from the cache, every seed, host shard and
resumed iterator gives exactly the uncached examples.
"""

import dataclasses
import itertools
import json
import pathlib
import pickle

import apache_beam  # noqa: F401  (beam-requirements.txt installs it: missing fails, not skips)
import numpy as np
import pytest

from t5x_like import cache_tasks
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.data import cache, sources
from t5x_like.data import preprocessors as pp
from t5x_like.data.dataset_providers import Task, TaskRegistry, with_vocabulary
from t5x_like.errors import UserError

FILES_TASK, MEMORY_TASK = "cache_test_files", "cache_test_memory"
LENGTHS = {"inputs": 32, "targets": 12}
WORDS = ("the quick brown fox jumps over a lazy dog while seven wise owls count the "
         "falling leaves of autumn beside a quiet river").split()


def _line(rng) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(3, 25))))


def _tasks(folder: pathlib.Path) -> list[Task]:
    rng = np.random.default_rng(0)
    for index in range(2):
        (folder / f"part{index}.txt").write_text(
            "\n".join(_line(rng) for _ in range(30 + 10 * index)) + "\n")
    files = sources.TextFilesSource((str(folder / "part*.txt"),), holdout_every=5)
    docs = [_line(rng) if i % 7 else "" for i in range(60)]  # every 7th is empty: dropped
    memory = sources.InMemorySource({"train": [{"text": d} for d in docs],
                                     "validation": [{"text": d} for d in docs[:9]]})
    return [Task(FILES_TASK, files, tuple(tasks.span_corruption_steps()),
                 tasks.features("inputs", "targets")),
            Task(MEMORY_TASK, memory, tuple(tasks.mlm_steps()),
                 tasks.features("inputs", "targets"))]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Both tasks registered and cached (shards of at most 7 examples) in ``cache_dir``."""
    folder = tmp_path_factory.mktemp("cache_tasks")
    registered = _tasks(folder)
    for task in registered:
        TaskRegistry.add(task)
    cache_dir = folder / "cache"
    try:
        assert cache_tasks.main([f"--tasks={FILES_TASK},{MEMORY_TASK}",
                                 f"--output_dir={cache_dir}", "--examples_per_shard=7"]) == 0
        yield {task.name: task for task in registered}, str(cache_dir)
    finally:
        for task in registered:
            TaskRegistry.remove(task.name)


@pytest.fixture
def cache_dir(built, monkeypatch):
    monkeypatch.setenv(cache.CACHE_DIR_ENV, built[1])
    return built[1]


def _examples(task, use_cached, n=None, **kwargs):
    ds = task.get_dataset("train", LENGTHS, use_cached=use_cached, **kwargs)
    return list(itertools.islice(iter(ds), n))


def _assert_same(expected, actual):
    assert len(expected) == len(actual) and expected
    for want, got in zip(expected, actual, strict=False):
        assert list(want) == list(got)
        for key in want:
            np.testing.assert_array_equal(want[key], got[key])
            assert np.asarray(want[key]).dtype == np.asarray(got[key]).dtype


@pytest.mark.parametrize("name", [FILES_TASK, MEMORY_TASK])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shard_index,num_shards", [(0, 1), (0, 2), (1, 2), (2, 3)])
def test_cached_outputs_equal_uncached(built, cache_dir, name, seed, shard_index, num_shards):
    task = built[0][name]
    kwargs = dict(seed=seed, shard_index=shard_index, num_shards=num_shards, num_epochs=2)
    _assert_same(_examples(task, False, **kwargs), _examples(task, True, **kwargs))
    # Without use_cached, a cache directory that has the task is read.
    assert cache.lookup(task, "train") is not None


def test_file_source_host_shards_read_whole_files_from_the_cache(built, cache_dir):
    task = built[0][FILES_TASK]
    cached = cache.lookup(task, "train", True)
    assert cached.info["file_sharded"] and cached.info["num_files"] == 2
    sizes = [len(cached.shard(i, 2)) for i in range(2)]
    assert sizes == [len(task.source.shard("train", i, 2)) for i in range(2)]
    assert sizes == [24, 32]  # part0: 30 lines, part1: 40, every 5th held out
    records = cached.shard(1, 2)  # grain's worker processes get the records pickled
    copy = pickle.loads(pickle.dumps(records))
    assert [list(example) for example in copy[:5]] == [list(example) for example in records[:5]]
    np.testing.assert_array_equal(copy[31]["targets"], records[31]["targets"])


@pytest.mark.parametrize("name", [FILES_TASK, MEMORY_TASK])
def test_resume_from_a_saved_iterator_state_is_exact(built, cache_dir, name):
    task = built[0][name]
    kwargs = dict(seed=3, shard_index=1, num_shards=2)
    cached = iter(task.get_dataset("train", LENGTHS, use_cached=True, **kwargs))
    uncached = iter(task.get_dataset("train", LENGTHS, use_cached=False, **kwargs))
    for _ in range(11):
        next(cached), next(uncached)
    state = cached.get_state()
    assert state == uncached.get_state()  # the same position either way
    expected = list(itertools.islice(cached, 25))
    for use_cached in (True, False):  # a cached run's state resumes either pipeline
        resumed = iter(task.get_dataset("train", LENGTHS, use_cached=use_cached, **kwargs))
        resumed.set_state(state)
        _assert_same(expected, list(itertools.islice(resumed, 25)))


def test_info_json_has_fingerprint_shards_and_statistics(built):
    tasks_by_name, cache_dir = built
    info = json.loads((pathlib.Path(cache_dir) / MEMORY_TASK / "info.json").read_text())
    assert info["fingerprint"] == cache.fingerprint(tasks_by_name[MEMORY_TASK])
    train = info["splits"]["train"]
    assert train["source_examples"] == 60 and train["dropped"] == 9  # i % 7 == 0
    assert train["examples"] == 51 and [s["records"] for s in train["shards"]] == [7] * 8 + [4]
    assert train["tokens"]["targets"] > 51 and "inputs" not in train["tokens"]
    assert sorted(info["splits"]) == ["train", "validation"]


def test_a_stale_cache_is_refused_with_both_fingerprints_and_the_rebuild_command(
        built, cache_dir):
    task = built[0][FILES_TASK]
    changed = dataclasses.replace(task, preprocessors=(
        pp.Rekey({"targets": "text"}), pp.Filter(lambda ex: len(ex["targets"]) > 3),
        pp.Tokenize(), pp.CacheMarker(), *task.preprocessors[3:]))
    with pytest.raises(UserError) as error:
        changed.get_dataset("train", LENGTHS)
    message = str(error.value)
    assert cache.fingerprint(task) in message and cache.fingerprint(changed) in message
    assert "the steps before the cache marker" in message
    assert f"python -m t5x_like.cache_tasks --tasks={FILES_TASK} --output_dir={cache_dir}" \
        in message
    # Another vocabulary is another cache, too; the message names the feature.
    with pytest.raises(UserError, match="output feature 'inputs'.*ByteVocabulary"):
        with_vocabulary(task, tasks.byte_vocabulary()).get_dataset("train", LENGTHS)
    # Reading the source is still possible.
    assert _examples(changed, False, n=3)


def test_a_half_written_cache_is_not_read(built, tmp_path, monkeypatch):
    task = built[0][MEMORY_TASK]
    for shard in (pathlib.Path(built[1]) / MEMORY_TASK).glob("*.array_record"):
        (tmp_path / MEMORY_TASK).mkdir(exist_ok=True)
        (tmp_path / MEMORY_TASK / shard.name).write_bytes(shard.read_bytes())
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(tmp_path))  # shards, no info.json
    assert cache.lookup(task, "train") is None
    with pytest.raises(UserError) as error:
        task.get_dataset("train", LENGTHS, use_cached=True)
    assert (f"Build it: python -m t5x_like.cache_tasks --tasks={MEMORY_TASK} "
            f"--output_dir={tmp_path}") in str(error.value)


def test_a_required_marker_without_a_cache_says_how_to_build_it(monkeypatch):
    monkeypatch.delenv(cache.CACHE_DIR_ENV, raising=False)
    task = Task("cache_required", sources.InMemorySource({"train": [{"text": "a b"}]}),
                (pp.Rekey({"targets": "text"}), pp.Tokenize(), pp.CacheMarker(required=True)),
                tasks.features("targets"))
    with pytest.raises(UserError, match="required.*T5X_LIKE_CACHE_DIR=DIR.*--tasks=cache_"):
        task.get_dataset("train", {"targets": 8}, use_cached=False)


@pytest.mark.parametrize("steps,message", [
    ((pp.Rekey({"targets": "text"}), pp.Tokenize(), pp.MaskedLM(), pp.CacheMarker()),
     r"step 2 \(MaskedLM\).*draws random numbers"),
    ((pp.Rekey({"targets": "text"}), pp.Tokenize(), pp.ConcatenateAndSplit(), pp.CacheMarker()),
     r"step 2 \(ConcatenateAndSplit\).*stream step"),
    ((lambda example, rng: example, pp.CacheMarker()), r"step 0 \(<lambda>\).*uses_rng"),
    ((pp.CacheMarker(), pp.Rekey({"targets": "text"}), pp.CacheMarker()), "2 cache markers"),
])
def test_a_random_or_stream_step_before_the_marker_is_refused(steps, message):
    with pytest.raises(ValueError, match=message):
        Task("cache_bad", sources.InMemorySource({"train": [{"text": "a"}]}), steps,
             tasks.features("targets"))


def test_adding_the_marker_changes_no_output():
    source = sources.InMemorySource({"train": [{"text": " ".join(WORDS[i:])} for i in range(9)]})
    steps = tasks.span_corruption_steps()
    plain = [step for step in steps if not isinstance(step, pp.CacheMarker)]
    with_marker = Task("cache_marked", source, tuple(steps), tasks.features("inputs", "targets"))
    without = Task("cache_unmarked", source, tuple(plain), tasks.features("inputs", "targets"))
    _assert_same(_examples(without, None, n=20, seed=5), _examples(with_marker, False, n=20, seed=5))


def test_records_round_trip_every_value_type():
    example = {"ids": np.arange(5, dtype=np.int32), "mask": np.array([[True, False]]),
               "f": np.float32(0.5), "text": "héllo", "raw": b"\xff\x00", "n": 3, "x": 1.5,
               "flag": True, "none": None, "pair": (1, "a"), "list": [np.int64(2), "b"],
               "np_text": np.str_("w"), "empty": np.zeros((0,), np.int32), "nested": {"k": [1]}}
    back = cache.decode(cache.encode(example))
    assert list(back) == list(example)
    for key, value in example.items():
        if isinstance(value, np.ndarray):
            assert back[key].dtype == value.dtype and back[key].shape == value.shape
            np.testing.assert_array_equal(back[key], value)
            assert back[key].flags.writeable
        else:
            assert back[key] == value and type(back[key]) is type(value), key
    assert cache.decode(cache.encode(None)) is None
    with pytest.raises(TypeError, match="object arrays"):
        cache.encode({"bad": np.array([object()])})


def test_the_fingerprint_does_not_depend_on_the_process():
    task = TaskRegistry.get("embedded_en_span_corruption")
    parts = json.dumps(cache.fingerprint_parts(task))
    assert "0x" not in parts and "<data>/en/austen.txt.gz" in parts
    assert cache.fingerprint(task) == cache.fingerprint(dataclasses.replace(task))
    lm = TaskRegistry.get("embedded_en_lm")  # AppendEos before its marker: other steps
    assert cache.fingerprint(lm) != cache.fingerprint(dataclasses.replace(lm, name=task.name))


def test_a_current_cache_is_not_rebuilt(built, capsys):
    assert cache_tasks.main([f"--tasks={MEMORY_TASK}", f"--output_dir={built[1]}"]) == 0
    assert "is current (fingerprint" in capsys.readouterr().out


@pytest.mark.parametrize("args,message", [
    (["--tasks=embedded_en_spam_corruption"], "no task or mixture named "
                                              "'embedded_en_spam_corruption'. Did you mean"),
    (["--tasks=glue_sst2_v002"], "has no cache marker"),
    (["--task=embedded_en_lm"], "unknown flag --task; did you mean --tasks?"),
    (["--tasks=embedded_en_lm", "--examples_per_shard=0"], "--examples_per_shard=0"),
])
def test_cli_bad_input_exits_2_with_a_message(args, message, tmp_path, capsys):
    argv = args + [f"--output_dir={tmp_path}"] + (
        ["--tasks=x"] if args[0].startswith("--task=") else [])
    assert cache_tasks.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("cache_tasks: ") and message in err


def test_cli_refuses_a_step_that_reads_lengths_before_the_marker(tmp_path, capsys):
    task = Task("cache_truncating", sources.InMemorySource({"train": [{"text": "a b c"}]}),
                (pp.Rekey({"targets": "text"}), pp.Tokenize(), pp.Truncate(), pp.CacheMarker()),
                tasks.features("targets"))
    TaskRegistry.add(task)
    try:
        assert cache_tasks.main([f"--tasks={task.name}", f"--output_dir={tmp_path}"]) == 2
    finally:
        TaskRegistry.remove(task.name)
    assert "reads task_feature_lengths" in capsys.readouterr().err
    assert not (tmp_path / task.name / "info.json").exists()


def test_cli_refuses_an_unwritable_output_dir(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cache_tasks.main(["--tasks=embedded_en_lm", f"--output_dir={blocker}"]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_a_cache_in_a_bucket_is_built_and_read_like_a_local_one(built, tmp_path, monkeypatch):
    """gs:// through the emulator: shards are written locally and copied up, and read from
    a local copy (ArrayRecord reads local files only)."""
    import gcp_storage_emulator  # noqa: F401  (installed by the dev extra: a missing one must fail, not skip)
    import gcsfs
    from storage_emulators import gcs_emulator

    with gcs_emulator() as env:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
        gcsfs.GCSFileSystem.clear_instance_cache()
        try:
            bucket_dir = "gs://t5xl-test/cache"
            assert cache_tasks.main([f"--tasks={MEMORY_TASK}", f"--output_dir={bucket_dir}",
                                     "--splits=train", "--examples_per_shard=20"]) == 0
            monkeypatch.setenv(cache.CACHE_DIR_ENV, bucket_dir)
            task = built[0][MEMORY_TASK]
            kwargs = dict(seed=4, shard_index=0, num_shards=2, num_epochs=1)
            _assert_same(_examples(task, False, **kwargs), _examples(task, True, **kwargs))
            assert len(list((tmp_path / "t5x_like" / "data_cache").rglob("*.array_record"))) == 3
        finally:
            gcsfs.GCSFileSystem.clear_instance_cache()
