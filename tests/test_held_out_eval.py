"""Held-out evaluation reads every validation example once: short batches are filled
with padding rows that every structure's loss weighs 0, tiny splits work with the
default input streams, and a task without validation examples trains with held-out
evaluation off."""

import itertools

import grain
import jax
import numpy as np
import pytest
from conftest import tiny_config
from test_head_finetuning import encoder_config
from test_train_families import family_config

import t5x_like.data as td
from t5x_like import config_lib, structures, train
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.checkpoints import param_sources
from t5x_like.data import pipeline
from t5x_like.data import preprocessors as pp
from t5x_like.engine import partitioning
from t5x_like.engine import trainer as trainer_lib
from t5x_like.structures.head import with_head_labels


def _validation_rows(config, n):
    spec = config_lib.spec_of(config)
    structure = structures.for_config(spec)
    lengths = dict(spec.task_feature_lengths)
    ds = pipeline.build_dataset(spec.task, "validation", lengths, seed=0, shuffle=False,
                                repeat=False, pack=spec.data.pack, vocabulary=None,
                                feature_converter=structure.feature_converter(lengths,
                                                                              pack=spec.data.pack))
    return list(itertools.islice(iter(ds), n))


def _eval_sums(trainer, params, rows):
    batch = {key: np.stack([row[key] for row in rows]) for key in rows[0]}
    return jax.device_get(trainer.eval_step(params, partitioning.global_batch(batch,
                                                                             trainer.mesh)))


def _head_config():
    config = encoder_config(**{"head.kind": "classification", "head.dropout_rate": 0.0})
    config.task, config.task_feature_lengths = "test_head_cls", {"inputs": 16}
    return config_lib.as_config_dict(with_head_labels(config_lib.spec_of(config)).to_dict())


CONFIGS = {"t5": lambda: tiny_config(pack=True),
           "head_classification": _head_config,
           **{name: (lambda name=name: family_config(name)) for name in (
               "bert_span_mlm", "gpt_prefix_lm", "electra_rtd", "bart_denoising")}}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_padding_rows_change_no_evaluation_sum(name):
    config = CONFIGS[name]()
    config.mesh.data, config.mesh.fsdp = 1, 1
    _, trainer = trainer_lib.build_on_devices(config, jax.devices()[:1], 1)
    params = trainer.init_state(0).params
    rows = _validation_rows(config, 3)
    padding = {key: np.zeros_like(value) for key, value in rows[0].items()}
    plain = _eval_sums(trainer, params, rows)
    padded = _eval_sums(trainer, params, rows + [padding] * 3)
    assert float(plain["num_target_tokens"]) > 0
    assert set(plain) == set(padded)
    for key in plain:
        np.testing.assert_allclose(padded[key], plain[key], rtol=2e-5, err_msg=key)


def _counting_stream(sizes):
    """Stream v yields rows {"id": [v * 100 + i]} for i < sizes[v], once."""
    def make(shard_index, num_shards):
        return grain.MapDataset.source([{"id": np.array([shard_index * 100 + i])}
                                        for i in range(sizes[shard_index])]).to_iter_dataset()
    return make


def test_padded_batches_read_every_row_once_and_end_together():
    sizes = [5, 0, 2, 3]  # stream 1 is empty (fewer examples than streams)
    padding = {"id": np.array([-1])}
    batches = list(td.HostBatchIterator(_counting_stream(sizes), 8, 4, padding=padding))
    assert len(batches) == 3  # ceil(5 / 2): the longest stream sets the count
    ids = np.concatenate([b["id"][:, 0] for b in batches])
    real = sorted(int(i) for i in ids if i >= 0)
    assert real == sorted(v * 100 + i for v, n in enumerate(sizes) for i in range(n))
    assert int((ids < 0).sum()) == 3 * 8 - sum(sizes)
    # Rows stay in their stream's place: rows 2v, 2v+1 of each batch are stream v's.
    assert all(int(i) < 0 or int(i) // 100 == (row % 8) // 2 for row, i in enumerate(ids))
    # A process whose streams ended feeds batches of padding only (2 processes: streams 2, 3).
    late = td.HostBatchIterator(_counting_stream(sizes), 8, 4, process_count=2,
                                process_index=1, padding=padding)
    assert len(list(late)) == 2
    np.testing.assert_array_equal(late.padding_batch()["id"], -np.ones((4, 1)))


@pytest.fixture
def tiny_jsonl_task(tmp_path):
    """A task over one 12-line JSONL file, as a user registers one."""
    path = tmp_path / "reviews.jsonl"
    path.write_text("".join(f'{{"inputs": "review {i}", "targets": "{"positive" if i % 2 else "negative"}"}}\n'
                            for i in range(12)))

    def register(holdout_every):
        td.TaskRegistry.remove("tiny_jsonl")
        td.TaskRegistry.add(
            "tiny_jsonl", source=td.JsonlSource([str(path)], holdout_every=holdout_every),
            preprocessors=[pp.Tokenize(), pp.AppendEos(), pp.Truncate()],
            output_features=tasks.features("inputs", "targets"))
    yield register
    td.TaskRegistry.remove("tiny_jsonl")


def test_a_task_without_validation_examples_trains_with_held_out_evaluation_off(
        tmp_path, tiny_jsonl_task, capsys):
    tiny_jsonl_task(holdout_every=100)  # 12 records: none held out
    config = tiny_config(task="tiny_jsonl", num_train_steps=4, eval_every_steps=2,
                         checkpoint_every_steps=4, data_streams=8)
    result = train.run(config, str(tmp_path / "run"), devices=jax.devices()[:1])
    assert result["step"] == 4 and result["eval"] == {}
    said = capsys.readouterr().err
    assert said.count("Held-out evaluation is off") == 1
    assert "holds out one record in 100" in said and "holdout_every=5" in said


def test_a_tiny_validation_split_is_evaluated_whole_with_the_default_streams(
        tmp_path, tiny_jsonl_task):
    tiny_jsonl_task(holdout_every=3)  # 8 training and 4 validation records, 8 streams
    config = tiny_config(task="tiny_jsonl", num_train_steps=2, eval_every_steps=2,
                         checkpoint_every_steps=2, data_streams=8, batch_size=16)
    result = train.run(config, str(tmp_path / "run"), devices=jax.devices()[:1], quiet=True)
    # The held-out loss is that of all 4 examples, each once: the same sums from the
    # saved params over exactly those rows.
    rows = _validation_rows(config, 10)
    assert len(rows) == 4
    _, trainer = trainer_lib.build_on_devices(config, jax.devices()[:1], 1)
    params = param_sources.load_params(param_sources.resolve(str(tmp_path / "run")), 2, config)
    sums = _eval_sums(trainer, trainer.state_from_params(params).params, rows)
    assert result["eval"]["eval_loss"] == pytest.approx(
        float(sums["loss_sum"]) / float(sums["num_target_tokens"]), rel=1e-5)


def test_eval_every_steps_zero_turns_held_out_evaluation_off(tmp_path, capsys):
    config = tiny_config(num_train_steps=2, eval_every_steps=0, checkpoint_every_steps=2)
    result = train.run(config, str(tmp_path / "run"), devices=jax.devices()[:1])
    assert result["eval"] == {}
    assert ("Held-out evaluation is off (evals.held_out.every_steps=0)"
            in capsys.readouterr().err)
