"""Evaluation: structures' score/predict, the evaluator's modes, few-shot requests, eval CLI."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import drawn_params, tiny_config

import t5x_like.data as td
from t5x_like import config_lib, errors, metrics, structures, train
from t5x_like import eval as eval_cli
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.data import preprocessors as pp
from t5x_like.engine import partitioning
from t5x_like.engine import trainer as trainer_lib
from t5x_like.evaluation import evaluator, few_shot, runner
from t5x_like.models import decoding

WORDS = ["apple", "river", "stone", "cloud", "green", "north", "table", "light"]


def _register(name, examples, **kwargs):
    td.TaskRegistry.remove(name)
    td.TaskRegistry.add(name, td.InMemorySource({"train": examples, "validation": examples}),
                        [pp.Tokenize(copy_pretokenized=True), pp.AppendEos(), pp.Truncate()],
                        tasks.features("inputs", "targets"), **kwargs)


_register("test_eval_rank", [{"inputs": f"is {w} long", "targets": "yes" if len(w) > 4 else "no"}
                             for w in WORDS], metric_fns=[metrics.accuracy],
          label_options=("no", "yes"))
_register("test_eval_copy", [{"inputs": f"copy {w}", "targets": w} for w in WORDS],
          metric_fns=[metrics.sequence_accuracy], score_metric_fns=[metrics.mean_log_likelihood])
_register("test_eval_no_metrics", [{"inputs": "a", "targets": "b"}])
td.MixtureRegistry.remove("test_eval_mix")
td.MixtureRegistry.add("test_eval_mix", ["test_eval_rank", "test_eval_copy"], default_rate=1.0)


def decoder_config(**overrides):
    config = tiny_config(**overrides)
    config.model = config_lib.model_defaults("decoder")
    config.model.update(dict(vocab_size=8192, d_model=32, num_heads=2, head_dim=16, d_ff=64,
                             num_layers=1, max_length=64))
    return config


def setup(config, name="test_eval_mix", **settings):
    config.task_feature_lengths = {"inputs": 16, "targets": 8}
    mesh = partitioning.make_mesh({"dcn": 1, "data": 8, "fsdp": 1, "tensor": 1})
    trainer = trainer_lib.build_trainer(config, mesh)
    state = trainer.init_state(0)
    ev = runner.build_evaluator(config, trainer, name,
                                  evaluator.EvalSettings(batch_size=8, **settings))
    return ev, state.params


@pytest.mark.slow
def test_padded_generation_equals_one_row_at_a_time():
    config = decoder_config()
    model = structures.build_model(config.model)
    params = drawn_params(model, jnp.ones((1, 8), jnp.int32))  # traced, not an eager init
    rng = np.random.default_rng(0)
    lengths = np.array([3, 7, 5])
    prompts = np.zeros((3, 8), np.int32)
    for row, n in enumerate(lengths):
        prompts[row, :n] = rng.integers(10, 8000, n)
    # Each generation whole under one jit, params and prompts as arguments: called eagerly,
    # their prefill and setup ran op by op, retraced for every prompt length (~5 s a call).
    padded = jax.jit(lambda p, x, n, beams: decoding.generate_padded(
        model, p, x, n, max_new_tokens=6, num_beams=beams, eos_id=-1), static_argnums=3)
    greedy = jax.jit(lambda p, x: decoding.generate(model, p, x, max_new_tokens=6))
    beam = jax.jit(lambda p, x: decoding.beam_generate(model, p, x, max_new_tokens=6,
                                                       num_beams=3, eos_id=-1)[0])
    batched, beams = padded(params, prompts, lengths, 1), padded(params, prompts, lengths, 3)
    for row, n in enumerate(lengths):
        alone = greedy(params, prompts[row:row + 1, :n])
        np.testing.assert_array_equal(batched[row], alone[0])
        alone_beam = beam(params, prompts[row:row + 1, :n])
        np.testing.assert_array_equal(beams[row], alone_beam[0, 0])


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder"])
def test_score_batch_is_the_summed_target_log_likelihood(family):
    config = decoder_config() if family == "decoder" else tiny_config()
    ev, params = setup(config)
    task = td.TaskRegistry.get("test_eval_copy")
    example = ev.examples(task)[0]
    row = ev.structure.feature_converter(ev.lengths).convert_example(example, ev.lengths)
    batch = {k: v[None] for k, v in row.items()}
    logits = ev.structure.logits(params, batch)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    targets = batch["decoder_target_tokens"][0]
    weights = batch["decoder_loss_weights"][0]
    expected = sum(float(log_probs[0, i, t]) for i, t in enumerate(targets) if weights[i] > 0)
    assert weights.sum() == len(tasks.embedded_vocabulary().encode(example["targets_pretokenized"])) + 1
    np.testing.assert_allclose(ev.score_rows(params, [row])[0], expected, rtol=1e-5)


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder"])
def test_evaluator_modes_and_predictions(family):
    config = decoder_config() if family == "decoder" else tiny_config()
    ev, params = setup(config, max_decode_length=4)
    results = {r.task: r for r in ev.evaluate(params)}
    rank = results["test_eval_rank"]
    assert rank.mode == "rank"
    for record in rank.records:  # each score beside the option it belongs to
        assert record["options"] == ["no", "yes"]
        assert record["prediction"] == record["options"][int(np.argmax(record["option_scores"]))]
    expected = 100 * np.mean([r["prediction"] == r["targets"] for r in rank.records])
    assert rank.metrics == {"accuracy": pytest.approx(expected)}
    copy = results["test_eval_copy"]
    assert copy.mode == "predict" and set(copy.metrics) == {"sequence_accuracy",
                                                            "mean_log_likelihood"}
    # Predictions are the greedy decodes of each example alone.
    example = ev.examples(td.TaskRegistry.get("test_eval_copy"))[0]
    if family == "encoder_decoder":
        alone = decoding.decode(ev.structure.model, params, example["inputs"][None],
                                max_decode_length=4)
    else:
        prompt = np.concatenate([[0], example["inputs"]])
        alone = decoding.generate(ev.structure.model, params, jnp.asarray(prompt[None]),
                                  max_new_tokens=4)
    assert copy.records[0]["prediction"] == evaluator._decode(tasks.embedded_vocabulary(),
                                                              alone[0])


def test_lm_eval_requests_follow_the_harness():
    vocab = tasks.embedded_vocabulary()
    context, continuation = few_shot.loglikelihood_request(vocab, "The cat sat on the ", "mat")
    assert context == vocab.encode("The cat sat on the")
    assert context + continuation == vocab.encode("The cat sat on the mat")
    # An empty context is the vocabulary's BOS (lm-eval's hf model's default prefix).
    assert few_shot.loglikelihood_request(vocab, "", "mat") == ([vocab.bos_id],
                                                                vocab.encode(" mat"))
    # A tokenizer template's prefix (a decoder run's start id) goes before every text.
    framed = few_shot.loglikelihood_request(vocab, "The cat sat on the ", "mat", (3,))
    assert framed == ([3, *context], continuation)
    row = few_shot.request_row([5, 6, 7], [8, 9], width=6)
    assert row["decoder_input_tokens"].tolist() == [5, 6, 7, 8, 0, 0]
    assert row["decoder_target_tokens"].tolist() == [6, 7, 8, 9, 0, 0]
    assert row["decoder_loss_weights"].tolist() == [0, 0, 1, 1, 0, 0]
    assert few_shot.choose([-4.0, -6.0], ["ab", "abcdefgh"]) == (0, 1)
    pool = [few_shot.Demonstration(f"q{i}", f"a{i}") for i in range(10)]
    first = [few_shot.FewShotSampler(pool, 2, seed=1234).prompt("Q") for _ in range(2)]
    sampler = few_shot.FewShotSampler(pool, 2, seed=1234)
    assert sampler.prompt("Q") == first[0]
    assert sampler.prompt("Q").count("\n\n") == 2 and sampler.prompt("Q").endswith("\n\nQ")


def test_decoder_k_shot_multiple_choice_reports_acc_and_acc_norm():
    ev, params = setup(decoder_config(), name="test_eval_rank", num_shots=2)
    (result,) = ev.evaluate(params)
    assert result.mode == "lm_eval" and set(result.metrics) == {"acc", "acc_norm"}
    assert result.records[0]["inputs"].count("\n\n") == 2
    assert 0.0 <= result.metrics["acc"] <= 1.0


def test_nonfinite_scores_and_tasks_without_metrics_are_user_errors():
    with pytest.raises(errors.UserError, match="not finite"):
        evaluator._check_finite("t", np.array([0.0, np.nan]))
    with pytest.raises(errors.UserError, match="no metric_fns"):
        setup(tiny_config(), name="test_eval_no_metrics")
    with pytest.raises(errors.UserError, match="Did you mean 'test_eval_rank'"):
        evaluator.leaf_tasks("test_eval_rnak")


def test_decoder_converter_refuses_inputs_it_would_drop():
    with pytest.raises(ValueError, match="prefix_lm=True"):
        td.DecoderFeatureConverter()({"inputs": [5, 6], "targets": [7, 1]}, {"targets": 8})


def _train(workdir, steps, **overrides):
    config = tiny_config(num_train_steps=steps, checkpoint_every_steps=2, eval_every_steps=2,
                         log_every_steps=2, batch_size=8, **overrides)
    config.task = "test_eval_copy"
    config.task_feature_lengths = {"inputs": 16, "targets": 8}
    train.run(config, str(workdir), quiet=True)


@pytest.mark.slow
def test_eval_cli_resumes_without_duplicates_and_watches(tmp_path, monkeypatch, capsys):
    workdir, out = tmp_path / "run", tmp_path / "eval"
    _train(workdir, 4)
    args = [f"--checkpoint={workdir}", "--mixture=test_eval_mix", f"--output_dir={out}",
            "--max_decode_length=3", "--quiet"]
    assert eval_cli.main(args) == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(row["step"], row["task"]) for row in lines] == [
        (2, "test_eval_copy"), (2, "test_eval_rank"), (4, "test_eval_copy"), (4, "test_eval_rank")]
    assert (out / "predictions" / "test_eval_rank" / "step_4.jsonl").is_file()
    assert "rows/s" not in capsys.readouterr().err  # --quiet: no progress either
    # Nothing new: no line added, and it says why each step was skipped.
    assert eval_cli.main([a for a in args if a != "--quiet"]) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 4
    assert (f"steps 2, 4: already evaluated on 'validation' in {out / 'metrics.jsonl'}, "
            "skipped") in capsys.readouterr().out
    # An interrupted evaluation of step 4 (its lines never written) is redone once.
    (out / "metrics.jsonl").write_text("\n".join(json.dumps(row) for row in lines[:2]) + "\n")
    monkeypatch.setenv("T5XL_PROGRESS_INTERVAL_S", "0")  # a progress line per batch
    assert eval_cli.main([a for a in args if a != "--quiet"]) == 0
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 2, 4, 4]
    err = capsys.readouterr().err
    # Each task's batch loops: done of total, then (from the second batch) a rate and ETA.
    assert re.search(r"^test_eval_copy generating: 8/8 rows \(100%\)", err, flags=re.M), err
    assert re.search(r"^test_eval_rank scoring: 16/16 rows \(100%\), \S+ rows/s, ETA 00:00$",
                     err, flags=re.M), err
    assert re.search(r"^test_eval_rank scoring: 16 rows in 00:\d\d \(\S+ rows/s\)$", err,
                     flags=re.M), err
    # --watch: a checkpoint written while it waits is evaluated, then it stops at the
    # run's last step.
    trained = []

    def train_more(seconds):
        if not trained:
            trained.append(True)
            _train(workdir, 6)
    monkeypatch.setattr(eval_cli.time, "sleep", train_more)
    assert eval_cli.main(args + ["--watch", "--watch_interval_s=0", "--config.num_train_steps=6"]) == 0
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 2, 4, 4, 6, 6]
    # infer: a JSONL file of inputs -> one prediction per line, from the newest step.
    from t5x_like import infer
    (tmp_path / "in.jsonl").write_text('{"inputs": "copy apple"}\n{"inputs": "copy river"}\n')
    assert infer.main([f"--checkpoint={workdir}", f"--input_file={tmp_path / 'in.jsonl'}",
                       f"--output_file={tmp_path / 'out.jsonl'}", "--max_decode_length=3"]) == 0
    predicted = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [p["inputs"] for p in predicted] == ["copy apple", "copy river"]
    assert all(isinstance(p["prediction"], str) for p in predicted)
    (tmp_path / "bad.jsonl").write_text('{"text": "no inputs"}\n')
    capsys.readouterr()
    assert infer.main([f"--checkpoint={workdir}", f"--input_file={tmp_path / 'bad.jsonl'}",
                       f"--output_file={tmp_path / 'out2.jsonl'}"]) == 2
    assert 'needs an "inputs" string' in capsys.readouterr().err
    # Bad input: one message, exit 2.
    capsys.readouterr()
    assert eval_cli.main([f"--checkpoint={workdir}", "--task=test_eval_cpy",
                          f"--output_dir={out}"]) == 2
    assert "Did you mean 'test_eval_copy'" in capsys.readouterr().err
    assert eval_cli.main([f"--checkpoint={workdir}", "--task=embedded_bytes_en_span_corruption",
                          f"--output_dir={out}"]) == 2
    assert "vocabular" in capsys.readouterr().err
    assert eval_cli.main([f"--checkpoint={workdir}", "--task=test_eval_copy",
                          f"--output_dir={workdir / 'checkpoints' / 'x'}"]) == 2
    assert "never writes there" in capsys.readouterr().err
    assert eval_cli.main([f"--checkpoint={workdir}", "--task=test_eval_copy", "--sampler=engine",
                          f"--output_dir={tmp_path / 'engine'}"]) == 2
    assert "not 'encoder_decoder' ones; use --sampler=static." in capsys.readouterr().err
    assert eval_cli.main([f"--checkpoint={workdir}", "--task=test_eval_copy", "--split=test",
                          f"--output_dir={out}"]) == 2
    assert "no split 'test'" in capsys.readouterr().err


def test_eval_refuses_lengths_the_model_cannot_take():
    config = tiny_config()
    config.model = config_lib.model_defaults("decoder")
    config.model.max_length = 64
    config.task_feature_lengths = {"targets": 32}
    cloze = [td.get_task_or_mixture("embedded_austen_cloze")]
    with pytest.raises(errors.UserError, match="has inputs, and this decoder's lengths"):
        runner.check_lengths(config, {"targets": 32}, cloze)
    runner.check_lengths(config, {"targets": 32}, cloze, few_shot=True)  # its own window
    with pytest.raises(errors.UserError, match="need 80 positions.*max_length=64"):
        runner.check_lengths(config, {"inputs": 48, "targets": 32}, cloze)
    runner.check_lengths(config, {"inputs": 32, "targets": 32}, cloze)
    config.model.position_embedding = "rotary"  # no learned positions to run out of
    runner.check_lengths(config, {"inputs": 48, "targets": 32}, cloze)


def test_eval_names_a_missing_metric_library_before_any_model_work(tmp_path, monkeypatch,
                                                                     capsys):
    import importlib.util
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: None if name == "sacrebleu" else real(name))
    assert eval_cli.main([f"--checkpoint={tmp_path / 'run'}", "--mixture=embedded_bench",
                          f"--output_dir={tmp_path / 'eval'}"]) == 2
    err = capsys.readouterr().err
    assert "The metrics of task 'embedded_bible_en_es' need sacrebleu" in err
    assert 'pip install -c constraints.txt -e .' in err and "Traceback" not in err
    assert not (tmp_path / "eval").exists()  # nothing written


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder"])
def test_evaluation_on_a_sharded_mesh_equals_one_device(family):
    """Scores (rank and score modes) and greedy predictions of the evaluator on a
    (data 2, fsdp 4) mesh, parameters sharded, equal those on one device."""
    config = decoder_config() if family == "decoder" else tiny_config()
    config.task_feature_lengths = {"inputs": 16, "targets": 8}
    results, host = [], None
    for shape, devices in (({"dcn": 1, "data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1]),
                           ({"dcn": 1, "data": 2, "fsdp": 4, "tensor": 1}, jax.devices())):
        trainer = trainer_lib.build_trainer(config, partitioning.make_mesh(shape, devices))
        if host is None:  # the same weights on both meshes
            host = jax.device_get(trainer.init_state(0).params)
        ev = runner.build_evaluator(config, trainer, "test_eval_mix", evaluator.EvalSettings(
            batch_size=8, max_decode_length=4))
        results.append({r.task: r for r in ev.evaluate(trainer.place_params(host))})
    one, sharded = results
    for task in one:
        assert one[task].metrics == pytest.approx(sharded[task].metrics, rel=1e-5)
        for a, b in zip(one[task].records, sharded[task].records, strict=True):
            assert a.get("prediction") == b.get("prediction")
            if "option_scores" in a:
                np.testing.assert_allclose(a["option_scores"], b["option_scores"], rtol=1e-5,
                                           atol=1e-5)


def test_the_engine_sampler_predicts_what_static_batches_predict():
    """``sampler="engine"`` (``eval --sampler=engine``): generation tasks decode through the
    continuous-batching engine, params sharded over fsdp and tensor, 4 slots for 8 rows.
    Greedy predictions and metrics are the static batches'; sampled rows follow their own
    seeds (row i: seed + i), not their neighbours or how many rows are asked."""
    config = decoder_config()
    config.task_feature_lengths = {"inputs": 16, "targets": 8}
    trainer = trainer_lib.build_trainer(config, partitioning.make_mesh(
        {"dcn": 1, "data": 1, "fsdp": 4, "tensor": 2}))
    params = trainer.init_state(0).params

    def evaluator_for(sampler):
        return runner.build_evaluator(config, trainer, "test_eval_copy", evaluator.EvalSettings(
            batch_size=4, max_decode_length=6, sampler=sampler))
    static_ev, engine_ev = evaluator_for("static"), evaluator_for("engine")
    (static,), (engine,) = static_ev.evaluate(params), engine_ev.evaluate(params)
    assert static_ev.engine is None and engine_ev.engine is not None
    assert engine_ev.engine.slots == 4
    assert [r["prediction"] for r in engine.records] == [r["prediction"] for r in static.records]
    assert engine.metrics == static.metrics
    task = td.TaskRegistry.get("test_eval_copy")
    examples = engine_ev.examples(task)
    converter = engine_ev.structure.feature_converter(engine_ev.lengths)
    rows = [converter.convert_example(evaluator._with_eos_target(
        ex, tasks.embedded_vocabulary()), engine_ev.lengths) for ex in examples]
    prompt_tokens = sum(len(p) for p in engine_ev.structure.engine_prompts(
        {k: np.stack([r[k] for r in rows]) for k in rows[0]}))
    stats = engine_ev.engine.stats
    assert stats.prefill_tokens + stats.shared_tokens == prompt_tokens  # every row a request
    assert stats.steps >= 8 * 5 // 4  # 5 steps a row (the prefill chose the first), 4 slots
    sampled = engine_ev.predict_rows(params, rows, 6, seed=5, temperature=1.0)
    np.testing.assert_array_equal(
        engine_ev.predict_rows(params, rows[3:6], 6, seed=8, temperature=1.0), sampled[3:6])
    assert not np.array_equal(
        engine_ev.predict_rows(params, rows, 6, seed=6, temperature=1.0), sampled)


def test_the_engine_sampler_is_refused_where_it_cannot_decode():
    with pytest.raises(errors.UserError, match="not 'encoder_decoder' ones; use "
                                               "--sampler=static.$"):
        setup(tiny_config(), sampler="engine")
    with pytest.raises(errors.UserError, match=r"beam search \(--num_beams=2\) runs with "
                                               "--sampler=static.$"):
        setup(decoder_config(), sampler="engine", num_beams=2)
    with pytest.raises(errors.UserError, match="sampler='engien'; choose one of static, "
                                               "engine.$"):
        setup(decoder_config(), sampler="engien")
