"""GLUE and SuperGLUE tasks on ``tfds.testing.mock_data`` (offline), their formats,
postprocessors, metrics, mixtures and benchmark averages."""

import itertools
import subprocess
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds

import t5x_like.data as td
from t5x_like.builtin_tasks import glue
from t5x_like.data import sources

LENGTHS = {"inputs": 64, "targets": 16}
CLASSIFICATION = [name for name, b in glue.BENCHMARKS.items() if b.labels]


@pytest.fixture
def mock_tfds():
    with tfds.testing.mock_data(num_examples=12, policy=tfds.testing.MockPolicy.USE_CODE):
        yield


def take(name, split="validation", n=4, lengths=LENGTHS, **kwargs):
    ds = td.get_dataset(name, lengths, split=split, shuffle=False, num_epochs=1, **kwargs)
    return list(itertools.islice(iter(ds), n))


def test_registering_reads_no_tfds():
    code = ("import sys, t5x_like.builtin_tasks, t5x_like.data as td; "
            "assert 'glue_cola_v002' in td.TaskRegistry.names(); "
            "assert 'tensorflow_datasets' not in sys.modules, 'TFDS imported at registration'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_task_names_and_label_words_match_tfds():
    from tensorflow_datasets.text import glue as tfds_glue
    from tensorflow_datasets.text import super_glue as tfds_super_glue
    assert set(glue.BENCHMARKS) == (
        {f"glue_{n}_v002" for n in "cola sst2 mrpc qqp stsb mnli qnli rte wnli".split()}
        | {f"super_glue_{n}_v102" for n in "boolq cb copa multirc record rte wic wsc".split()})
    configs = {"glue": tfds_glue.Glue.builder_configs,
               "super_glue": tfds_super_glue.SuperGlue.builder_configs}
    for name in CLASSIFICATION:
        b = glue.BENCHMARKS[name]
        assert td.TaskRegistry.get(name).label_options == b.labels
        assert b.labels == tuple(configs[b.collection][b.config].label_classes), name
    assert set(glue.BENCHMARKS) - set(CLASSIFICATION) == {"glue_stsb_v002",
                                                          "super_glue_record_v102"}
    for name in ("glue_stsb_v002", "super_glue_record_v102"):  # decoded, not rank-classified
        assert td.TaskRegistry.get(name).label_options == ()
    assert glue.STSB_VALUES == tuple(f"{x:.1f}" for x in np.arange(0, 5.01, 0.2))


@pytest.mark.parametrize("name", sorted(glue.BENCHMARKS))
def test_task_examples_have_t5_prefix_and_label_word(mock_tfds, name):
    b = glue.BENCHMARKS[name]
    task = td.TaskRegistry.get(name)
    vocab = task.vocabulary
    raw = task.source.get("validation")[0]
    if b.short_name not in ("multirc", "wic", "wsc", "record", "stsb"):
        # T5's glue preprocessor orders the text features by name.
        assert b.features == tuple(sorted(set(raw) - {"label", "idx"}))
    special = {"record": "record query: ", "wsc": "wsc text: "}
    prefix = special.get(b.short_name) or f"{b.short_name} {b.features[0]}: "
    examples = take(name)
    assert len(examples) == 4
    for example in examples:
        inputs, targets = example["inputs_pretokenized"], example["targets_pretokenized"]
        assert inputs.startswith(prefix), inputs
        for key in b.features[1:] if b.short_name != "wsc" else ():
            assert f" {key}: " in inputs
        assert example["inputs"].dtype == np.int32 and example["inputs"].size <= LENGTHS["inputs"]
        assert example["targets"][-1] == vocab.eos_id
        if b.config == "record":
            assert targets == (example["answers"] or ("<unk>",))[0]
            assert {"idx/passage", "idx/query"} <= set(example)
            continue
        assert targets in (glue.STSB_VALUES if b.short_name == "stsb" else task.label_options)
        assert vocab.decode(example["targets"][:-1].tolist()) == targets
        target = task.postprocess(targets, example=example, is_target=True)
        if b.short_name == "stsb":
            assert target == float(targets)
        elif b.short_name == "multirc":
            assert target == {"value": b.labels.index(targets),
                              "group": (example["idx/paragraph"], example["idx/question"])}
        else:
            assert target == b.labels.index(targets) and isinstance(example["idx"], int)


def test_mnli_validation_splits(mock_tfds):
    task = td.TaskRegistry.get("glue_mnli_v002")
    split_map = dict(task.source.split_map)
    assert split_map["validation"] == split_map["validation_matched"] == "validation_matched"
    assert split_map["validation_mismatched"] == "validation_mismatched"
    for split in ("validation_matched", "validation_mismatched"):
        assert take("glue_mnli_v002", split=split, n=1)[0]["inputs_pretokenized"].startswith(
            "mnli hypothesis: ")


@pytest.mark.parametrize("name", CLASSIFICATION)
def test_postprocessor_maps_label_words_to_class_ids(name):
    task = td.TaskRegistry.get(name)
    example = {"idx/paragraph": 3, "idx/question": 7}
    for class_id, word in enumerate(task.label_options):
        got = task.postprocess(word, example=example)
        target = task.postprocess(word, example=example, is_target=True)
        if name == "super_glue_multirc_v102":
            assert got == {"value": class_id}
            assert target == {"value": class_id, "group": (3, 7)}
        else:
            assert got == target == class_id
    unparseable = task.postprocess("maybe", example=example)
    assert (unparseable["value"] if isinstance(unparseable, dict) else unparseable) == -1
    assert task.postprocess(glue.UNKNOWN_LABEL, example=example) in (-1, {"value": -1})
    assert task.postprocess(task.label_options[0] + " ", example=example) in (-1, {"value": -1})


def test_stsb_targets_round_to_a_fifth_like_tf():
    assert [glue.stsb_target(x) for x in (0.0, 1.8, 1.89, 2.7, 3.43, 4.99, 5.0)] == [
        "0.0", "1.8", "1.8", "2.8", "3.4", "5.0", "5.0"]
    assert glue.stsb_target(2.5) == "2.4"  # 12.5 rounds half to even, as tf.round
    task = td.TaskRegistry.get("glue_stsb_v002")
    for i, value in enumerate(glue.STSB_VALUES):
        assert task.postprocess(value) == task.postprocess(value, is_target=True) == i / 5
    assert task.postprocess("three") == task.postprocess("") == -1.0
    import tensorflow as tf
    labels = np.concatenate([np.linspace(0, 5, 501), np.arange(1, 50, 2) / 10]).astype(np.float32)
    want = tf.strings.as_string(tf.round(labels * 5) / 5, precision=1).numpy()
    assert [glue.stsb_target(x) for x in labels] == [w.decode() for w in want]


def test_formats_on_t5_docstring_examples():
    wsc = glue.wsc_text({"text": "This is a test sentence .", "span1_text": "test",
                         "span1_index": 3, "span2_text": "This", "span2_index": 0, "label": 0,
                         "idx": 5})
    assert wsc == {"idx": 5, "inputs": "wsc text: # This # is a * test * sentence .",
                   "targets": "False"}
    wsc = glue.wsc_text({"text": b"Mitchell asked Tom if he could lend some money.",
                         "span1_text": b"Tom", "span1_index": 2, "span2_text": b"he",
                         "span2_index": 4, "label": 1, "idx": 0})
    assert wsc["inputs"] == "wsc text: Mitchell asked * Tom * if # he # could lend some money."
    assert wsc["targets"] == "True"
    qqp = glue.glue_text({"question1": b"Why?", "question2": b"Why not?", "label": -1, "idx": 10},
                         benchmark="qqp", label_names=("not_duplicate", "duplicate"),
                         feature_names=("question1", "question2"))
    assert qqp == {"idx": 10, "inputs": "qqp question1: Why? question2: Why not?",
                   "targets": "<unk>"}
    multirc = glue.glue_text(
        {"question": "Q?", "answer": "A", "paragraph": "<b>Sent 1: </b>One.<br><b>Sent 2: </b>Two.",
         "label": 1, "idx": {"paragraph": 1, "question": 2, "answer": 3}},
        benchmark="multirc", label_names=glue.BOOL_LABELS,
        feature_names=("question", "answer", "paragraph"))
    assert multirc == {
        "idx/paragraph": 1, "idx/question": 2, "idx/answer": 3, "targets": "True",
        "inputs": "multirc question: Q? answer: A paragraph: Sent 1: One. Sent 2: Two."}
    record = {"passage": "This is the passage.\n@highlight\nIt has highlights\n@highlight\nTwo",
              "query": "A @placeholder is a bird.", "entities": np.array(["penguin", "potato"]),
              "answers": np.array([b"penguin", b"pigeon"], dtype=object),
              "idx": {"passage": 4, "query": 9}}
    inputs = ("record query: A @placeholder is a bird. entities: penguin, potato passage: This is "
              "the passage. It has highlights. Two")
    assert [(e["inputs"], e["targets"]) for e in glue.record_examples(record, explode=True)] == [
        (inputs, "penguin"), (inputs, "pigeon")]
    (single,) = glue.record_examples(record, explode=False)
    assert single["targets"] == "penguin" and single["answers"] == ("penguin", "pigeon")
    no_answers = dict(record, answers=np.array([], dtype=object))
    assert [e["targets"] for e in glue.record_examples(no_answers, explode=True)] == ["<unk>"]


def test_record_train_has_one_example_per_answer_and_resumes(mock_tfds):
    task = td.TaskRegistry.get("super_glue_record_v102")
    records = task.source.get("train")
    records = [records[i] for i in range(len(records))]  # (the mock never raises IndexError)
    want = [a for r in records for a in (list(np.asarray(r["answers"]).tolist()) or ["<unk>"])]
    ds = task.get_dataset("train", LENGTHS, shuffle=False, num_epochs=1)
    assert [e["targets_pretokenized"] for e in ds] == want
    assert len(take("super_glue_record_v102", n=100)) == len(records)  # validation: one per query
    it = iter(task.get_dataset("train", LENGTHS, seed=3, shuffle=True))
    for _ in range(5):
        next(it)
    state = it.get_state()
    expected = [next(it)["targets_pretokenized"] for _ in range(60)]
    restored = iter(task.get_dataset("train", LENGTHS, seed=3, shuffle=True))
    restored.set_state(state)
    assert [next(restored)["targets_pretokenized"] for _ in range(60)] == expected


def test_multirc_and_record_metrics():
    task = td.TaskRegistry.get("super_glue_multirc_v102")
    rows = [((0, 1), "True", "True"), ((0, 1), "False", "False"), ((0, 2), "True", "False"),
            ((1, 3), "False", "False"), ((1, 3), "True", "garbage")]
    targets = [task.postprocess(t, example={"idx/paragraph": g[0], "idx/question": g[1]},
                                is_target=True) for g, t, _ in rows]
    predictions = [task.postprocess(p) for _, _, p in rows]
    scores = {}
    for fn in task.metric_fns:
        scores.update(fn(targets, predictions))
    # True labels: rows 0, 2, 4; predicted True: row 0 (the invalid one counts as wrong).
    assert scores["f1"] == pytest.approx(100 * 2 * (1 / 1) * (1 / 3) / (1 + 1 / 3))
    assert scores["exact_match"] == pytest.approx(100 / 3)  # only question (0, 1) all right

    task = td.TaskRegistry.get("super_glue_record_v102")
    example = {"answers": ("Barack Obama", "Obama"), "idx/passage": 0, "idx/query": 0}
    other = {"answers": ("the UN",), "idx/passage": 0, "idx/query": 1}
    targets = [task.postprocess(e["answers"][0], example=e, is_target=True)
               for e in (example, example, other)]
    predictions = [task.postprocess(p) for p in ("obama", "ignored duplicate", "UN council")]
    (metric,) = task.metric_fns
    assert metric(targets, predictions) == pytest.approx({"em": 50.0, "f1": 100 * (1 + 2 / 3) / 2})


def test_glue_and_super_glue_averages():
    scores = {"glue_cola_v002": {"matthews_corrcoef": 50.0},
              "glue_sst2_v002": {"accuracy": 90.0},
              "glue_mrpc_v002": {"f1": 88.0, "accuracy": 84.0},
              "glue_stsb_v002": {"pearson_corrcoef": 86.0, "spearman_corrcoef": 84.0},
              "glue_qqp_v002": {"f1": 70.0, "accuracy": 90.0},
              "glue_mnli_v002/validation_matched": {"accuracy": 82.0},
              "glue_mnli_v002/validation_mismatched": {"accuracy": 80.0},
              "glue_qnli_v002": {"accuracy": 88.0},
              "glue_rte_v002": {"accuracy": 60.0},
              "glue_wnli_v002": {"accuracy": 0.0}}  # not part of the score
    want = (50 + 90 + 86 + 85 + 80 + 81 + 88 + 60) / 8
    assert glue.glue_average(scores) == pytest.approx(want)
    t5_names = dict(scores)
    t5_names["glue_mnli_matched_v002"] = t5_names.pop("glue_mnli_v002/validation_matched")
    t5_names["glue_mnli_mismatched_v002"] = t5_names.pop("glue_mnli_v002/validation_mismatched")
    assert glue.glue_average(t5_names) == pytest.approx(want)
    del scores["glue_mnli_v002/validation_mismatched"]
    with pytest.raises(KeyError, match="MNLI"):
        glue.glue_average(scores)

    super_scores = {"super_glue_boolq_v102": {"accuracy": 80.0},
                    "super_glue_cb_v102": {"mean_3class_f1": 80.0, "accuracy": 90.0},
                    "super_glue_copa_v102": {"accuracy": 70.0},
                    "super_glue_multirc_v102": {"f1": 70.0, "exact_match": 30.0},
                    "super_glue_record_v102": {"f1": 72.0, "em": 70.0},
                    "super_glue_rte_v102": {"accuracy": 75.0},
                    "super_glue_wic_v102": {"accuracy": 65.0},
                    "super_glue_wsc_v102": {"accuracy": 60.0}}
    want = (80 + 85 + 70 + 50 + 71 + 75 + 65 + 60) / 8
    assert glue.super_glue_average(super_scores) == pytest.approx(want)


def test_mixtures_are_proportional_and_capped(monkeypatch):
    assert [n for n, _ in td.MixtureRegistry.get("glue_v002_proportional").components] == [
        f"glue_{n}_v002" for n in "cola sst2 mrpc qqp stsb mnli qnli rte".split()]
    assert [n for n, _ in td.MixtureRegistry.get("super_glue_v102_proportional").components] == [
        f"super_glue_{n}_v102" for n in "boolq cb copa multirc record rte wic wsc".split()]
    sizes = {"glue/cola": 8_551, "glue/sst2": 67_349, "glue/mrpc": 3_668, "glue/qqp": 1_000_000,
             "glue/stsb": 5_749, "glue/mnli": 392_702, "glue/qnli": 104_743, "glue/rte": 2_490}
    asked = []

    def num_examples(self, split):
        asked.append((self.name, split))
        return sizes[self.name.split(":")[0]]
    monkeypatch.setattr(sources.TfdsSource, "num_examples", num_examples)
    rates = td.MixtureRegistry.get("glue_v002_proportional").leaf_rates("train")
    capped = {f"glue_{k.split('/')[1]}_v002": min(v, 2 ** 19) for k, v in sizes.items()}
    total = sum(capped.values())
    assert rates == pytest.approx({k: v / total for k, v in capped.items()})
    assert {split for _, split in asked} == {"train"}


def test_register_glue_with_another_vocabulary(mock_tfds):
    names = glue.register_glue(vocabulary=td.ByteVocabulary(), suffix="_bytes")
    try:
        assert "glue_sst2_v002_bytes" in names
        assert [n for n, _ in td.MixtureRegistry.get("glue_v002_proportional_bytes").components][
            0] == "glue_cola_v002_bytes"
        (example,) = take("glue_sst2_v002_bytes", n=1)
        assert td.ByteVocabulary().decode(example["targets"][:-1].tolist()) in (
            "negative", "positive")
    finally:
        for name in names:
            td.TaskRegistry.remove(name)
        for name in ("glue_v002_proportional_bytes", "super_glue_v102_proportional_bytes"):
            td.MixtureRegistry.remove(name)


@pytest.mark.parametrize("name", sorted(
    __import__("t5x_like.builtin_tasks.glue_instructions").builtin_tasks
    .glue_instructions.TEMPLATES))
def test_instruction_templates_read_the_raw_records(mock_tfds, name):
    """Each GLUE/SuperGLUE instruction task through its templates: T5's formatting step
    replaced, every example phrased by one of its task's templates, its answer among
    the options that evaluation ranks."""
    task = td.TaskRegistry.get(name + "_instruct")
    assert not any(isinstance(s, glue.ToText) for s in task.preprocessors)
    names = {t.name for t in td.TemplateRegistry.get(name)}
    for example in take(name + "_instruct", n=8, lengths={"inputs": 256, "targets": 16}):
        assert example["template"] in names
        assert example["targets_pretokenized"] in example["options"]
        assert "{" not in example["inputs_pretokenized"]  # every field filled
