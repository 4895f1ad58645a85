"""Distillation: the soft-target gradient vanishes when the student is the teacher, the
student starts from evenly spaced teacher layers, every structure exposes what is
matched, and a run trains a student against a frozen, sharded teacher."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from conftest import drawn_params, tiny_config

from t5x_like import config_lib, errors, models, objectives, structures, train
from t5x_like.engine import partitioning
from t5x_like.modes import distill

SMALL = {"vocab_size": 8192, "d_model": 32, "num_heads": 2, "head_dim": 16, "d_ff": 64}
# One layer a stack: the soft-target test compares a model with itself, whatever its depth,
# and a layer fewer is a smaller program to compile (BART's post-norm LayerNorms and exact
# GELU make large fusions: 2+2 layers compiled in 26 s, 1+1 in 17 s). The tests that take
# layers from a teacher set their own counts.
FAMILIES = {
    "encoder": ({"inputs": 16}, dict(num_layers=1, max_length=32, next_sentence_head=False)),
    "decoder": ({"targets": 16}, dict(num_layers=1, max_length=32)),
    "encoder_decoder": ({"inputs": 16, "targets": 8},
                        dict(num_encoder_layers=1, num_decoder_layers=1)),
    "bart": ({"inputs": 16, "targets": 8},
             dict(num_encoder_layers=1, num_decoder_layers=1, max_length=32, pad_id=0,
                  eos_id=1, decoder_start_id=0)),
}


def test_layers_are_taken_evenly_spaced_as_distilbert_does():
    assert distill.evenly_spaced(12, 6) == [0, 2, 4, 7, 9, 11]
    assert distill.evenly_spaced(4, 2) == [0, 3]
    assert distill.evenly_spaced(3, 1) == [0]
    with pytest.raises(errors.UserError, match="takes a subset"):
        distill.evenly_spaced(2, 3)


def family_config(family, **model):
    lengths, settings = FAMILIES[family]
    config = tiny_config()
    config.model = config_lib.model_defaults(family)
    config.model.update({**SMALL, **settings, **model})
    config.task_feature_lengths = lengths
    return config


def random_batch(structure, lengths, rows=3):
    rng = np.random.default_rng(0)
    batch = {}
    for name, spec in structure.abstract_batch(lengths, rows).items():
        if spec.dtype == jnp.float32:
            batch[name] = (rng.random(spec.shape) < 0.5).astype(np.float32)
        else:
            batch[name] = rng.integers(2, 200, size=spec.shape).astype(np.int32)
    return batch


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f == "bart" else f
                                    for f in sorted(FAMILIES)])
def test_a_teacher_distilled_into_itself_at_t1_gives_no_soft_target_gradient(family):
    config = family_config(family)
    structure = structures.for_config(config)
    lengths = dict(config.task_feature_lengths)
    batch = random_batch(structure, lengths)
    # Drawn in numpy (traced, not compiled), where an eager init ran op by op.
    params = drawn_params(structure.model, *models.example_inputs(
        structure.model, structure.model_feature_lengths(lengths)))
    settings = ml_collections.ConfigDict(dict(temperature=1.0, soft_weight=1.0,
                                              hard_weight=0.0, cosine_weight=0.0))
    loss_fn = distill.make_loss_fn(structure, structure, config.loss, settings)
    # The batch is an argument, not a constant baked into the program.
    distil = jax.jit(jax.grad(lambda p, t, b: loss_fn(structure.model, p, b, None,
                                                      frozen_params=t), has_aux=True))
    grads, metrics = distil(params, params, batch)
    assert float(metrics["soft_target_loss"]) == pytest.approx(0.0, abs=1e-6)
    assert float(metrics["cosine_loss"]) == pytest.approx(0.0, abs=1e-5)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) < 1e-6
    # Another student does feel the teacher.
    other = jax.tree.map(lambda x: x * 1.1, params)
    grads, metrics = distil(params, other, batch)
    assert float(metrics["soft_target_loss"]) > 0
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) > 1e-6


def test_the_soft_target_gradient_is_t_times_the_softmax_difference():
    s = jnp.asarray([[1.0, 2.0, 0.5]])
    t = jnp.asarray([[0.0, 3.0, 1.0]])
    grad = jax.grad(lambda x: objectives.soft_target_loss(x, t, 2.0).sum())(s)
    expected = 2.0 * (jax.nn.softmax(s / 2.0) - jax.nn.softmax(t / 2.0))
    np.testing.assert_allclose(np.asarray(grad), np.asarray(expected), rtol=1e-5)


def encoder_run_config(**model):
    config = family_config("encoder", **model)
    config.task = "embedded_en_mlm"
    config.num_train_steps, config.eval_every_steps, config.checkpoint_every_steps = 3, 3, 3
    config.optimizer.name, config.optimizer.learning_rate = "adamw", 1e-3
    config.mesh.data, config.mesh.fsdp = 2, 4
    return config


@pytest.mark.slow
def test_a_student_distils_from_a_frozen_sharded_teacher(tmp_path):
    teacher_dir = tmp_path / "teacher"
    teacher_config = encoder_run_config(num_layers=3)
    teacher_config.eval_every_steps = 0  # nothing reads the teacher's eval
    train.run(teacher_config, str(teacher_dir), quiet=True)
    config = encoder_run_config(num_layers=2)
    config.distill.teacher = str(teacher_dir)
    config_lib.validate(config)
    result = train.run(config, str(tmp_path / "student"), quiet=True)
    records = [json.loads(line) for line in
               (tmp_path / "student" / "metrics.jsonl").read_text().splitlines()]
    assert any("soft_target_loss" in r for r in records)
    assert np.isfinite(result["eval"]["eval_loss"])

    from t5x_like.checkpoints import param_sources
    mesh = partitioning.make_mesh({"data": 1}, jax.devices()[:1])
    teacher_params, _ = param_sources.base_params(str(teacher_dir), encoder_run_config(num_layers=3),
                                            mesh)
    student_params, _ = param_sources.base_params(str(tmp_path / "student"), config, mesh)
    # One student: a two-layer tree of the same parts, nothing of the teacher added.
    assert set(student_params) == set(teacher_params) - {"layers_2"}
    # Started from the teacher's layers 0 and 2, then trained: close to them, not equal.
    taught = teacher_params["layers_2"]["mlp"]["wi"]["kernel"]
    learned = student_params["layers_1"]["mlp"]["wi"]["kernel"]
    assert np.abs(np.asarray(learned) - np.asarray(taught)).max() < 0.05


def test_a_teacher_with_another_vocabulary_is_refused_with_exit_2(tmp_path, capsys):
    folder = tmp_path / "teacher"
    folder.mkdir()
    teacher = dict(config_lib.load_config_file("configs/pretrain/distil_bert_tiny.py")
                   .model.to_dict(), vocab_size=1000)
    (folder / "model_config.json").write_text(json.dumps(teacher, default=list))
    code = train.main(["--config=configs/pretrain/distil_bert_tiny.py",
                       f"--workdir={tmp_path / 'student'}", f"--config.distill.teacher={folder}",
                       "--quiet"])
    assert code == 2
    assert "another vocabulary" in capsys.readouterr().err
    assert not (tmp_path / "student" / "checkpoints").exists()


def test_distillation_settings_are_checked():
    config = encoder_run_config()
    config.distill.teacher = "somewhere"
    config.distill.temperature = 0.0
    with pytest.raises(errors.ConfigError, match="distill.temperature"):
        config_lib.validate(config)
    config.distill.temperature = 2.0
    config.init_from = "elsewhere"
    with pytest.raises(errors.ConfigError, match="pick one"):
        config_lib.validate(config)


def test_a_distilbert_student_starts_from_a_bert_teacher():
    teacher_config = family_config("encoder", num_layers=4)
    student_config = family_config("encoder", num_layers=2, type_vocab_size=1)
    teacher_params = jax.device_get(drawn_params(  # drawn in numpy, not an eager init
        structures.for_config(teacher_config).model, jnp.ones((1, 8), jnp.int32)))
    student_shapes = jax.eval_shape(lambda: nn.unbox(
        structures.for_config(student_config).model.init(
            jax.random.key(1), jnp.ones((1, 8), jnp.int32))["params"]))
    student = distill.student_from_teacher(teacher_params, student_shapes)
    np.testing.assert_array_equal(student["layers_1"]["mlp"]["wi"]["kernel"],
                                  teacher_params["layers_3"]["mlp"]["wi"]["kernel"])
    np.testing.assert_array_equal(student["token_type_embedder"]["embedding"],
                                  teacher_params["token_type_embedder"]["embedding"][:1])
    wider = family_config("encoder", num_layers=2, d_model=48, head_dim=24)
    wider_shapes = jax.eval_shape(lambda: nn.unbox(structures.for_config(wider).model.init(
        jax.random.key(1), jnp.ones((1, 8), jnp.int32))["params"]))
    with pytest.raises(errors.UserError, match="teacher's widths"):
        distill.student_from_teacher(teacher_params, wider_shapes)


# -- Hugging Face DistilBERT ------------------------------------------------------------------

def test_imported_distilbert_matches_transformers_and_exports_back(tmp_path):
    import torch
    import transformers

    from t5x_like.convert import __main__ as convert_cli
    from t5x_like.convert import load_pretrained
    torch.manual_seed(0)
    hf_model = transformers.DistilBertForMaskedLM(transformers.DistilBertConfig(
        vocab_size=100, dim=32, n_heads=4, n_layers=2, hidden_dim=48,
        max_position_embeddings=40, dropout=0.0, attention_dropout=0.0)).eval()
    hf_model.save_pretrained(tmp_path / "hf")
    assert convert_cli.main(["import", f"--hf_dir={tmp_path / 'hf'}",
                             f"--out={tmp_path / 'ours'}"]) == 0
    model_config, params = load_pretrained(tmp_path / "ours")
    model_config = convert_cli.flat_model(model_config)  # the converters' flat view
    model = structures.build_model(ml_collections.ConfigDict(model_config))
    rng = np.random.default_rng(0)
    mask = np.arange(16)[None, :] < np.array([[16], [9]])
    tokens = np.where(mask, rng.integers(5, 100, size=(2, 16)), 0)

    def hf_logits(m):
        with torch.no_grad():
            return m(input_ids=torch.tensor(tokens),
                     attention_mask=torch.tensor(mask)).logits.numpy()
    apply = jax.jit(model.apply)  # one compile for both parameter sets, not op by op
    ours = np.asarray(apply({"params": params}, tokens)["mlm_logits"])
    theirs = hf_logits(hf_model)
    assert np.abs(ours[mask] - theirs[mask]).max() / np.abs(theirs).max() < 1e-4

    # A token-type row that is not zero is folded into the positions on export.
    params["token_type_embedder"]["embedding"] = np.full((1, 32), 0.25, np.float32)
    from t5x_like.convert import save_pretrained
    save_pretrained(tmp_path / "shifted", model_config, params)
    assert convert_cli.main(["export", f"--checkpoint={tmp_path / 'shifted'}",
                             f"--out={tmp_path / 'back'}"]) == 0
    reloaded = transformers.DistilBertForMaskedLM.from_pretrained(tmp_path / "back").eval()
    shifted = np.asarray(apply({"params": params}, tokens)["mlm_logits"])
    np.testing.assert_allclose(hf_logits(reloaded)[mask], shifted[mask], atol=1e-4)


def test_each_distillation_mistake_has_its_own_message(tmp_path):
    config = encoder_run_config()
    config.distill.teacher = "somewhere"
    config.head.kind = "classification"
    with pytest.raises(errors.ConfigError, match="Distil first, then fine-tune"):
        config_lib.validate(config)
    config.head.kind = ""
    config.peft.lora.rank = 4
    with pytest.raises(errors.ConfigError, match="turn peft off"):
        config_lib.validate(config)
    config.peft.lora.rank = 0
    spec = config_lib.spec_of(config)
    decoder_teacher = config_lib.model_spec_of(dict(SMALL, family="decoder"))
    with pytest.raises(errors.UserError, match="same batches"):
        distill.check_teacher(spec, _teacher(decoder_teacher), None)
    wider = spec.model.replace(d_model=64)
    with pytest.raises(errors.UserError, match="cosine_weight=0"):
        distill.check_teacher(spec, _teacher(wider), None)


def _teacher(model) -> distill.TeacherSource:
    return distill.TeacherSource("somewhere", None, 0, model, None)
