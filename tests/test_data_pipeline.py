"""The seqio-style API: registries, mixtures, shards, packing, exact resume."""

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import t5x_like.data as td
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.data import pipeline
from t5x_like.data import preprocessors as pp
from t5x_like.data.sources import SPLITS

VOCAB = tasks.embedded_vocabulary()


@pytest.fixture
def registered():
    """Registers tasks/mixtures for one test and removes them after."""
    names = []

    def add_task(name, examples, preprocessors=(), **kwargs):
        names.append(name)
        return td.TaskRegistry.add(
            name, source=td.InMemorySource({"train": examples, "validation": examples[:2]}),
            preprocessors=preprocessors,
            output_features=kwargs.pop("output_features", tasks.features("inputs", "targets")),
            **kwargs)

    def add_mixture(name, *args, **kwargs):
        names.append(name)
        return td.MixtureRegistry.add(name, *args, **kwargs)

    yield add_task, add_mixture
    for name in names:
        td.TaskRegistry.remove(name)
        td.MixtureRegistry.remove(name)


def ids_task(add_task, name, n):
    """Examples {"targets": [i + 10]} whose single token names the source example."""
    return add_task(name, [{"i": i} for i in range(n)],
                    [lambda ex, rng: {"targets": np.array([ex["i"] + 10], np.int32)}])


def take(ds, n):
    return list(itertools.islice(iter(ds), n))


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 60), num_shards=st.integers(1, 6), seed=st.integers(0, 1000))
def test_across_shards_every_example_appears_exactly_once_per_epoch(n, num_shards, seed):
    td.TaskRegistry.remove("shard_ids")
    ids_task(lambda name, ex, pre: td.TaskRegistry.add(
        name, source=td.InMemorySource({"train": ex}), preprocessors=pre,
        output_features=tasks.features("targets")), "shard_ids", n)
    try:
        seen = []  # one pass: fewer examples than shards leaves the last shards empty
        for shard in range(num_shards):
            ds = td.get_dataset("shard_ids", {"targets": 4}, seed=seed, shard_index=shard,
                                num_shards=num_shards, num_epochs=1)
            seen += [int(ex["targets"][0]) - 10 for ex in ds]
        assert sorted(seen) == list(range(n))
        # Repeating (training) streams never run dry: with fewer examples than shards,
        # shard v repeats example v mod n.
        for shard in range(num_shards):
            ds = td.get_dataset("shard_ids", {"targets": 4}, seed=seed, shard_index=shard,
                                num_shards=num_shards)
            ids = {int(ex["targets"][0]) - 10 for ex in take(ds, 3)}
            assert ids <= set(range(n)) and ids
            if n < num_shards:
                assert ids == {shard % n}
    finally:
        td.TaskRegistry.remove("shard_ids")


@settings(max_examples=40, deadline=None)
@given(lines=st.lists(st.integers(0, 12), min_size=1, max_size=6), num_shards=st.integers(1, 6),
       lines_per_document=st.integers(1, 2), jsonl=st.booleans(), split=st.sampled_from(SPLITS))
def test_file_shards_hold_every_example_once_and_read_whole_files(
        tmp_path_factory, lines, num_shards, lines_per_document, jsonl, split):
    folder = tmp_path_factory.mktemp("files")
    for f, count in enumerate(lines):
        rows = [json.dumps({"text": f"f{f} l{i}"}) if jsonl else f"f{f} l{i}" for i in range(count)]
        (folder / f"part{f}.txt").write_text("".join(row + "\n" for row in rows))
    pattern = str(folder / "part*.txt")
    source = (td.JsonlSource(pattern, holdout_every=3) if jsonl else
              td.TextFilesSource(pattern, holdout_every=3, lines_per_document=lines_per_document))
    everything = sorted(e["text"] for e in source.get(split))
    shards = []
    for shard in range(num_shards):
        try:
            shards.append([e["text"] for e in source.shard(split, shard, num_shards)])
        except ValueError as e:  # an empty shard is refused, never silently skipped
            if not everything:  # fewer shards would not help: the split itself is empty
                assert "has no examples" in str(e) and "fewer shards" not in str(e)
            else:
                assert "use fewer shards" in str(e)
            return
    assert sorted(text for shard in shards for text in shard) == everything
    if len(lines) >= num_shards:  # whole files: shard i holds only files i, i + n, ...
        for shard, texts in enumerate(shards):
            files = {int(line.split()[0][1:]) for text in texts for line in text.split("\n")}
            assert all(f % num_shards == shard for f in files)


