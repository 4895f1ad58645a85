"""Preprocessors for every objective: statistics, structure, and the task streams they feed."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import t5x_like.data as td
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.data import preprocessors as pp

VOCAB = tasks.embedded_vocabulary()


def first(name, lengths, n=4, converter=None, seed=0):
    return list(itertools.islice(iter(td.get_dataset(name, lengths, feature_converter=converter,
                                                     seed=seed)), n))


def test_mlm_selection_and_replacement_rates_over_a_million_tokens():
    rng = np.random.default_rng(0)
    selected = masked = random = kept = total = 0
    for _ in range(1000):
        tokens = rng.integers(300, 8000, size=1000).astype(np.int32)
        out = pp.bert_mask(tokens, np.ones(1000, bool), rng, mask_id=4, random_low=263,
                           random_high=8092)
        sel = out["loss_weights"] > 0
        total += tokens.size
        selected += sel.sum()
        masked += (out["inputs"][sel] == 4).sum()
        kept += (out["inputs"][sel] == tokens[sel]).sum()
        random += ((out["inputs"][sel] != 4) & (out["inputs"][sel] != tokens[sel])).sum()
        assert (out["targets"] == tokens).all()
        assert (out["inputs"][~sel] == tokens[~sel]).all()  # nothing changes outside the selection
    assert total == 1_000_000
    assert abs(selected / total - 0.15) < 1e-3
    assert abs(masked / selected - 0.8) < 0.01
    assert abs(random / selected - 0.1) < 0.01
    assert abs(kept / selected - 0.1) < 0.01


def test_mlm_never_touches_cls_sep_or_padding():
    ex = first("embedded_en_mlm", {"inputs": 32}, n=20)
    for e in ex:
        assert e["inputs"][0] == VOCAB.cls_id and e["inputs"][-1] == VOCAB.sep_id
        assert e["loss_weights"][0] == e["loss_weights"][-1] == 0
        assert e["loss_weights"].sum() == round(30 * 0.15)


def test_whole_word_masking_takes_words_whole():
    for e in first("embedded_en_mlm_whole_word", {"inputs": 64}, n=20):
        starts = VOCAB.word_start_mask(e["targets"])
        words = np.cumsum(starts)
        sel = e["loss_weights"] > 0
        for w in np.unique(words[sel]):
            inner = (words == w) & ~np.isin(e["targets"], VOCAB.special_ids)
            assert sel[inner].all(), "a word was partly selected"


def test_spanbert_spans_are_whole_words_at_most_ten_long_within_budget():
    rng = np.random.default_rng(1)
    word_start = rng.random(5000) < 0.7
    maskable = np.ones(5000, bool)
    sel, spans = pp.select_spans(maskable, word_start, rng)
    assert round(5000 * 0.15) - 30 <= sel.sum() <= round(5000 * 0.15)
    ids = np.cumsum(word_start)
    for begin, end in spans:
        assert word_start[begin] and (end == 5000 or word_start[end])
        assert len(np.unique(ids[begin:end])) <= 10
    lengths = [len(np.unique(ids[b:e])) for b, e in spans]
    assert 3.0 < np.mean(lengths) < 4.3  # truncated Geometric(0.2) on 1..10: mean 3.8 words


def test_spanbert_replaces_whole_spans_the_same_way():
    for e in first("embedded_en_span_mlm", {"inputs": 128}, n=10):
        sel = e["loss_weights"] > 0
        is_mask = e["inputs"] == VOCAB.mask_id
        edges = np.flatnonzero(np.diff(np.concatenate([[0], sel.astype(int), [0]])))
        for begin, end in zip(edges[::2], edges[1::2], strict=False):
            assert is_mask[begin:end].all() or not is_mask[begin:end].any()


def test_next_sentence_pairs_are_half_random_with_segment_ids():
    examples = first("embedded_en_mlm_nsp", {"inputs": 64}, n=200)
    labels = [int(e["next_sentence_labels"]) for e in examples]
    assert 0.4 < np.mean(labels) < 0.6
    for e in examples[:50]:
        targets, types = e["targets"], e["token_type_ids"]
        seps = np.flatnonzero(targets == VOCAB.sep_id)
        assert targets[0] == VOCAB.cls_id and len(seps) == 2 and seps[1] == targets.size - 1
        assert (types[:seps[0] + 1] == 0).all() and (types[seps[0] + 1:] == 1).all()
        assert targets.size <= 64


def test_prefix_lm_splits_inside_the_budget():
    rng = np.random.default_rng(0)
    tokens = np.arange(10, 41, dtype=np.int32)  # 31 tokens, budget 16 + 15
    for _ in range(200):
        inputs, targets = pp.prefix_lm_split(tokens, rng, 16, 15)
        assert 1 <= inputs.size <= 16 and 1 <= targets.size <= 15
        assert np.concatenate([inputs, targets]).tolist() == tokens.tolist()
    for e in first("embedded_en_prefix_lm", {"inputs": 16, "targets": 16}, n=20):
        assert e["inputs"].size <= 16 and e["targets"].size <= 16 and e["targets"][-1] == 1


def test_causal_lm_chunks_are_full_and_documents_end_with_eos():
    examples = first("embedded_en_lm", {"targets": 64}, n=20)
    assert all(e["targets"].size == 64 for e in examples)
    assert sum((e["targets"] == VOCAB.eos_id).sum() for e in examples) > 5


@pytest.mark.parametrize("variant", pp.denoising.VARIANTS)
def test_denoising_variants(variant):
    rng = np.random.default_rng(3)
    tokens = rng.integers(300, 8000, 200).astype(np.int32)
    inputs, targets = pp.denoise(tokens, rng, variant, vocab_size=8192, mask_id=4,
                                 random_low=263, random_high=8092)
    if variant in ("bert_style", "mass_style", "deshuffle"):
        assert targets.tolist() == tokens.tolist()
    if variant == "deshuffle":
        assert sorted(inputs.tolist()) == sorted(tokens.tolist()) and inputs.tolist() != tokens.tolist()
    if variant == "mass_style":
        changed = inputs != tokens
        assert (inputs[changed] == 4).all() and 10 < changed.sum() < 50
    if variant == "iid_drop":
        assert inputs.size + targets.size == 200
    if variant in ("span_corruption", "iid_replace_spans"):
        merged, spans, current = [], {}, None
        for t in targets.tolist():
            if t >= 8092:
                current = t
                spans[t] = []
            else:
                spans[current].append(t)
        for t in inputs.tolist():
            merged.extend(spans[t] if t >= 8092 else [t])
        assert merged == tokens.tolist()


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 300), seed=st.integers(0, 2**31 - 1))
def test_text_infilling_covers_the_rate_with_one_mask_per_span(n, seed):
    tokens = np.arange(100, 100 + n, dtype=np.int32)
    out = pp.text_infilling(tokens, np.random.default_rng(seed), 0.3, mask_id=4)
    kept = out[out != 4]
    assert np.all(np.diff(kept) > 0)  # order kept, nothing invented
    assert n - kept.size == round(n * 0.3)  # exactly the budget is removed


def test_sentence_permutation_and_rotation_keep_the_tokens():
    rng = np.random.default_rng(0)
    tokens = np.arange(100, 130, dtype=np.int32)
    ends = np.zeros(30, bool)
    ends[[4, 9, 19, 29]] = True
    permuted = pp.sentence_permutation(tokens, ends, rng)
    assert sorted(permuted.tolist()) == tokens.tolist()
    rotated = pp.document_rotation(tokens, rng)
    k = rotated.tolist().index(100)
    assert rotated.tolist()[k:] + rotated.tolist()[:k] == tokens.tolist()


def test_bart_task_targets_are_the_original_text():
    for e in first("embedded_en_bart", {"inputs": 64, "targets": 64}, n=10):
        assert (e["inputs"] == VOCAB.mask_id).any()
        assert e["targets"][-1] == VOCAB.eos_id and e["inputs"].size <= e["targets"].size + 5


def test_multilingual_mixture_uses_bytes_and_temperature_rates():
    mixture = td.MixtureRegistry.get("embedded_multilingual_span_corruption")
    rates = mixture.leaf_rates("train")
    sizes = {t: td.TaskRegistry.get(t).num_input_examples("train") for t in rates}
    total = sum(sizes.values())
    expected = {t: (n / total) ** 0.3 for t, n in sizes.items()}
    norm = sum(expected.values())
    for t in rates:
        assert rates[t] == pytest.approx(expected[t] / norm)
    example = next(iter(td.get_dataset("embedded_multilingual_span_corruption",
                                       {"inputs": 64, "targets": 16})))
    assert example["inputs"].size == 64 and example["inputs"].max() < 384


def test_more_noise_spans_than_sentinels_is_a_clear_error():
    with pytest.raises(ValueError, match="about 261 noise spans but the vocabulary has 100 "
                                         "sentinels; use shorter inputs"):
        td.get_dataset("embedded_en_iid_replace_spans", {"inputs": 2048, "targets": 2048})
