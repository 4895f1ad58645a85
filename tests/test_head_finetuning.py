"""Fine-tuning heads selected by config.head: their features, training from a pretrained
body with a fresh head, and evaluation through eval's head mode."""

import copy
import json

import jax
import numpy as np
import pytest
from conftest import tiny_config

import t5x_like.data as td
from t5x_like import config_lib, errors, metrics, resolving, structures, train
from t5x_like import eval as eval_cli
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.data import head_features
from t5x_like.data import preprocessors as pp
from t5x_like.engine import partitioning
from t5x_like.engine import trainer as trainer_lib
from t5x_like.structures.head import with_head_labels
from t5x_like.training import starting_state

VOCAB = td.get_task_or_mixture("embedded_spam").vocabulary
WORDS = ["apple", "river", "stone", "cloud", "green", "north", "table", "light", "sun", "moon",
         "bird", "fish", "red", "blue", "tree", "rock"]


def _register(name, examples, **kwargs):
    td.TaskRegistry.remove(name)
    td.TaskRegistry.add(name, td.InMemorySource({"train": examples, "validation": examples}),
                        [pp.Tokenize(copy_pretokenized=True), pp.AppendEos(), pp.Truncate()],
                        tasks.features("inputs", "targets"), **kwargs)


# Class = whether the word has more than four letters: learnable from the tokens alone.
_register("test_head_cls", [{"inputs": f"word {w}", "targets": "long" if len(w) > 4 else "short"}
                            for w in WORDS * 4], metric_fns=[metrics.accuracy])
_register("test_head_tags",
          [{"inputs": " ".join(ws), "targets": " ".join(ts), "words": ws, "tags": ts}
           for ws, ts in [(["the", "red", "bird"], ["DET", "ADJ", "NOUN"]),
                          (["a", "blue", "fish", "swims"], ["DET", "ADJ", "NOUN", "VERB"])] * 8],
          metric_fns=[metrics.token_accuracy])


def encoder_config(**overrides):
    config = tiny_config()
    config.model = config_lib.model_defaults("encoder")
    config.model.update(dict(vocab_size=8192, d_model=32, num_heads=2, head_dim=16, d_ff=64,
                             num_layers=1, max_length=64, next_sentence_head=False))
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 3e-3
    config_lib.apply_overrides(config, [f"{k}={v}" for k, v in overrides.items()])
    config_lib.validate(config)
    return config


def test_classification_rows_wrap_cls_sep_and_index_labels():
    converter = head_features.HeadFeatureConverter("classification", VOCAB, ["ham", "spam"])
    row = converter({"inputs_pretokenized": "buy now", "targets_pretokenized": "spam"},
                    {"inputs": 12})
    pieces = list(VOCAB.encode("buy now"))
    expected = [VOCAB.cls_id] + pieces + [VOCAB.sep_id]
    np.testing.assert_array_equal(row["input_tokens"][:len(expected)], expected)
    assert not row["input_tokens"][len(expected):].any()
    assert int(row["labels"]) == 1
    long = converter({"inputs_pretokenized": "word " * 40, "targets_pretokenized": "ham"},
                     {"inputs": 12})
    assert long["input_tokens"][0] == VOCAB.cls_id and long["input_tokens"][-1] == VOCAB.sep_id
    with pytest.raises(ValueError, match="not one of the head's 2 labels"):
        converter({"inputs_pretokenized": "x", "targets_pretokenized": "eggs"}, {"inputs": 8})
    decoder_rows = head_features.HeadFeatureConverter("classification", VOCAB, ["ham", "spam"],
                                                      wrap_cls_sep=False)
    row = decoder_rows({"inputs_pretokenized": "buy now", "targets_pretokenized": "spam"},
                       {"inputs": 12})
    np.testing.assert_array_equal(row["input_tokens"][:len(pieces) + 1], pieces + [0])
    lenient = head_features.HeadFeatureConverter("classification", VOCAB, ["ham", "spam"],
                                                 strict=False)
    assert int(lenient({"inputs_pretokenized": "x", "targets_pretokenized": "eggs"},
                       {"inputs": 8})["labels"]) == -1