def test_epochs_are_reshuffled_and_seeded(registered):
    add_task, _ = registered
    ids_task(add_task, "ids20", 20)
    ds = td.get_dataset("ids20", {"targets": 4}, seed=1, num_epochs=2)
    order = [int(e["targets"][0]) for e in ds]
    assert sorted(order[:20]) == sorted(order[20:]) == list(range(10, 30))
    assert order[:20] != order[20:]
    again = [int(e["targets"][0]) for e in td.get_dataset("ids20", {"targets": 4}, seed=1,
                                                          num_epochs=2)]
    other = [int(e["targets"][0]) for e in td.get_dataset("ids20", {"targets": 4}, seed=2,
                                                          num_epochs=2)]
    assert again == order and other != order


def test_fixed_rate_mixture_interleaves_at_the_rates(registered):
    add_task, add_mixture = registered
    ids_task(add_task, "mix_a", 10)
    add_task("mix_b", [{"i": 0}], [lambda ex, rng: {"targets": np.array([99], np.int32)}])
    add_mixture("mix_ab", [("mix_a", 3), ("mix_b", 1)])
    tokens = [int(e["targets"][0]) for e in take(td.get_dataset("mix_ab", {"targets": 4}), 400)]
    assert tokens.count(99) == 100


def test_nested_mixtures_multiply_rates_and_sizes_cap(registered):
    add_task, add_mixture = registered
    ids_task(add_task, "n_a", 100)
    ids_task(add_task, "n_b", 10)
    ids_task(add_task, "n_c", 30)
    add_mixture("n_ab", [("n_a", td.rate_num_examples("n_a", maximum=30)),
                         ("n_b", td.rate_num_examples("n_b", maximum=30))])
    assert td.MixtureRegistry.get("n_ab").leaf_rates("train") == pytest.approx(
        {"n_a": 0.75, "n_b": 0.25})
    add_mixture("n_abc", [("n_ab", 1.0), ("n_c", 1.0)])
    assert td.MixtureRegistry.get("n_abc").leaf_rates("train") == pytest.approx(
        {"n_a": 0.375, "n_b": 0.125, "n_c": 0.5})
    add_mixture("n_temp", ["n_a", "n_b"], temperature_alpha=0.5)
    rates = td.MixtureRegistry.get("n_temp").leaf_rates("train")
    assert rates["n_a"] / rates["n_b"] == pytest.approx((100 / 10) ** 0.5)


def test_missing_task_or_mixture_suggests_close_names():
    with pytest.raises(KeyError, match="Did you mean 'embedded_en_mlm'"):
        td.get_dataset("embedded_en_mln", {"inputs": 32})
    with pytest.raises(KeyError, match="Did you mean 'embedded_multilingual_span_corruption'"):
        td.get_dataset("embedded_multilingual_span_corupt", {"inputs": 32})


def test_mixture_of_an_unknown_task_names_it(registered):
    _, add_mixture = registered
    add_mixture("bad_mix", [("embedded_en_spam_corruption", 1.0)])
    with pytest.raises(KeyError, match="Did you mean 'embedded_en_span_corruption'"):
        td.get_dataset("bad_mix", {"inputs": 64, "targets": 16})


# -- exact resume ---------------------------------------------------------------------------

RESUME_CASES = {
    "span_corruption": ("embedded_en_span_corruption", {"inputs": 32, "targets": 8},
                        lambda: td.EncDecFeatureConverter(pack=True, num_packing_bins=4)),
    "lm": ("embedded_en_lm", {"targets": 32}, lambda: td.DecoderFeatureConverter(pack=True)),
    "mlm": ("embedded_en_mlm", {"inputs": 32}, lambda: td.EncoderFeatureConverter()),
    "mixture": ("embedded_multilingual_span_corruption", {"inputs": 48, "targets": 12},
                lambda: td.EncDecFeatureConverter(pack=True, num_packing_bins=2)),
    "instructions": ("embedded_bible_paraphrase_instruct", {"inputs": 64, "targets": 8},
                     lambda: td.EncDecFeatureConverter(pack=True, num_packing_bins=2)),
}


