"""Preference training through ``train``: DPO from a decoder checkpoint against its frozen
reference, exact resume, the reference untouched and sharded like the policy, the reward
model and SimPO on the same rows, and the one-line refusals (bad rows, a reference of
another vocabulary, settings that cannot work)."""

import json

import jax
import numpy as np
import pytest
from conftest import set_keys

from t5x_like import config_lib, errors, infer, resolving, structures, train
from t5x_like.checkpoints import param_sources
from t5x_like.config import spec_of
from t5x_like.data import preference as preference_data
from t5x_like.engine import trainer as trainer_lib
from t5x_like.modes import preference


def decoder_config(**overrides):
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("decoder")
    config.model.update(dict(vocab_size=8192, d_model=32, num_heads=2, head_dim=16, d_ff=64,
                             num_layers=2))
    config.task = "embedded_en_lm"
    config.task_feature_lengths = {"targets": 32}
    config.batch_size = 8
    config.num_train_steps = 2
    config.logging.every_steps = 1
    config.checkpoint.every_steps = 2
    config.evals.held_out.every_steps = 1000
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 1e-3
    config.optimizer.warmup_steps = 0
    set_keys(config, overrides)
    return config


def dpo_config(init_from, **overrides):
    return decoder_config(**{"task": "embedded_austen_cloze_preference",
                             "task_feature_lengths": {"inputs": 40, "targets": 8},
                             "init_from": str(init_from), "preference.objective": "dpo",
                             "preference.beta": 0.5, "num_train_steps": 4,
                             "evals.held_out.every_steps": 4, "evals.held_out.batches": 1,
                             **overrides})


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """A decoder checkpoint to start from (two LM steps)."""
    workdir = tmp_path_factory.mktemp("sft")
    train.run(decoder_config(), str(workdir), quiet=True)
    return workdir