def test_tagging_rows_label_the_first_piece_of_each_word_and_stop_at_the_window():
    converter = head_features.HeadFeatureConverter("token_classification", VOCAB,
                                                   ["ADJ", "DET", "NOUN"])
    words, tags = ["the", "unbelievably", "green"], ["DET", "ADJ", "ADJ"]
    row = converter({"words": words, "tags": tags}, {"inputs": 32})
    pieces = [list(VOCAB.encode(w)) for w in words]
    assert len(pieces[1]) > 1  # a word of several pieces
    first = np.cumsum([1] + [len(p) for p in pieces])[:-1]
    np.testing.assert_array_equal(np.flatnonzero(row["label_weights"]), first)
    np.testing.assert_array_equal(row["labels"][first], [1, 0, 0])
    assert row["input_tokens"][first[-1] + len(pieces[-1])] == VOCAB.sep_id
    short = converter({"words": words, "tags": tags}, {"inputs": 4})
    assert short["label_weights"].sum() == 2 and short["input_tokens"][3] == VOCAB.sep_id


def test_span_rows_point_at_the_answer_and_decode_back_to_it():
    converter = head_features.HeadFeatureConverter("span_extraction", VOCAB)
    example = {"question": "Who wrote Emma?",
               "context": "The novel Emma was written by Jane Austen in 1815.",
               "answers": ["Jane Austen"]}
    row = converter(example, {"inputs": 48})
    start, end = int(row["start_positions"]), int(row["end_positions"])
    assert VOCAB.decode(row["input_tokens"][start:end + 1].tolist()) == "Jane Austen"
    assert row["context_mask"][start] and row["context_mask"][end]
    assert not row["context_mask"][:start - 8].any()  # the question is not context
    cut = converter(example, {"inputs": 12})  # the answer falls outside the window
    assert int(cut["start_positions"]) == int(cut["end_positions"]) == 0


def test_span_prediction_keeps_to_the_context_and_the_length_limit():
    config = encoder_config(**{"head.kind": "span_extraction", "head.max_answer_length": 2})
    config.task, config.task_feature_lengths = "test_head_cls", {"inputs": 8}
    structure = copy.copy(structures.for_config(config))  # not the cached one: patched below
    start = np.full((1, 8), -5.0, np.float32)
    end = np.full((1, 8), -5.0, np.float32)
    start[0, 1], end[0, 1] = 9.0, 9.0        # best pair, but outside the context
    start[0, 3], end[0, 6] = 5.0, 6.0        # too long (4 tokens)
    start[0, 4], end[0, 5] = 2.0, 1.0        # inside, 2 tokens
    mask = np.array([[0, 0, 1, 1, 1, 1, 1, 0]], np.int32)
    structure.logits = lambda params, batch: {"start_logits": start, "end_logits": end}
    spans = structure.predict_batch(None, {"context_mask": mask})
    np.testing.assert_array_equal(spans, [[4, 5]])


def test_regression_rows_parse_the_target_and_labels_come_from_the_train_split():
    converter = head_features.HeadFeatureConverter("regression", VOCAB)
    row = converter({"inputs_pretokenized": "a b", "targets_pretokenized": "3.8"}, {"inputs": 8})
    assert row["labels"] == np.float32(3.8)
    with pytest.raises(ValueError, match="numeric targets"):
        converter({"inputs_pretokenized": "a", "targets_pretokenized": "high"}, {"inputs": 8})
    task = td.get_task_or_mixture("test_head_tags")
    assert head_features.labels_from_task(task, "token_classification") == ["ADJ", "DET", "NOUN",
                                                                           "VERB"]
    assert head_features.labels_from_task(td.get_task_or_mixture("test_head_cls"),
                                          "classification") == ["long", "short"]


def test_bad_head_configs_are_named():
    with pytest.raises(errors.ConfigError, match="encoder-decoder"):
        tiny_config(**{"head.kind": "classification"})
    with pytest.raises(errors.ConfigError, match="one example per row"):
        encoder_config(**{"head.kind": "classification", "pack": True})
    with pytest.raises(errors.ConfigError, match="head.kind"):
        encoder_config(**{"head.kind": "ranking"})
    decoder = tiny_config()
    decoder.model = config_lib.model_defaults("decoder")
    decoder.head.kind = "classification"
    with pytest.raises(errors.ConfigError, match="head.pooling=last"):
        config_lib.validate(decoder)
    decoder.head.pooling = "last"
    config_lib.validate(decoder)
    config = encoder_config(**{"head.kind": "classification"})
    config.task = "embedded_bench"
    with pytest.raises(errors.ConfigError, match="is a mixture"):
        with_head_labels(config_lib.spec_of(config))


