"""Multilingual pretraining (issue 15 part 3): temperature sampling of the vocabulary's
text and of the XLM-R / mBART mixtures against q_i = p_i^α / Σ p_j^α, mBART's
language-id tokens, and the published sizes of XLM-R base and mBART-large-cc25."""

import collections
import itertools

import numpy as np
import pytest

from t5x_like import train_vocab
from t5x_like.builtin_tasks import multilingual as multilingual_tasks
from t5x_like.data import EncDecFeatureConverter, InMemorySource, MixtureRegistry, TaskRegistry, dataset_providers
from t5x_like.data import preprocessors as pp
from t5x_like.data.dataset_providers import Feature
from t5x_like.data.vocabularies import ByteVocabulary
from t5x_like.models import bart

ALPHAS = (1.0, 0.7, 0.3)


def formula(sizes, alpha):
    """Written out independently of the code under test."""
    total = sum(sizes.values())
    powered = {k: (v / total) ** alpha for k, v in sizes.items()}
    return {k: v / sum(powered.values()) for k, v in powered.items()}


@pytest.mark.parametrize("alpha", ALPHAS)
def test_temperature_probabilities_equal_the_formula(alpha):
    sizes = {"en": 17_655_716, "es": 930_309, "ja": 351_288, "udhr": 1_326_136}
    got = dataset_providers.temperature_probabilities(sizes, alpha)
    want = formula(sizes, alpha)
    assert got.keys() == want.keys()
    for name in sizes:
        assert got[name] == pytest.approx(want[name], rel=1e-12)
    assert sum(got.values()) == pytest.approx(1.0)
    if alpha == 1.0:  # size-proportional
        assert got["en"] == pytest.approx(sizes["en"] / sum(sizes.values()))
    else:  # low-resource languages gain, the largest loses
        assert got["ja"] > formula(sizes, 1.0)["ja"] and got["en"] < formula(sizes, 1.0)["en"]


def test_temperature_sample_gives_each_source_its_share_and_repeats_small_ones():
    texts = {"big": [f"big line {i:05d}" for i in range(4000)],       # 14 chars a line
             "small": [f"small {i:03d}" for i in range(40)],          # 9 chars a line
             "tiny": ["tiny text"]}
    lines, report = train_vocab.temperature_sample(texts, 0.3, budget_chars=20_000, seed=0)
    q = formula({name: sum(map(len, t)) for name, t in texts.items()}, 0.3)
    for name, row in report.items():
        assert row["q"] == pytest.approx(q[name])
        # within one line of the target
        assert abs(row["sampled_chars"] - q[name] * 20_000) <= max(map(len, texts[name]))
    assert report["tiny"]["repeats"] > 100 and report["big"]["repeats"] < 1
    assert lines.count("tiny text") == pytest.approx(q["tiny"] * 20_000 / 9, abs=1)
    again, _ = train_vocab.temperature_sample(texts, 0.3, budget_chars=20_000, seed=0)
    assert again == lines  # deterministic
    other, _ = train_vocab.temperature_sample(texts, 0.3, budget_chars=20_000, seed=1)
    assert other != lines


def test_multilingual_vocabulary_has_language_ids_and_covers_the_scripts():
    vocab = multilingual_tasks.multilingual_vocabulary()
    ids = {lang: multilingual_tasks.language_id(lang) for lang in multilingual_tasks.LANGUAGES}
    assert len(set(ids.values())) == 4 and all(4 < i < 20 for i in ids.values())
    assert vocab.vocab_size == 8192
    for text in ("Y dijo Dios: Sea la luz", "元始に神天地を創造たまへり", "Всички хора се раждат свободни"):
        tokens = vocab.encode(text)
        assert vocab.unk_id not in tokens and vocab.decode(tokens) == text
    # Japanese got pieces of its own (not only byte fallback): temperature sampling at work.
    pieces = vocab.encode("元始に神天地を創造たまへり")
    assert len(pieces) < 2 * len("元始に神天地を創造たまへり")


@pytest.mark.parametrize("mixture,alpha", [("multilingual_mlm", 0.3), ("multilingual_mbart", 0.7)])
def test_mixture_rates_equal_the_formula_over_characters(mixture, alpha):
    rates = MixtureRegistry.get(mixture).leaf_rates("train")
    suffix = mixture.split("_", 1)[1]
    chars = {lang: sum(len(ex["text"]) for ex in multilingual_tasks.language_source(lang).get("train"))
             for lang in multilingual_tasks.LANGUAGES}
    want = formula(chars, alpha)
    for lang in multilingual_tasks.LANGUAGES:
        assert rates[f"multilingual_{lang}_{suffix}"] == pytest.approx(want[lang], rel=1e-9)