def metrics_of(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").open()]


@pytest.mark.slow
def test_dpo_trains_logs_its_rewards_and_resumes_exactly(sft_run, tmp_path):
    # The reference (init_from) as it was before any DPO step: its files, byte for byte.
    before = {p.relative_to(sft_run): p.read_bytes() for p in sorted(sft_run.rglob("*"))
              if p.is_file() and "checkpoints" in p.parts}
    straight = tmp_path / "straight"
    train.run(dpo_config(sft_run), str(straight), quiet=True)
    records = metrics_of(straight)
    first = records[0]
    # Step 1: the policy is the reference, so the implicit rewards are 0 and the loss ln 2.
    assert first["loss"] == pytest.approx(np.log(2.0), abs=1e-5)
    assert first["rewards_chosen"] == pytest.approx(0.0, abs=1e-5)
    for key in ("rewards_rejected", "rewards_margin", "accuracy", "logps_chosen", "grad_norm"):
        assert key in first
    assert records[-1]["rewards_margin"] != 0.0
    # held-out pairs, scored against the same reference
    assert 0.0 <= records[-1]["eval_accuracy"] <= 1.0 and "eval_rewards_margin" in records[-1]
    assert first["tokens_per_sec"] == pytest.approx(
        2 * 8 * 48 * first["steps_per_sec"], rel=1e-6)  # both rows of every pair

    interrupted = tmp_path / "interrupted"
    train.run(dpo_config(sft_run, num_train_steps=2), str(interrupted), quiet=True)
    train.run(dpo_config(sft_run), str(interrupted), quiet=True)
    assert [r["loss"] for r in metrics_of(interrupted)] == [r["loss"] for r in records]

    # The reference (init_from) was read, never written: its checkpoint files are the
    # snapshot's (and step 1's ln 2 says the policy started from them).
    after = {p.relative_to(sft_run): p.read_bytes() for p in sorted(sft_run.rglob("*"))
             if p.is_file() and "checkpoints" in p.parts}
    assert after == before


def test_a_frozen_reference_under_fsdp_gives_one_devices_numbers(sft_run):
    """The reference is placed by its logical axes: FSDP over 8 devices shards it as the
    policy, and the step's loss and rewards equal one device's."""
    spec = spec_of(dpo_config(sft_run, batch_size=8))
    reference = preference.reference_source(spec)
    batch = _pair_batch(spec)
    results = []
    for devices, mesh in ((jax.devices()[:1], {}), (jax.devices(), {"mesh.fsdp": 8})):
        run = spec_of(set_keys(dpo_config(sft_run, batch_size=8), mesh))
        _, trainer = trainer_lib.build_on_devices(run, devices)
        structure, params = preference.load_reference(run, reference, trainer.mesh)
        trainer.attach_frozen(structure.model, params, structures.for_config(run).loss_fn(
            run.loss, reference=structure), in_evaluation=True)
        if len(devices) > 1:
            kernel = trainer.frozen_params["layers_0"]["mlp"]["wi"]["kernel"]
            assert len(kernel.sharding.device_set) == 8 and not kernel.sharding.is_fully_replicated
        state = trainer.state_from_params(params)
        from t5x_like.engine import partitioning
        metrics = jax.device_get(trainer.eval_step(state.params, partitioning.global_batch(
            batch, trainer.mesh, trainer.rules)))
        results.append(metrics)
    one, eight = results
    for key in one:
        np.testing.assert_allclose(one[key], eight[key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert one["num_target_tokens"] == 8  # pairs


def _pair_batch(spec):
    from t5x_like.data import pipeline
    lengths = dict(spec.task_feature_lengths)
    converter = structures.for_config(spec).feature_converter(lengths)
    rows = pipeline.build_dataset(spec.task, "validation", lengths, seed=0, shuffle=False,
                                  feature_converter=converter)
    taken = [row for _, row in zip(range(spec.batch_size), iter(rows), strict=False)]
    return {key: np.stack([row[key] for row in taken]) for key in taken[0]}


@pytest.mark.parametrize("objective", ["reward_model", "simpo"])
def test_reward_model_and_simpo_train_from_the_decoder(sft_run, tmp_path, objective, capsys):
    workdir = tmp_path / objective
    train.run(dpo_config(sft_run, **{"preference.objective": objective,
                                     "preference.beta": 2.0}), str(workdir), quiet=True)
    records = metrics_of(workdir)
    assert len(records) == 4 and all(np.isfinite(r["loss"]) for r in records)
    assert 0.0 <= records[-1]["accuracy"] <= 1.0
    source = param_sources.resolve(str(workdir))
    spec = resolving.resolve_checkpoint(source, source.steps()[-1]).spec
    if objective == "simpo":  # a policy evaluates, infers and scores as the decoder it is
        assert spec.preference.objective == "" and spec.data.prefix_attention == "causal"
        assert structures.for_config(spec).name == "decoder"
        return
    # a reward model scores texts with infer
    lines = [{"prompt": "It was a truth universally", "response": "acknowledged"},
             {"prompt": "It was a truth universally", "response": "banana"},
             {"prompt": "It was a truth universally", "response": "acknowledged"}]
    (tmp_path / "texts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert infer.main([f"--checkpoint={workdir}", f"--input_file={tmp_path / 'texts.jsonl'}",
                       f"--output_file={tmp_path / 'rewards.jsonl'}"]) == 0
    scored = [json.loads(line) for line in (tmp_path / "rewards.jsonl").open()]
    rewards = [r["reward"] for r in scored]
    assert [r["response"] for r in scored] == [x["response"] for x in lines]
    assert rewards[0] == pytest.approx(rewards[2], abs=1e-6) and rewards[0] != rewards[1]
    # the same number as the structure's own, on the pair row the model trained on
    structure = structures.for_config(spec)
    vocabulary = spec_vocabulary(spec)
    row = structure.scoring_rows(vocabulary.encode(lines[1]["prompt"]),
                                 vocabulary.encode(lines[1]["response"]) + [vocabulary.eos_id],
                                 spec.task_feature_lengths)
    params = param_sources.base_params(str(workdir), spec, None)[0]
    direct = structure.rewards(params, row["tokens"][None], row["mask"][None])
    assert float(direct[0]) == pytest.approx(rewards[1], rel=1e-4, abs=1e-5)
    for line, message in (("not json", "bad.jsonl:1 is not JSON"),
                          ('{"prompt": "a"}', 'bad.jsonl:1: a reward model scores')):
        (tmp_path / "bad.jsonl").write_text(line + "\n")
        assert infer.main([f"--checkpoint={workdir}", f"--input_file={tmp_path / 'bad.jsonl'}",
                           f"--output_file={tmp_path / 'bad_rewards.jsonl'}"]) == 2
        assert message in capsys.readouterr().err


def spec_vocabulary(spec):
    from t5x_like.data import get_task_or_mixture
    return get_task_or_mixture(spec.task).vocabulary


@pytest.mark.parametrize("row,message", [
    ({"prompt": "a", "chosen": "b"}, r"pairs\.jsonl:1: .*lacks \['rejected'\]"),
    ({"prompt": "a", "chosen": "b", "rejected": "b"}, "the same response"),
    ({"prompt": "a", "chosen": ["b"], "rejected": "c"}, "'chosen' is list"),
    ({"prompt": [{"role": "user", "content": "a"}], "chosen": [{"role": "bot", "content": "b"}],
      "rejected": "c"}, "message 1 is not"),
    ({"prompt": "a", "chosen": "b", "rejected": "c", "margin": "big"}, "'margin' must be"),
])
def test_bad_preference_rows_name_their_file_and_line(tmp_path, row, message):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=message):
        preference_data.PreferenceSource((str(path),), holdout_every=0).get("train")


def test_conversational_rows_render_with_the_chat_template(tmp_path):
    from test_chat_sft import make_tokenizer

    import t5x_like.data as td
    from t5x_like.data import hf_tokenizers
    from t5x_like.data import preprocessors as pp
    folder = make_tokenizer(tmp_path / "tok")
    vocabulary = hf_tokenizers.HfTokenizerVocabulary(folder)
    features = {k: td.Feature(vocabulary) for k in ("prompt", "chosen", "rejected")}
    ctx = pp.Context("prefs", "train", {"inputs": 64, "targets": 16}, features)
    prompt = [{"role": "user", "content": "Say hello in French."}]
    pair = preference_data.preference_pair(
        {"prompt": prompt, "chosen": [{"role": "assistant", "content": "Bonjour !"}],
         "rejected": "Hello."}, "row")
    tokens = preference_data.TokenizePair().map(pair, None, ctx)
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(str(folder))
    whole = hf.apply_chat_template(prompt + [{"role": "assistant", "content": "Bonjour !"}],
                                   tokenize=True, return_dict=True)["input_ids"]
    prompt_ids = hf.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True,
                                        return_dict=True)["input_ids"]
    assert tokens["prompt"].tolist() == list(prompt_ids)
    assert tokens["prompt"].tolist() + tokens["chosen"].tolist() == list(whole)