@settings(max_examples=12, deadline=None)
@given(case=st.sampled_from(sorted(RESUME_CASES)), stop=st.integers(0, 6),
       seed=st.integers(0, 100))
def test_resume_from_saved_state_gives_identical_batches(case, stop, seed):
    name, lengths, converter = RESUME_CASES[case]

    def iterator():
        return pipeline.HostBatchIterator(
            td.get_dataset(name, lengths, feature_converter=converter(), seed=seed), 4)

    straight = take(iterator(), 8)
    interrupted = iterator()
    take(interrupted, stop)
    state = json.loads(json.dumps(interrupted.get_state()))  # what the checkpoint stores
    resumed = iterator()
    resumed.set_state(state)
    assert resumed.step == stop
    for a, b in zip(straight[stop:], take(resumed, 8 - stop), strict=False):
        assert a.keys() == b.keys()
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_old_checkpoint_state_without_grain_is_a_clear_error():
    it = pipeline.HostBatchIterator(pipeline.build_dataset(
        "embedded_en_span_corruption", "train", {"inputs": 32, "targets": 8}, seed=0,
        shuffle=True), 4)
    with pytest.raises(ValueError, match="has no 'streams' or 'grain' entry"):
        it.set_state({"step": 3})


@pytest.mark.slow
def test_worker_processes_are_deterministic_and_resume_exactly():
    """Workers each read a slice of the shard, so the worker count is part of the stream's
    definition: fixed workers give a fixed stream, and its state restores exactly."""

    def iterator():
        return pipeline.HostBatchIterator(td.get_dataset(
            "embedded_en_lm", {"targets": 32}, feature_converter=td.DecoderFeatureConverter(),
            seed=3, num_workers=2), 4)

    straight = take(iterator(), 6)
    assert all(np.array_equal(a["decoder_target_tokens"], b["decoder_target_tokens"])
               for a, b in zip(straight, take(iterator(), 6), strict=False))
    interrupted = iterator()
    take(interrupted, 2)
    resumed = iterator()
    resumed.set_state(json.loads(json.dumps(interrupted.get_state())))
    assert all(np.array_equal(a["decoder_target_tokens"], b["decoder_target_tokens"])
               for a, b in zip(straight[2:], take(resumed, 4), strict=False))


# -- bad input --------------------------------------------------------------------------------

def test_empty_documents_are_skipped(registered):
    add_task, _ = registered
    add_task("with_empties", [{"text": ""}, {"text": "   "}, {"text": "a b"}, {"text": ""}],
             [pp.Rekey({"targets": "text"}), pp.Tokenize()], output_features=tasks.features("targets"))
    out = list(td.get_dataset("with_empties", {"targets": 8}, num_epochs=1))
    assert len(out) == 1 and VOCAB.decode(out[0]["targets"]) == "a b"


def test_non_utf8_bytes_become_replacement_characters(registered):
    add_task, _ = registered
    add_task("bad_bytes", [{"text": b"caf\xe9 ok"}, {"text": "fine"}],
             [pp.Rekey({"targets": "text"}), pp.Tokenize()], output_features=tasks.features("targets"))
    texts = sorted(VOCAB.decode(e["targets"]) for e in td.get_dataset("bad_bytes", {"targets": 8},
                                                                      num_epochs=1))
    # The bad byte became U+FFFD before tokenizing (SentencePiece then drops it).
    assert texts == sorted([VOCAB.decode(VOCAB.encode("caf\ufffd ok")), "fine"])


def test_overlong_documents_are_split_or_truncated(registered):
    add_task, _ = registered
    long_text = " ".join(["word"] * 500)
    add_task("long_docs", [{"text": long_text}],
             [pp.Rekey({"targets": "text"}), pp.Tokenize(), pp.AppendEos(), pp.Truncate()],
             output_features=tasks.features("targets"))
    (example,) = list(td.get_dataset("long_docs", {"targets": 16}, num_epochs=1))
    assert example["targets"].size == 16 and example["targets"][-1] == VOCAB.eos_id
    chunks = list(td.get_dataset("embedded_en_lm", {"targets": 16}, num_epochs=1,
                                 split="validation"))
    assert all(c["targets"].size <= 16 for c in chunks) and len(chunks) > 100