def test_mixture_draws_examples_at_the_rates():
    """Sampling, not only the numbers: 2,000 examples of a three-task mixture."""
    sizes = {"a": 1000, "b": 100, "c": 10}
    names = []
    for name, n in sizes.items():
        task = f"_ml_test_{name}"
        TaskRegistry.remove(task)
        TaskRegistry.add(task, InMemorySource({"train": [{"text": name * 5}] * n}),
                         [pp.Rekey({"targets": "text"}), pp.Tokenize()],
                         {"targets": Feature(ByteVocabulary(), add_eos=False)})
        names.append(task)
    MixtureRegistry.remove("_ml_test_mix")
    mixture = MixtureRegistry.add("_ml_test_mix", multilingual_tasks.character_temperature_rates(
        names, 0.3, size_fn=lambda task, split: sizes[task[-1]] * 5))
    try:
        want = formula(sizes, 0.3)
        assert {t[-1]: r for t, r in mixture.leaf_rates("train").items()} == pytest.approx(want)
        ds = mixture.get_dataset("train", {"targets": 8}, seed=3)
        counts = collections.Counter(chr(int(ex["targets"][0]) - 3)
                                     for ex in itertools.islice(ds, 2000))
        for name, q in want.items():  # 4 standard deviations of a binomial
            assert abs(counts[name] / 2000 - q) < 4 * np.sqrt(q * (1 - q) / 2000), counts
    finally:
        MixtureRegistry.remove("_ml_test_mix")
        for task in names:
            TaskRegistry.remove(task)


def test_mbart_denoising_examples_end_with_eos_and_the_language_id():
    vocab = multilingual_tasks.multilingual_vocabulary()
    for lang in ("es", "ja"):
        lang_id = multilingual_tasks.language_id(lang)
        ds = TaskRegistry.get(f"multilingual_{lang}_mbart").get_dataset(
            "validation", {"inputs": 48, "targets": 48}, shuffle=False)
        for ex in itertools.islice(ds, 3):
            for key in ("inputs", "targets"):
                assert list(ex[key][-2:]) == [vocab.eos_id, lang_id]
                assert len(ex[key]) <= 48 and lang_id not in ex[key][:-1]
            assert vocab.mask_id in ex["inputs"] and vocab.mask_id not in ex["targets"]


@pytest.mark.parametrize("src,tgt", [("en", "es"), ("es", "en")])
def test_translation_examples_place_language_ids_as_mbart(src, tgt):
    vocab = multilingual_tasks.multilingual_vocabulary()
    ds = TaskRegistry.get(f"multilingual_bible_{src}_{tgt}").get_dataset(
        "validation", {"inputs": 64, "targets": 64}, shuffle=False)
    examples = list(itertools.islice(ds, 4))
    src_id, tgt_id = (multilingual_tasks.language_id(x) for x in (src, tgt))
    for ex in examples:  # source: tokens </s> <src>; target: tokens </s> <tgt>
        assert list(ex["inputs"][-2:]) == [vocab.eos_id, src_id]
        assert list(ex["targets"][-2:]) == [vocab.eos_id, tgt_id]
        assert ex["targets_pretokenized"].startswith(vocab.decode(ex["targets"]))  # maybe cut
    # The decoder starts with <tgt>: the converter shifts right (0 first), the model
    # puts the example's last target token, its language id, there.
    batch = EncDecFeatureConverter()(examples, {"inputs": 64, "targets": 64})
    decoder_inputs = np.stack([b["decoder_input_tokens"] for b in batch])
    targets = np.stack([b["decoder_target_tokens"] for b in batch])
    started = np.asarray(bart.mbart_decoder_inputs(decoder_inputs, targets, pad_id=0))
    assert (started[:, 0] == tgt_id).all()
    np.testing.assert_array_equal(started[:, 1:], decoder_inputs[:, 1:])


def test_mbart_decoder_inputs_restart_with_the_language_id_in_packed_rows():
    #          example 1: 5 6 </s> L1      example 2: 7 </s> L2     padding
    targets = np.array([[5, 6, 1, 11, 7, 1, 12, 0, 0]])
    segments = np.array([[1, 1, 1, 1, 2, 2, 2, 0, 0]])
    shifted = np.array([[0, 5, 6, 1, 0, 7, 1, 0, 0]])  # the converter's, 0 at segment starts
    got = np.asarray(bart.mbart_decoder_inputs(shifted, targets, 0, segments))
    np.testing.assert_array_equal(got, [[11, 5, 6, 1, 12, 7, 1, 0, 0]])


def test_published_sizes_equal_the_hugging_face_models():
    """278,295,186 = XLMRobertaForMaskedLM(xlm-roberta-base's config); 611,101,867 =
    MBartForConditionalGeneration(mbart-large-cc25's) 610,851,840 parameters plus its
    final_logits_bias buffer (a parameter here). Both counted by transformers on the meta
    device (docs/multilingual.md); the papers round them to 270M and 610M."""
    import pathlib

    from t5x_like import config_lib
    from t5x_like.engine import trainer as trainer_lib

    configs = pathlib.Path(__file__).resolve().parents[1] / "configs"
    for name, count in (("xlmr_base", 278_295_186), ("mbart_large_cc25", 611_101_867)):
        config = config_lib.load_config_file(str(configs / f"{name}.py"))
        config_lib.validate(config)
        shapes = trainer_lib.flat_parameter_shapes(config.model.to_dict())
        assert sum(int(np.prod(s)) for _, s in shapes) == count, name


@pytest.mark.slow
def test_multilingual_vocabulary_rebuilds_byte_identically(tmp_path):
    """data/vocab/multilingual_8k.model is what ``train_vocab --multilingual`` writes (~40 s)."""
    out = tmp_path / "multilingual.model"
    train_vocab.main(["--multilingual", "--output", str(out)])
    assert out.read_bytes() == open(multilingual_tasks.vocab_model_path(), "rb").read()