def test_a_reference_of_another_vocabulary_is_refused(sft_run, tmp_path):
    other = tmp_path / "other_vocab"
    train.run(decoder_config(**{"model.vocab_size": 8320}), str(other), quiet=True)
    with pytest.raises(errors.ConfigError, match="8320 vocabulary entries.*policy's tokenizer"):
        train.run(dpo_config(sft_run, **{"preference.reference": str(other)}),
                  str(tmp_path / "dpo"), quiet=True)


@pytest.mark.parametrize("overrides,message", [
    ({"init_from": ""}, "neither preference.reference nor init_from"),
    ({"data.pack": True}, "batched, not packed"),
    ({"preference.loss_type": "robust"}, "label_smoothing > 0"),
    ({"preference.label_smoothing": 0.5}, "below 0.5"),
    ({"preference.objective": "orpo", "optimizer.microbatches": 2}, "microbatches=1"),
    ({"task_feature_lengths": {"targets": 8}}, "task_feature_lengths.inputs"),
    ({"preference.beta": 0.0}, "must be a finite number > 0"),
])
def test_preference_settings_that_cannot_work_are_refused(tmp_path, overrides, message):
    with pytest.raises(errors.ConfigError, match=message):
        spec_of(set_keys(dpo_config(tmp_path), overrides))


def test_preference_tuning_of_an_encoder_is_refused_naming_the_fix(tmp_path):
    from t5x_like import resolving
    config = dpo_config(tmp_path)
    config.model = config_lib.model_defaults("encoder")
    with pytest.raises(errors.ConfigError, match="does not continue a prompt.*decoder checkpoint"):
        resolving.resolve_spec(config)


def test_dpo_with_lora_trains_the_adapters_against_the_full_reference(sft_run, tmp_path):
    """LoRA on the policy; the reference is init_from's full params. The policy starts
    as the reference (LoRA's B is zero), so step 1's loss is ln 2; the checkpoint keeps
    what trained."""
    workdir = tmp_path / "dpo_lora"
    train.run(dpo_config(sft_run, **{"peft.lora.rank": 4, "num_train_steps": 3,
                                     "optimizer.learning_rate": 1e-2}), str(workdir), quiet=True)
    logged = metrics_of(workdir)
    assert logged[0]["loss"] == pytest.approx(np.log(2.0), abs=1e-5)
    assert logged[-1]["rewards_margin"] != 0.0
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["peft"]["lora"]["rank"] == 4 and saved["preference"]["objective"] == "dpo"


def test_plan_compiles_dpo_with_its_reference_sharded_like_the_policy(tmp_path):
    """The planner compiles DPO's step with an abstract reference (the policy's model):
    its bytes per device are the params', sharded the same way over FSDP."""
    from t5x_like.planner import aot_planner
    report = aot_planner.plan(dpo_config(tmp_path, **{"mesh.fsdp": 8}), "cpu:8")
    memory = report["memory_per_device"]
    assert memory["frozen_params"] == memory["params"] > 0


def test_eval_scores_a_reward_model_on_held_out_pairs(sft_run, tmp_path):
    """``eval`` of a reward model on a preference task: its pair accuracy and margin, the
    numbers its structure gives on the same rows."""
    from t5x_like import eval as eval_cli
    workdir = tmp_path / "rm"
    train.run(dpo_config(sft_run, **{"preference.objective": "reward_model",
                                     "num_train_steps": 2}), str(workdir), quiet=True)
    out = tmp_path / "rm_eval"
    assert eval_cli.main([f"--checkpoint={workdir}", "--task=embedded_austen_cloze_preference",
                          f"--output_dir={out}", "--max_examples=16", "--quiet"]) == 0
    line = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    records = [json.loads(x) for x in (out / "predictions" / "embedded_austen_cloze_preference"
                                       / "step_2.jsonl").read_text().splitlines()]
    assert len(records) == 16
    wins = np.mean([r["chosen_reward"] > r["rejected_reward"] for r in records])
    assert line["accuracy"] == pytest.approx(wins)
    assert line["margin"] == pytest.approx(np.mean([r["chosen_reward"] - r["rejected_reward"]
                                                    for r in records]), abs=1e-6)
