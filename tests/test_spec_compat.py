"""What was saved before the sectioned run spec still works: every config in configs/
gives the run fingerprint the code before the spec gave it, and checkpoints, config.json
files and a merged PEFT folder written by that code (tests/fixtures/before_spec, made by
make_before_spec.py at 4a880ac) resume to the same losses and evaluate to the same
scores. The expected numbers are that code's own output: no independent value exists
for "what the old code computed", which is the property under test."""

import json
import pathlib
import shutil

import pytest

from t5x_like import config_lib, resolving, structures, train
from t5x_like import eval as eval_cli
from t5x_like.data import get_task_or_mixture
from t5x_like.resilience import resume_fingerprint

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "before_spec"
REPO = pathlib.Path(__file__).resolve().parents[1]
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
FINGERPRINTS = json.loads((FIXTURES / "fingerprints.json").read_text())


@pytest.mark.parametrize("name", sorted(FINGERPRINTS))
def test_every_config_keeps_its_run_fingerprint(name, monkeypatch):
    """Everything but the optimizer state's digest (which needs the model's shapes: see
    the test below) is computed from the spec of the config file as it is today."""
    monkeypatch.chdir(REPO)
    spec = resolving.resolve_spec(resolving.load_config(name, []))
    vocabulary = resolving.asked_vocabulary(spec.vocabulary, None, "vocabulary") or \
        get_task_or_mixture(spec.task).vocabulary
    spec = new_run(spec, vocabulary)
    before = new_run_start(dict(FINGERPRINTS[name]), vocabulary)
    assert resume_fingerprint.spec_fingerprint(spec, vocabulary) == {
        k: v for k, v in before.items() if k != "optimizer.state"}


def new_run(spec, vocabulary):
    """``spec`` with its rows' start id decided as a new run decides it (preflight)."""
    return structures.structure_class(spec.model.family).with_start_id(spec, vocabulary)


def new_run_start(before: dict, vocabulary) -> dict:
    """The fixtures' fingerprints with one deliberate change (issue 63): a decoder run
    whose config leaves ``model.bos_id`` to the run started its rows with 0, the pad id,
    and a new one starts them with its vocabulary's BOS (``<s>``, 3 in the built-in
    SentencePiece; EOS in bytes, which have no BOS); a resume keeps the checkpoint's 0 (the resume tests below)."""
    if before.get("model.bos_id") == 0 and before.get("model.family") == "decoder":
        bos = getattr(vocabulary, "bos_id", None)  # bytes have none: their EOS starts rows
        before["model.bos_id"] = bos if bos not in (None, vocabulary.pad_id) else \
            vocabulary.eos_id
    return before


@pytest.mark.parametrize("name", ["configs/quickstart.py", "configs/pretrain/gpt2_tiny.py",
                                  "configs/pretrain/bert_tiny.py",
                                  "configs/pretrain/mixtral_tiny.py"])
def test_whole_fingerprint_with_the_optimizer_state(name, monkeypatch):
    import jax

    from t5x_like.engine import partitioning
    from t5x_like.engine import trainer as trainer_lib
    monkeypatch.chdir(REPO)
    spec = resolving.resolve_spec(resolving.load_config(name, []))
    trainer = trainer_lib.build_trainer(spec, partitioning.make_mesh({"data": 1},
                                                                     jax.devices()[:1]))
    vocabulary = get_task_or_mixture(spec.task).vocabulary
    spec = new_run(spec, vocabulary)
    # ``stack.layout`` is newer than the fixtures (a checkpoint without it compares the
    # keys both sides have); every unpipelined run's is "layers".
    assert resume_fingerprint.fingerprint(spec, vocabulary, trainer.abstract_state.opt_state) == \
        {**new_run_start(dict(FINGERPRINTS[name]), vocabulary), "stack.layout": "layers"}


def _small(config, steps=4):
    """The fixture runs' settings (make_before_spec.small), in today's spelling, resumed
    to step 4."""
    config.num_train_steps = steps
    config.batch_size = 8
    config.logging.every_steps = 1
    config.checkpoint.every_steps = 2
    config.evals.held_out.every_steps = 2
    config.evals.held_out.batches = 1
    config.checkpoint.keep = 1
    config.optimizer.warmup_steps = 1
    return config


def _t5_run():
    c = config_lib.default_config()
    c.task_feature_lengths = {"inputs": 32, "targets": 8}
    c.model.update(dict(d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=1,
                        num_decoder_layers=1, positions=dict(num_buckets=16)))
    c.evals.benchmark = dict(kind="benchmark", mixture="embedded_austen_cloze", max_examples=4,
                             every_steps=2)
    return _small(c)


