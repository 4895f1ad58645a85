"""The typed run spec (``t5x_like.config``): frozen and hashable, built from a config in
either spelling to the same spec, named evaluators made by overrides, the old flat
model view round-tripping, and every refusal naming its key."""

import dataclasses

import ml_collections
import pytest

from t5x_like import config_lib
from t5x_like.config import evals as evals_lib
from t5x_like.config import legacy
from t5x_like.config.model_specs import MODEL_SPECS, model_spec_class
from t5x_like.config.overrides import apply_overrides
from t5x_like.config.run import RunSpec
from t5x_like.errors import ConfigError

LM_FAMILIES = ("decoder", "bilm")  # a targets-only task; the others read inputs too


def _spec(overrides=(), family=None):
    config = config_lib.default_config()
    if family:
        config.model = config_lib.model_defaults(family)
    if family in LM_FAMILIES:
        config.task, config.task_feature_lengths = "embedded_en_lm", {"targets": 64}
    apply_overrides(config, list(overrides))
    return config_lib.spec_of(config)


def test_a_spec_is_frozen_hashable_and_equal_by_value():
    a, b = _spec(), _spec()
    assert a == b and hash(a) == hash(b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.batch_size = 3
    with pytest.raises(TypeError):
        a.task_feature_lengths["targets"] = 3  # a FrozenMap
    c = a.replace(batch_size=a.batch_size * 2)
    assert c != a and c.batch_size == 2 * a.batch_size and a.batch_size == b.batch_size
    assert {a: 1}[b] == 1


def test_a_spec_round_trips_through_its_dict_as_config_json_holds_it():
    for family in MODEL_SPECS:
        spec = _spec(family=family)
        assert config_lib.spec_of(spec.to_dict()) == spec
        assert config_lib.spec_of(ml_collections.ConfigDict(spec.to_dict())) == spec


def test_old_run_spellings_make_the_same_spec_as_the_new():
    old = config_lib.default_config().to_dict()
    for path in ("data", "logging", "checkpoint", "divergence", "resilience"):
        old.pop(path)
    old.pop("evals")
    old.update(pack=False, data_streams=4, log_every_steps=7, checkpoint_every_steps=20,
               keep_checkpoints=5, on_nonfinite_loss="skip_update", eval_every_steps=10,
               eval_batches=3, eval={"mixture": "embedded_bench", "max_examples": 8})
    new = _spec(["data.pack=False", "data.streams=4", "logging.every_steps=7",
                 "checkpoint.every_steps=20", "checkpoint.keep=5",
                 "divergence.on_nonfinite_loss=skip_update", "evals.held_out.every_steps=10",
                 "evals.held_out.batches=3", "evals.benchmark.kind=benchmark",
                 "evals.benchmark.mixture=embedded_bench", "evals.benchmark.max_examples=8",
                 "evals.benchmark.every_steps=10"])  # the old eval followed the held-out
    assert config_lib.spec_of(old) == new


def test_old_flat_model_keys_make_the_same_spec_as_the_sections():
    old = config_lib.model_defaults("decoder").to_dict()
    flat = legacy.flat_model(old, model_spec_class("decoder").defaults())
    flat.update(num_kv_heads=2, rope_type="linear", rope_factor=4.0, dtype="float32",
                attention_impl="chunked", position_embedding="rotary", num_heads=4)
    config = config_lib.default_config()
    config.task, config.task_feature_lengths = "embedded_en_lm", {"targets": 64}
    config.model = ml_collections.ConfigDict(flat)
    new = _spec(["model.attention.num_kv_heads=2", "model.positions.rope.scaling=linear",
                 "model.positions.rope.factor=4.0", "model.numerics.dtype=float32",
                 "model.attention.impl=chunked", "model.positions.kind=rotary",
                 "model.num_heads=4"], family="decoder")
    assert config_lib.spec_of(config) == new


@pytest.mark.parametrize("family", sorted(MODEL_SPECS))
def test_the_flat_model_view_round_trips_for_every_family(family):
    spec_class = model_spec_class(family)
    spec = config_lib.model_spec_of(config_lib.model_defaults(family))
    flat = legacy.flat_model(spec, spec_class.defaults())
    assert not any(isinstance(v, dict) for k, v in flat.items() if k != "numerics"
                   and k != "generator"), flat  # sections flattened to the old names
    assert config_lib.model_spec_of(flat) == spec


def test_old_spellings_on_the_command_line_move_to_their_new_keys():
    spec = _spec(["eval_every_steps=50", "model.dropout_rate=0.2", "pack=False",
                  "eval.mixture=embedded_bench", "eval.harness_tasks=lambada"])
    assert spec.evals["held_out"].every_steps == 50
    assert not spec.data.pack and spec.model.dropout_rate == 0.2
    assert spec.evals["benchmark"].mixture == "embedded_bench"
    assert spec.evals["benchmark"].every_steps == 50  # the held-out cadence, as eval ran
    assert spec.evals["harness"].tasks == "lambada"


def test_evaluators_are_made_by_name_and_typed_by_kind():
    spec = _spec(["evals.glue.mixture=glue_v002_proportional", "evals.glue.kind=benchmark",
                  "evals.glue.every_steps=100", "evals.held_out.every_steps=0"])
    glue = spec.evals["glue"]
    assert isinstance(glue, evals_lib.BenchmarkSpec) and glue.kind == "benchmark"
    assert glue.mixture == "glue_v002_proportional" and glue.max_examples == 0
    assert glue.due(200, 1000) and not glue.due(150, 1000) and glue.due(1000, 1000)
    assert not spec.evals["held_out"].enabled
    assert set(spec.evals) == {"held_out", "glue"}


@pytest.mark.parametrize("overrides, expected", [
    (["evals.glue.kind=bench"], "Did you mean 'benchmark'"),
    (["evals.glue.mixture=x"], "make one first with --config.evals.glue.kind=KIND"),
    (["evals.held_out.batchs=3"], "Did you mean 'evals.held_out.batches'"),
    (["evals.held_out.every_steps=-2"], "'evals.held_out.every_steps' must be a finite "
                                        "number >= -1"),
    (["optimizer.learning_rate=fast"], "--config.optimizer.learning_rate=fast: expected a "
                                       "number"),
    (["optimizer.name=adam"], "'optimizer.name' is 'adam'; choose one of"),
    (["model.experts.num_expert=4"], "Did you mean 'model.experts.num_experts'"),
    (["checkpoint.keep_every_steps=300"], "not a multiple of checkpoint.every_steps"),
    (["mesh.data=3", "mesh.fsdp=-1", "mesh.tensor=-1"], "At most one mesh axis may be -1"),
])
def test_every_refusal_names_its_key(overrides, expected):
    with pytest.raises(ConfigError) as e:
        _spec(overrides, family="decoder" if "model" in overrides[0] else None)
    assert expected in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_a_gone_section_in_a_config_file_names_its_new_spelling(tmp_path):
    path = tmp_path / "old.py"
    path.write_text("from t5x_like import config_lib\n\n"
                    "def get_config():\n"
                    "    c = config_lib.default_config()\n"
                    "    c.eval_every_steps = 25\n"
                    "    return c\n")
    spec = config_lib.spec_of(config_lib.load_config_file(str(path)))
    assert spec.evals["held_out"].every_steps == 25


def test_the_root_holds_only_run_wide_scalars_and_sections():
    sections = [f.name for f in dataclasses.fields(RunSpec)
                if RunSpec.section_type(f.name) is not None]
    assert {"model", "data", "optimizer", "loss", "logging", "checkpoint", "divergence",
            "resilience", "mesh", "partitioning", "head", "peft", "distill"} <= set(sections)


def test_the_specs_loss_choices_are_the_losses_the_objectives_implement():
    """config/run.py sits below objectives/ and cannot import their lists, so the two
    spellings are held equal here: a loss added to one and not the other fails."""
    from t5x_like.config import run
    from t5x_like.objectives import preference

    assert set(run.DPO_LOSS_TYPES) == set(preference.DPO_LOSSES)
    assert set(run.GRPO_LOSS_TYPES) == set(preference.GRPO_AGGREGATIONS)
    assert set(run.GRPO_RATIO_LEVELS) == set(preference.GRPO_RATIO_LEVELS)
