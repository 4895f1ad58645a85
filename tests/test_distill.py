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

from conftest import tiny_config
from t5x_like import config_lib, distill, models, partitioning, train
from t5x_like.models import structures

SMALL = {"vocab_size": 8192, "d_model": 32, "num_heads": 2, "head_dim": 16, "d_ff": 64}
FAMILIES = {
    "encoder": ({"inputs": 16}, dict(num_layers=2, max_length=32, next_sentence_head=False)),
    "decoder": ({"targets": 16}, dict(num_layers=2, max_length=32)),
    "encoder_decoder": ({"inputs": 16, "targets": 8},
                        dict(num_encoder_layers=2, num_decoder_layers=2)),
    "bart": ({"inputs": 16, "targets": 8},
             dict(num_encoder_layers=2, num_decoder_layers=2, max_length=32, pad_id=0,
                  eos_id=1, decoder_start_id=0)),
}


def test_layers_are_taken_evenly_spaced_as_distilbert_does():
    assert distill.evenly_spaced(12, 6) == [0, 2, 4, 7, 9, 11]
    assert distill.evenly_spaced(4, 2) == [0, 3]
    assert distill.evenly_spaced(3, 1) == [0]
    with pytest.raises(config_lib.ConfigError, match="takes a subset"):
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


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_teacher_distilled_into_itself_at_t1_gives_no_soft_target_gradient(family):
    config = family_config(family)
    structure = structures.for_config(config)
    lengths = dict(config.task_feature_lengths)
    batch = random_batch(structure, lengths)
    params = nn.unbox(structure.model.init(jax.random.key(0), *models.example_inputs(
        structure.model, structure.model_feature_lengths(lengths)))["params"])
    settings = ml_collections.ConfigDict(dict(temperature=1.0, soft_weight=1.0,
                                              hard_weight=0.0, cosine_weight=0.0))
    loss_fn = distill.make_loss_fn(structure, structure, config.loss, settings)
    grads, metrics = jax.grad(lambda p: loss_fn(structure.model, p, batch, None,
                                                teacher_params=params), has_aux=True)(params)
    assert float(metrics["soft_target_loss"]) == pytest.approx(0.0, abs=1e-6)
    assert float(metrics["cosine_loss"]) == pytest.approx(0.0, abs=1e-5)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) < 1e-6
    # Another student does feel the teacher.
    other = jax.tree.map(lambda x: x * 1.1, params)
    grads, metrics = jax.grad(lambda p: loss_fn(structure.model, p, batch, None,
                                                teacher_params=other), has_aux=True)(params)
    assert float(metrics["soft_target_loss"]) > 0
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) > 1e-6


def test_the_soft_target_gradient_is_t_times_the_softmax_difference():
    s = jnp.asarray([[1.0, 2.0, 0.5]])
    t = jnp.asarray([[0.0, 3.0, 1.0]])
    grad = jax.grad(lambda x: distill.soft_target_loss(x, t, 2.0).sum())(s)
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
    train.run(encoder_run_config(num_layers=3), str(teacher_dir), quiet=True)
    config = encoder_run_config(num_layers=2)
    config.distill.teacher = str(teacher_dir)
    config_lib.validate(config)
    result = train.run(config, str(tmp_path / "student"), quiet=True)
    records = [json.loads(line) for line in
               (tmp_path / "student" / "metrics.jsonl").read_text().splitlines()]
    assert any("soft_target_loss" in r for r in records)
    assert np.isfinite(result["eval"]["eval_loss"])

    from t5x_like.evaluation import loading
    mesh = partitioning.make_mesh({"data": 1}, jax.devices()[:1])
    teacher_params, _ = loading.base_params(str(teacher_dir), encoder_run_config(num_layers=3),
                                            mesh)
    student_params, _ = loading.base_params(str(tmp_path / "student"), config, mesh)
    # One student: a two-layer tree of the same parts, nothing of the teacher added.
    assert set(student_params) == set(teacher_params) - {"layers_2"}
    # Started from the teacher's layers 0 and 2, then trained: close to them, not equal.
    taught = teacher_params["layers_2"]["mlp"]["wi"]["kernel"]
    learned = student_params["layers_1"]["mlp"]["wi"]["kernel"]
    assert np.abs(np.asarray(learned) - np.asarray(taught)).max() < 0.05


def test_a_teacher_with_another_vocabulary_is_refused(tmp_path):
    config = encoder_run_config()
    folder = tmp_path / "teacher"
    folder.mkdir()
    teacher = dict(config.model.to_dict(), vocab_size=1000)
    (folder / "model_config.json").write_text(json.dumps(teacher, default=list))
    config.distill.teacher = str(folder)
    with pytest.raises(config_lib.ConfigError, match="another vocabulary"):
        distill.check_teacher(config, *distill.teacher_model_config(config), None)


def test_distillation_settings_are_checked():
    config = encoder_run_config()
    config.distill.teacher = "somewhere"
    config.distill.temperature = 0.0
    with pytest.raises(config_lib.ConfigError, match="distill.temperature"):
        config_lib.validate(config)
    config.distill.temperature = 2.0
    config.init_from = "elsewhere"
    with pytest.raises(config_lib.ConfigError, match="pick one"):
        config_lib.validate(config)