def _decoder_run():
    """Given in the old flat spellings, as a config file written before the spec would:
    they must move to the sections and fingerprint the same."""
    c = config_lib.default_config()
    config_lib.apply_overrides(c, ["task=embedded_en_lm", "prefix_attention=causal",
                                   "optimizer.name=adamw", "optimizer.learning_rate=1e-3",
                                   "optimizer.schedule=cosine"])
    c.task_feature_lengths = {"targets": 32}
    c.model = config_lib.model_defaults("decoder")
    c.model.update(dict(vocab_size=8192, d_model=16, num_heads=4, num_kv_heads=2, head_dim=8,
                        d_ff=32, num_layers=2, max_length=64, norm="rmsnorm", use_bias=False,
                        mlp_activations=("silu", "linear"), position_embedding="rotary",
                        tie_embeddings=False, rope_type="llama3", rope_factor=8.0,
                        rope_original_max_length=32, sliding_window=16,
                        num_experts=2, moe_every=2, num_experts_per_token=1))
    return _small(c)


def _bert_head_run():
    c = config_lib.default_config()
    c.task = "embedded_spam"
    c.task_feature_lengths = {"inputs": 32}
    c.model = config_lib.model_defaults("encoder")
    c.model.update(dict(vocab_size=8192, d_model=16, num_heads=2, head_dim=8, d_ff=32,
                        num_layers=1, positions=dict(max_length=64)))
    c.head.kind = "classification"
    c.optimizer.name = "adamw"
    c.optimizer.learning_rate = 1e-3
    return _small(c)


RUNS = {"t5_run": _t5_run, "decoder_run": _decoder_run, "bert_head_run": _bert_head_run}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_checkpoints_saved_before_resume_to_the_same_losses(name, tmp_path):
    workdir = tmp_path / name
    shutil.copytree(FIXTURES / name, workdir)
    train.run(RUNS[name](), str(workdir), quiet=True)
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    losses = {str(m["step"]): m["loss"] for m in lines}
    assert sorted(losses) == ["3", "4"]  # resumed after step 2, not started over
    for step, loss in EXPECTED["resumed_losses"][name].items():
        assert losses[step] == pytest.approx(loss, rel=1e-6)
    saved = json.loads((workdir / "config.json").read_text())
    # The fingerprint gained ``stack.layout`` after these checkpoints (compared only
    # where both sides have it); the rest is unchanged.
    assert saved["fingerprint"] == {**json.loads(
        (FIXTURES / name / "config.json").read_text())["fingerprint"], "stack.layout": "layers"}


@pytest.mark.slow
@pytest.mark.parametrize("name,task,flags", [
    ("t5_run", "embedded_austen_cloze", []),
    ("bert_head_run", "embedded_spam", []),
    ("merged_lora", "embedded_austen_cloze", ["--inputs_length=32", "--targets_length=16"]),
])
def test_checkpoints_saved_before_evaluate_to_the_same_scores(name, task, flags, tmp_path):
    out = tmp_path / "eval"
    assert eval_cli.main([f"--checkpoint={FIXTURES / name}", f"--task={task}",
                          f"--output_dir={out}", "--max_examples=8", "--quiet", *flags]) == 0
    expected = EXPECTED["eval"][name]
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    for key in ("accuracy", "f1", "step"):
        if key in expected:
            assert metrics[key] == pytest.approx(expected[key])
    step = metrics["step"]
    records = [json.loads(line) for line in
               (out / "predictions" / task / f"step_{step}.jsonl").read_text().splitlines()]
    for record, scores in zip(records, expected["option_scores"], strict=True):
        if scores is not None:
            assert record["option_scores"] == pytest.approx(scores, abs=1e-4)


@pytest.mark.parametrize("name", ["t5_run", "decoder_run", "bert_head_run"])
def test_old_config_json_files_read_as_specs(name):
    """Each workdir's config.json, in the flat layout, reads as the spec of its run."""
    saved = json.loads((FIXTURES / name / "config.json").read_text())
    spec = config_lib.spec_of(saved)
    assert spec.batch_size == 8 and spec.checkpoint.every_steps == 2
    assert spec.evals["held_out"].every_steps == 2 and spec.evals["held_out"].batches == 1
    assert spec.model.family == saved["model"]["family"]
    if name == "decoder_run":
        assert spec.model.positions.rope.scaling == "llama3"
        assert spec.model.positions.rope.factor == 8.0
        assert spec.model.attention.num_kv_heads == 2
        assert spec.model.experts.every == 2
        assert spec.data.prefix_attention == "causal"
    if name == "t5_run":
        assert spec.evals["benchmark"].mixture == "embedded_austen_cloze"
        assert spec.evals["benchmark"].every_steps == 2
