import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.data import feature_converters, pipeline, preprocessors

VOCAB_SIZE = 1000
EOS = 1


def merge_back(inputs, targets, vocab_size=VOCAB_SIZE):
    """Replaces each sentinel in inputs by the target tokens that follow it."""
    inputs, targets = list(inputs[:-1]), list(targets[:-1])  # drop EOS
    spans, current = {}, None
    for token in targets:
        if token >= vocab_size - 100:
            current = token
            spans[current] = []
        else:
            spans[current].append(token)
    out = []
    for token in inputs:
        out.extend(spans[token] if token >= vocab_size - 100 else [token])
    return out


# (inputs_length, noise_density, mean span, extra tokens inputs/targets) -> what
# t5.data.preprocessors.random_spans_helper (t5 0.9.4) returns; benchmarks/seqio_parity.py
# compares the whole grid when t5 is installed.
@pytest.mark.parametrize("args, expected", [
    ((512, 0.15, 3.0, 1, 1), (568, 114)),   # T5's pretraining lengths
    ((1024, 0.15, 3.0, 1, 1), (1137, 229)),
    ((128, 0.15, 3.0, 1, 1), (141, 29)),
    ((100, 0.3, 3.0, 1, 1), (124, 50)),
    ((200, 0.5, 8.0, 1, 1), (354, 200)),
    ((200, 0.5, 8.0, 0, 0), (398, 200)),
    # T5's density-0.5 trim compares targets with the inputs length the chosen
    # tokens_length gives (here 63 and 83), not with the requested one.
    ((64, 0.5, 1.0, 2, 1), (63, 65)),
    ((84, 0.5, 1.0, 2, 1), (83, 85)),
    ((626, 0.5, 3.0, 2, 1), (751, 502)),
])
def test_random_spans_helper_matches_t5(args, expected):
    assert preprocessors.random_spans_helper(*args) == expected


# (length, density, mean span) -> (noise tokens, noise spans) of T5's random_spans_noise_mask,
# which rounds float32 products: 190 x 0.15 = 28.500001 -> 29 (float64 gives 28).
@pytest.mark.parametrize("length, density, mean_span, expected", [
    (568, 0.15, 3.0, (85, 28)),
    (190, 0.15, 3.0, (29, 10)),
    (350, 0.15, 3.0, (53, 18)),
    (670, 0.15, 1.0, (101, 101)),
    (95, 0.3, 3.0, (29, 10)),
    (95, 0.3, 8.0, (29, 4)),
    (350, 0.15, 8.0, (53, 7)),
])
def test_noise_mask_counts_match_t5_float32_rounding(length, density, mean_span, expected):
    mask = preprocessors.random_spans_noise_mask(length, density, mean_span,
                                                 np.random.default_rng(0))
    starts = mask & ~np.concatenate([[False], mask[:-1]])
    assert (int(mask.sum()), int(starts.sum())) == expected


def test_zero_noise_density_masks_nothing_as_t5():
    assert not preprocessors.random_spans_noise_mask(10, 0.0, 3.0, np.random.default_rng(0)).any()


@settings(max_examples=200, deadline=None)
@given(length=st.integers(1, 600), seed=st.integers(0, 2**31 - 1),
       density=st.sampled_from([0.15, 0.3, 0.5]), mean_span=st.sampled_from([1.0, 3.0, 8.0]))
def test_inputs_and_targets_merge_back_to_the_original(length, seed, density, mean_span):
    tokens = np.random.default_rng(seed).integers(10, VOCAB_SIZE - 100, size=length, dtype=np.int32)
    mask = preprocessors.random_spans_noise_mask(length, density, mean_span, np.random.default_rng(seed))
    if np.sum(mask & ~np.concatenate([[False], mask[:-1]])) > 100:
        with pytest.raises(ValueError, match="only 100 sentinels"):
            preprocessors.span_corruption(tokens, np.random.default_rng(seed), vocab_size=VOCAB_SIZE,
                                          eos_id=EOS, noise_density=density,
                                          mean_noise_span_length=mean_span)
        return
    out = preprocessors.span_corruption(tokens, np.random.default_rng(seed), vocab_size=VOCAB_SIZE,
                                        eos_id=EOS, noise_density=density,
                                        mean_noise_span_length=mean_span)
    assert out["inputs"][-1] == EOS and out["targets"][-1] == EOS
    assert merge_back(out["inputs"], out["targets"]) == tokens.tolist()


