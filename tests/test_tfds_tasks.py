"""TFDS tasks on ``tfds.testing.mock_data``: no network and no TensorFlow (``tfds.data_source``)."""

import itertools

import pytest
import tensorflow_datasets as tfds

import t5x_like.data as td
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.data import sources


@pytest.fixture
def mock_tfds():
    with tfds.testing.mock_data(num_examples=12, policy=tfds.testing.MockPolicy.USE_CODE):
        yield


def take(name, lengths, n=3, **kwargs):
    return list(itertools.islice(iter(td.get_dataset(name, lengths, **kwargs)), n))


def test_c4_span_corruption_and_lm(mock_tfds):
    for example in take("c4_span_corruption", {"inputs": 32, "targets": 8}, shard_index=1,
                        num_shards=2, feature_converter=td.EncDecFeatureConverter()):
        assert example["encoder_input_tokens"].shape == (32,)
        assert example["decoder_target_tokens"][0] == tasks.embedded_vocabulary().sentinel_id(0)
    for example in take("c4_lm", {"targets": 16}, split="validation"):
        assert example["targets"].shape == (16,)


def test_wikipedia_mlm_holds_out_one_percent(mock_tfds):
    task = td.TaskRegistry.get("wikipedia_mlm")
    # The mock ignores split slicing, so check what is asked of TFDS.
    assert dict(task.source.split_map) == {"train": "train[1%:]", "validation": "train[:1%]"}
    assert task.num_input_examples("validation") > 0
    for example in take("wikipedia_mlm", {"inputs": 24}):
        assert example["loss_weights"].sum() == round(22 * 0.15)


def test_mc4_is_a_temperature_mixture_of_byte_tasks(mock_tfds):
    rates = td.MixtureRegistry.get("mc4_span_corruption").leaf_rates("train")
    assert len(rates) == 21 and max(rates.values()) == pytest.approx(min(rates.values()))
    for example in take("mc4_span_corruption", {"inputs": 32, "targets": 8}):
        assert example["inputs"].max() < td.ByteVocabulary().vocab_size


def test_mc4_samples_languages_by_the_temperature_formula(monkeypatch):
    """Languages of unequal sizes (the mock gives every language the same count, where any
    alpha gives equal rates): q_i = p_i^0.3 / sum_j p_j^0.3 (mT5 and XLM-R, alpha 0.3),
    written out here rather than taken from the registry's code."""
    mixture = td.MixtureRegistry.get("mc4_span_corruption")
    names = [name for name, _ in mixture.components]
    sizes = {name: 1000 * (i + 1) ** 3 for i, name in enumerate(names)}  # 1000 .. 9.26M
    monkeypatch.setattr(td.Task, "num_input_examples", lambda task, split: sizes[task.name])
    total = sum(sizes.values())
    powered = {name: (size / total) ** 0.3 for name, size in sizes.items()}
    expected = {name: value / sum(powered.values()) for name, value in powered.items()}
    got = mixture.leaf_rates("validation")  # a split no other test has sized
    assert got == pytest.approx(expected, rel=1e-9)
    proportional = sizes[names[-1]] / total
    assert got[names[-1]] < 0.5 * proportional  # the largest language is damped


def test_unprepared_tfds_dataset_says_how_to_prepare_it(tmp_path):
    source = sources.TfdsSource("c4/en:3.1.0", data_dir=str(tmp_path),
                                builder_module="tensorflow_datasets.text.c4")
    with pytest.raises(FileNotFoundError, match="tfds build c4/en --file_format=array_record"):
        source.get("train")