@pytest.mark.slow
def test_head_fine_tunes_from_a_pretrained_body_and_evaluates(tmp_path, capsys):
    pretrain = encoder_config(num_train_steps=4, checkpoint_every_steps=4, eval_every_steps=4)
    pretrain.task, pretrain.task_feature_lengths = "embedded_en_mlm", {"inputs": 32}
    train.run(pretrain, str(tmp_path / "pt"), quiet=True)

    config = encoder_config(num_train_steps=60, checkpoint_every_steps=60, eval_every_steps=60,
                            **{"head.kind": "classification", "head.dropout_rate": 0.0})
    config.task, config.task_feature_lengths = "test_head_cls", {"inputs": 16}
    config.init_from = str(tmp_path / "pt")
    config = with_head_labels(config_lib.spec_of(config))
    assert tuple(config.head.labels) == ("long", "short")
    mesh = partitioning.make_mesh({"dcn": 1, "data": 8, "fsdp": 1, "tensor": 1})
    trainer = trainer_lib.build_trainer(config, mesh)
    state, _ = starting_state.pretrained_state(config, trainer)
    from t5x_like.checkpoints import param_sources
    source = param_sources.resolve(str(tmp_path / "pt"))
    saved = resolving.resolve_checkpoint(source, 4).spec
    body = jax.device_get(source.restore_params(4, trainer_lib.build_trainer(saved, mesh)))
    loaded = jax.device_get(state.params)
    for got, want in zip(jax.tree.leaves(loaded["backbone"]), jax.tree.leaves(body), strict=False):
        np.testing.assert_array_equal(got, want)
    assert set(loaded["head"]) == {"kernel", "bias"} and not loaded["head"]["bias"].any()

    result = train.run(config, str(tmp_path / "ft"), quiet=True)
    assert result["eval"]["eval_accuracy"] >= 0.9
    saved_config = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert saved_config["head"]["labels"] == ["long", "short"]

    out = tmp_path / "eval"
    code = eval_cli.main([f"--checkpoint={tmp_path / 'ft'}", "--task=test_head_cls",
                          f"--output_dir={out}", "--batch_size=8"])
    assert code == 0
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["task"] == "test_head_cls" and record["accuracy"] >= 90.0
    predictions = [json.loads(line) for line in
                   (out / "predictions" / "test_head_cls" / "step_60.jsonl").read_text().split("\n")
                   if line]
    assert {p["prediction"] for p in predictions} <= {"long", "short"}
    assert len(predictions) == 64

    from t5x_like import infer
    (tmp_path / "in.jsonl").write_text('{"inputs": "word stone"}\n{"inputs": "word sun"}\n')
    assert infer.main([f"--checkpoint={tmp_path / 'ft'}", f"--input_file={tmp_path / 'in.jsonl'}",
                       f"--output_file={tmp_path / 'out.jsonl'}"]) == 0
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [line["prediction"] for line in lines] == ["long", "short"]

    # Hugging Face export writes the pretrained architectures: a head run is refused in one
    # line before any weight is read, and nothing is written.
    from t5x_like.convert import __main__ as convert_cli
    capsys.readouterr()
    assert convert_cli.main(["export", f"--checkpoint={tmp_path / 'ft'}",
                             f"--out={tmp_path / 'hf'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a fine-tuned head or PEFT run" in err
    assert not (tmp_path / "hf").exists()


def test_tagging_head_trains_and_predicts_tags(tmp_path):
    config = encoder_config(num_train_steps=40, checkpoint_every_steps=40, eval_every_steps=40,
                            **{"head.kind": "token_classification", "head.dropout_rate": 0.0,
                               "eval.mixture": "test_head_tags", "eval.every_steps": 40})
    config.task, config.task_feature_lengths = "test_head_tags", {"inputs": 16}
    result = train.run(config, str(tmp_path / "ft"), quiet=True)
    assert result["train"]["bench/test_head_tags/token_accuracy"] == 100.0