def test_sentinels_count_down_from_extra_id_0_in_order():
    tokens = np.arange(10, 210, dtype=np.int32)
    out = preprocessors.span_corruption(tokens, np.random.default_rng(0), vocab_size=VOCAB_SIZE,
                                        eos_id=EOS)
    sentinels_in = [t for t in out["inputs"] if t >= VOCAB_SIZE - 100]
    sentinels_out = [t for t in out["targets"] if t >= VOCAB_SIZE - 100]
    assert sentinels_in == sentinels_out == list(range(VOCAB_SIZE - 1, VOCAB_SIZE - 1 - len(sentinels_in), -1))
    assert out["targets"][0] == VOCAB_SIZE - 1  # targets open with <extra_id_0>


def test_noise_mask_has_t5_counts():
    mask = preprocessors.random_spans_noise_mask(568, 0.15, 3.0, np.random.default_rng(3))
    assert mask.sum() == round(568 * 0.15)
    starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
    assert len(starts) == round(round(568 * 0.15) / 3.0)
    assert not mask[0]  # a non-noise span comes first


def first(ds, n):
    return list(itertools.islice(iter(ds), n))


def test_quickstart_examples_fill_inputs_exactly():
    lengths = {"inputs": 128, "targets": 32}
    ds = pipeline.build_dataset("embedded_en_span_corruption", "train", lengths, seed=0, shuffle=True)
    vocab = tasks.embedded_vocabulary()
    for example in first(ds, 20):
        assert (example["encoder_input_tokens"] > 0).all()
        assert example["decoder_target_tokens"][0] == vocab.sentinel_id(0)
        weights = example["decoder_loss_weights"]
        assert weights.sum() == (example["decoder_target_tokens"] > 0).sum() <= 32


def test_examples_are_a_pure_function_of_the_seed():
    lengths = {"inputs": 64, "targets": 16}
    a, b, c = (first(pipeline.build_dataset("embedded_en_span_corruption", "train", lengths,
                                            seed=seed, shuffle=True), 5) for seed in (5, 5, 6))
    for x, y in zip(a, b, strict=False):
        assert all(np.array_equal(x[k], y[k]) for k in x)
    assert not np.array_equal(a[0]["encoder_input_tokens"], c[0]["encoder_input_tokens"])


def test_targets_too_short_for_span_corruption_is_a_clear_error():
    with pytest.raises(ValueError, match="set task_feature_lengths.targets to at least 29"):
        pipeline.build_dataset("embedded_en_span_corruption", "train",
                               {"inputs": 128, "targets": 16}, seed=0, shuffle=True)


def test_decoder_inputs_are_targets_shifted_right():
    converter = feature_converters.EncDecFeatureConverter()
    out = converter({"inputs": np.array([5, 6, 1]), "targets": np.array([7, 8, 1])},
                    {"inputs": 4, "targets": 5})
    assert out["decoder_input_tokens"].tolist() == [0, 7, 8, 1, 0]
    assert out["decoder_target_tokens"].tolist() == [7, 8, 1, 0, 0]
    assert out["decoder_loss_weights"].tolist() == [1, 1, 1, 0, 0]
    assert out["encoder_input_tokens"].tolist() == [5, 6, 1, 0]


def test_unknown_task_suggests_close_names():
    with pytest.raises(KeyError, match="Did you mean 'embedded_en_span_corruption'"):
        pipeline.build_dataset("embedded_en_span_corupton", "train", {"inputs": 64, "targets": 16},
                               seed=0, shuffle=True)


def test_missing_corpus_file_names_the_path():
    from t5x_like.data import sources
    with pytest.raises(FileNotFoundError, match="No file matches 'nowhere/\\*.txt.gz'"):
        sources.TextLineSource(["nowhere/*.txt.gz"]).documents()


def test_unknown_split_lists_the_splits():
    from t5x_like.data import sources
    with pytest.raises(ValueError, match="Unknown split 'test'"):
        sources.TextLineSource(["x"], split="test")


def test_registering_a_task_name_twice_is_refused():
    from t5x_like.data import TaskRegistry
    task = TaskRegistry.get("embedded_en_span_corruption")
    with pytest.raises(ValueError, match="already registered"):
        TaskRegistry.add(task)


def test_empty_example_is_a_clear_error():
    with pytest.raises(ValueError, match="empty example"):
        preprocessors.span_corruption(np.array([], np.int32), np.random.default_rng(0),
                                      vocab_size=VOCAB_SIZE, eos_id=EOS)