@pytest.mark.parametrize("name, lengths, message", [
    ("embedded_en_span_corruption", {"inputs": 128, "targets": 16},
     "set task_feature_lengths.targets to at least 29"),
    ("embedded_en_span_corruption", {"inputs": 1, "targets": 16}, "use at least 2"),
    ("embedded_en_mlm", {"inputs": 2}, r"masked LM \(\[CLS\] x \[SEP\]\) needs "
                                       r"task_feature_lengths\['inputs'\] >= 3, got 2"),
    ("embedded_en_mlm", {"targets": 32}, r"add 'inputs' to task_feature_lengths"),
    ("embedded_en_prefix_lm", {"inputs": 8, "targets": 1}, r"raise task_feature_lengths"
                                                           r"\['targets'\] to 2 or more"),
    ("embedded_en_mlm_nsp", {"inputs": 4}, r"next-sentence pairs .* >= 5, got 4"),
])
def test_lengths_too_short_for_the_objective_are_clear_errors(name, lengths, message):
    with pytest.raises(ValueError, match=message):
        td.get_dataset(name, lengths)


def test_unknown_split_names_the_splits():
    with pytest.raises(ValueError, match="has no split 'test'"):
        td.get_dataset("embedded_en_lm", {"targets": 16}, split="test")


def test_byte_vocabulary_cannot_mask_and_says_so(registered):
    add_task, _ = registered
    add_task("bytes_mlm", [{"text": "hello"}] * 3, tasks.mlm_steps(),
             output_features=tasks.features("inputs", "targets", vocabulary=td.ByteVocabulary()))
    with pytest.raises(ValueError, match="ByteVocabulary has no \\[MASK\\]"):
        td.get_dataset("bytes_mlm", {"inputs": 16})


def test_tokenize_leaves_pretokenized_features_alone(registered):
    add_task, _ = registered
    add_task("pretokenized", [{"targets": np.array([5, 6, 7])}, {"targets": "hello"}],
             [pp.Tokenize()], output_features=tasks.features("targets"))
    out = list(td.get_dataset("pretokenized", {"targets": 8}, num_epochs=1, shuffle=False))
    assert out[0]["targets"].tolist() == [5, 6, 7]
    assert out[1]["targets"].tolist() == VOCAB.encode("hello")


def test_bad_jsonl_records_are_named_by_file_and_line(tmp_path):
    from t5x_like.data import feature_converters
    with pytest.raises(ValueError, match=r"JsonlSource holdout_every=-1; use a positive N"):
        td.JsonlSource([str(tmp_path / "any.jsonl")], holdout_every=-1)
    with pytest.raises(ValueError, match=r"TextFilesSource holdout_every=2.5"):
        td.TextFilesSource([str(tmp_path / "any.txt")], holdout_every=2.5)
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"inputs": "a", "targets": "b"}\n{"inputs": "c", targets: 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON \(Expecting property"):
        td.JsonlSource([str(bad_json)], holdout_every=0).get("train")
    bad_json.write_text('{"inputs": "a", "targets": "b"}\n\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:3: a JSON list, not an object"):
        td.JsonlSource([str(bad_json)], holdout_every=0).get("train")
    lacking = tmp_path / "lacking.jsonl"
    lacking.write_text('{"inputs": "a", "targets": "b"}\n\n{"inputs": "c"}\n')
    td.TaskRegistry.remove("lacking_jsonl")
    td.TaskRegistry.add("lacking_jsonl", source=td.JsonlSource([str(lacking)], holdout_every=0),
                        preprocessors=[pp.Tokenize(), pp.AppendEos()],
                        output_features=tasks.features("inputs", "targets"))
    try:
        ds = td.build_dataset("lacking_jsonl", "train", {"inputs": 8, "targets": 8}, seed=0,
                              shuffle=False, repeat=False)
        with pytest.raises(feature_converters.MissingFeatures,
                           match=r"lacking.jsonl:3 has no 'targets' \(its fields: 'inputs'\)"):
            list(ds)
    finally:
        td.TaskRegistry.remove("lacking_jsonl")
