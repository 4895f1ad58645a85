"""Fixed virtual streams: processes share the global batch, each reading only its shards."""

import functools
import itertools
import json
from collections.abc import Sequence

import numpy as np
import pytest

import t5x_like.data as td
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.data import pipeline, streams

SPAN = functools.partial(pipeline.build_dataset, "embedded_en_span_corruption", "train",
                         {"inputs": 32, "targets": 8}, seed=3, shuffle=True, pack=True)


def take(iterator, n):
    return list(itertools.islice(iterator, n))


def processes(make_stream, batch_size, num_streams, process_count):
    return [td.HostBatchIterator(make_stream, batch_size, num_streams, process_count, p)
            for p in range(process_count)]


def assemble(iterators, steps):
    """The global batches the processes' rows make, as one process would see them."""
    per_process = [take(it, steps) for it in iterators]
    return [{k: np.concatenate([rows[step][k] for rows in per_process]) for k in per_process[0][0]}
            for step in range(steps)]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=False):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


class LoggedRecords(Sequence):
    """Records ``{"i": i}`` that remember which indices were read."""

    def __init__(self, n):
        self.n, self.read = n, set()

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        self.read.add(index)
        return {"i": index}


@pytest.fixture
def logged_task():
    """A task whose rows carry their source index; yields (task name, its records)."""
    records = LoggedRecords(96)
    name = "streams_logged_ids"
    td.TaskRegistry.add(name, source=td.FunctionSource(lambda split: records),
                        preprocessors=[lambda ex, rng: {
                            "targets": np.array([ex["i"] + 10, rng.integers(1, 1000)], np.int32)}],
                        output_features=tasks.features("targets"))
    yield name, records
    td.TaskRegistry.remove(name)


def logged_streams(name):
    return functools.partial(pipeline.build_dataset, name, "train", {"targets": 4}, seed=0,
                             shuffle=True,
                             feature_converter=td.DecoderFeatureConverter())


@pytest.mark.parametrize("process_count", [2, 4])
def test_processes_assemble_the_single_process_batches(process_count):
    single = take(td.HostBatchIterator(SPAN, 8, num_streams=4), 3)
    assert_same_batches(assemble(processes(SPAN, 8, 4, process_count), 3), single)


def test_each_process_reads_only_its_shards(logged_task):
    name, records = logged_task
    make_stream = logged_streams(name)
    for p, it in enumerate(processes(make_stream, 8, 4, 2)):
        assert list(it.stream_indices) == [2 * p, 2 * p + 1] and it.local_batch_size == 4
        records.read.clear()
        batches = take(it, 5)
        assert {i % 4 for i in records.read} == {2 * p, 2 * p + 1}
        for batch in batches:  # rows [2 per stream] come from that stream's shard
            ids = batch["decoder_target_tokens"][:, 0] - 10
            assert [i % 4 for i in ids] == [2 * p, 2 * p, 2 * p + 1, 2 * p + 1]


def test_streams_draw_different_random_numbers_and_orders(logged_task):
    name, _ = logged_task
    first, second = (np.stack([e["decoder_target_tokens"][:2] for e in take(
        iter(logged_streams(name)(shard_index=v, num_shards=2)), 24)]) for v in (0, 1))
    assert not np.array_equal(first[:, 1], second[:, 1])  # per-example rng
    assert not np.array_equal(first[:, 0] // 2, second[:, 0] // 2)  # shuffle order


def test_one_stream_is_the_unsharded_dataset():
    dataset = SPAN(shard_index=0, num_shards=1)
    assert_same_batches(take(td.HostBatchIterator(SPAN, 8), 3),
                        take(td.HostBatchIterator(dataset, 8), 3))


def saved(iterators) -> dict:
    """What the checkpoint stores: the merged state, through JSON."""
    return json.loads(json.dumps(td.merge_states([it.get_state() for it in iterators])))


@pytest.mark.parametrize("saved_by, resumed_by", [(1, 1), (1, 2), (2, 1), (2, 4)])
def test_resume_on_another_process_count_gives_the_same_batches(saved_by, resumed_by):
    straight = take(td.HostBatchIterator(SPAN, 8, num_streams=4), 5)
    interrupted = processes(SPAN, 8, 4, saved_by)
    assemble(interrupted, 2)
    state = saved(interrupted)
    assert state["num_streams"] == 4 and len(state["streams"]) == 4 and state["step"] == 2
    resumed = processes(SPAN, 8, 4, resumed_by)
    for it in resumed:
        it.set_state(state)
        assert it.step == 2
    assert_same_batches(assemble(resumed, 3), straight[2:])


def test_pre_streams_state_resumes_as_one_stream():
    straight = take(td.HostBatchIterator(SPAN, 8), 4)
    interrupted = td.HostBatchIterator(SPAN, 8)
    take(interrupted, 2)
    old = {"step": 2, "grain": interrupted.get_state()["streams"][0]}  # the old layout
    resumed = td.HostBatchIterator(SPAN, 8)
    resumed.set_state(json.loads(json.dumps(old)))
    assert_same_batches(take(resumed, 2), straight[2:])
    with pytest.raises(ValueError, match="saved with 1 input streams, but this run uses "
                                         "data_streams=2"):
        td.HostBatchIterator(SPAN, 8, num_streams=2).set_state(old)


@pytest.mark.parametrize("args, message", [
    ((6, 4, 1), r"batch_size=6 does not split into data_streams=4 .* multiple of 4"),
    ((12, 4, 3), r"data_streams=4 does not divide over 3 processes; .*data_streams=12"),
    ((8, 1, 2), r"data_streams=1 does not divide over 2 processes"),
])
def test_batches_and_streams_that_do_not_divide_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        td.HostBatchIterator(SPAN, args[0], num_streams=args[1], process_count=args[2])


def test_restoring_another_stream_count_names_both_and_the_fix():
    state = saved([td.HostBatchIterator(SPAN, 8, num_streams=2)])
    with pytest.raises(ValueError, match=r"saved with 2 input streams, but this run uses "
                                         r"data_streams=4; .* Set --config.data_streams=2"):
        td.HostBatchIterator(SPAN, 8, num_streams=4).set_state(state)


def test_incomplete_or_step_only_states_are_clear_errors():
    it = td.HostBatchIterator(SPAN, 8, num_streams=2, process_count=2, process_index=1)
    with pytest.raises(ValueError, match="has no 'streams' or 'grain' entry"):
        it.set_state({"step": 3})
    only_first = td.HostBatchIterator(SPAN, 8, 2, 2, 0).get_state()
    with pytest.raises(ValueError, match=r"lacks streams \[1\]"):
        it.set_state(only_first)
    with pytest.raises(ValueError, match=r"No process holds streams \[1\]"):
        td.merge_states([only_first])


def test_a_single_dataset_is_one_stream_only():
    with pytest.raises(ValueError, match="One dataset is one stream, but num_streams=2"):
        td.HostBatchIterator(SPAN(), 8, num_streams=2)


def test_process_streams_are_contiguous_blocks():
    assert [list(streams.process_streams(8, 4, p)) for p in range(4)] == [
        [0, 1], [2, 3], [4, 5], [6, 7]]
