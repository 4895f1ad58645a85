"""Pipeline stages: a scanned stack's layers split over a ``stage`` mesh axis.

Logits and gradients on (stage 4) and (stage 2, fsdp 2) equal one device's for the
GPipe and the circular schedule, for a decoder (packed rows too) and a BERT-style
encoder; each device holds only its stage's layers and hands activations on by a
collective permute; a short run on a pipelined mesh logs a data-parallel run's
losses and resumes bit for bit; meshes and models the stages cannot split are
refused before anything compiles.
"""

import json
import pathlib
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import check_mesh_on_8, drawn_params, set_keys

from t5x_like import config_lib, errors, models, structures, train
from t5x_like.engine import partitioning
from t5x_like.engine import trainer as trainer_lib
from t5x_like.models import pipeline_parallel

BATCH, LENGTH = 8, 16


def _model(family, num_layers):
    model_config = config_lib.model_defaults(family)
    model_config.update(dict(vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=48,
                             num_layers=num_layers, positions=dict(max_length=LENGTH),
                             numerics=dict(scan_layers=True)))
    return structures.build_model(model_config)


def _features(family, packed):
    tokens = np.random.default_rng(0).integers(1, 64, (BATCH, LENGTH)).astype(np.int32)
    if not packed:
        return tokens, {}
    segments = np.tile(np.repeat([1, 2, 0], [7, 6, 3]), (BATCH, 1)).astype(np.int32)
    if family == "encoder":
        return tokens, {"segment_ids": segments}
    positions = np.tile(np.concatenate([np.arange(7), np.arange(6), np.arange(3)]), (BATCH, 1))
    return tokens, {"decoder_segment_ids": segments,
                    "decoder_positions": positions.astype(np.int32)}


def _is_box(x):
    return isinstance(x, nn.LogicallyPartitioned)


CASES = {
    # name: (family, layers, mesh, schedule, microbatches, layers a visit, packed)
    "decoder-gpipe-stage4": ("decoder", 4, {"stage": 4, "data": 2}, "gpipe", 0, 1, False),
    "decoder-gpipe-stage2-fsdp2-packed": ("decoder", 4, {"stage": 2, "fsdp": 2, "data": 2},
                                          "gpipe", 2, 1, True),
    "decoder-circular-stage4": ("decoder", 8, {"stage": 4, "data": 2}, "circular", 4, 1, False),
    "decoder-circular-stage2-fsdp2-packed": ("decoder", 8, {"stage": 2, "fsdp": 2, "data": 2},
                                             "circular", 2, 2, True),
    "encoder-gpipe-stage4-packed": ("encoder", 4, {"stage": 4, "data": 2}, "gpipe", 4, 1, True),
    "encoder-circular-stage2-fsdp2": ("encoder", 8, {"stage": 2, "fsdp": 2, "data": 2},
                                      "circular", 2, 1, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_pipelined_mesh_gives_one_devices_logits_and_gradients(case):
    family, num_layers, mesh_shape, schedule, microbatches, per_visit, packed = CASES[case]
    model = _model(family, num_layers)
    tokens, features = _features(family, packed)
    params = drawn_params(model, *models.example_inputs(model, {}))

    def forward_and_grad(p, tokens, features):
        def loss(p):  # every output position and every parameter reach the gradient
            out = model.apply({"params": p}, tokens, **features)
            return sum(jnp.mean(jnp.sin(x)) for x in jax.tree.leaves(out)), out
        (_, out), grads = jax.value_and_grad(loss, has_aux=True)(p)
        return out, grads

    single = jax.jit(forward_and_grad)(params, tokens, features)

    mesh = partitioning.make_mesh(mesh_shape)
    rules = partitioning.axis_rules("fsdp")
    settings = pipeline_parallel.PipelineSettings(schedule, microbatches, per_visit, mesh_shape["stage"])
    with trainer_lib._MeshAndRules(mesh, rules, pipeline_settings=settings):
        boxed = trainer_lib.abstract_boxed_params(model, {})
        shapes = jax.tree.map(lambda b: b.value.shape, boxed, is_leaf=_is_box)
        # The same parameters in the pipeline's layout: circular laps are a leading axis.
        staged = jax.tree.map(lambda p, shape: p.reshape(shape), params, shapes,
                              is_leaf=lambda x: isinstance(x, tuple))
        staged = jax.device_put(staged, partitioning.logical_shardings(boxed, mesh, rules))
        rows = partitioning.batch_sharding(mesh, rules)
        args = (staged, jax.device_put(tokens, rows), jax.device_put(features, rows))
        step = jax.jit(forward_and_grad).lower(*args).compile()  # read below, and run
        out, grads = step(*args)
        compiled = step.as_text()
    for a, b in zip(jax.tree.leaves(single[0]), jax.tree.leaves(out), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=2e-6)
    flat = jax.tree.map(lambda g, p: np.asarray(g).reshape(p.shape), grads, params)
    for a, b in zip(jax.tree.leaves(single[1]), jax.tree.leaves(flat), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
    # Each device holds its stage's layers only (and their gradients) ...
    stacked = [g for path, g in trainer_lib.flat_with_paths(grads) if path.startswith("layers/")
               or "/layers/" in path]
    assert stacked
    for g in stacked:
        assert g.addressable_shards[0].data.size * mesh_shape["stage"] <= g.size
    # ... and a stage hands its microbatch to the next by a collective permute.
    assert re.search(r"= \S+ collective-permute(-start)?\(", compiled)


def test_the_bubble_is_the_idle_share_of_stage_iterations():
    assert pipeline_parallel.bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert pipeline_parallel.bubble_fraction(4, 16) == pytest.approx(3 / 19)
    assert pipeline_parallel.bubble_fraction(4, 4, repeats=4) == pytest.approx(3 / 19)  # circular
    assert pipeline_parallel.bubble_fraction(1, 8) == 0.0
    settings = pipeline_parallel.PipelineSettings("circular", 0, 2)
    assert settings.repeats(16, 4) == 2 and settings.num_microbatches(4) == 4
    assert pipeline_parallel.PipelineSettings("gpipe", 0, 2).repeats(16, 4) == 1


def _metrics(workdir) -> dict[int, dict]:
    lines = (pathlib.Path(workdir) / "metrics.jsonl").open()
    return {r["step"]: r for r in map(json.loads, lines) if "loss" in r}


def _decoder_run(steps=2, **overrides):
    config = config_lib.load_config_file("configs/pretrain/gpt2_tiny.py")
    settings = {"task_feature_lengths": {"targets": 32}, "batch_size": 16, "num_train_steps": steps,
                "logging.every_steps": 1, "evals.held_out.every_steps": 0,
                "checkpoint.every_steps": 2, "model.num_layers": 4, "model.d_model": 64,
                "model.d_ff": 128, "model.num_heads": 2, "model.numerics.scan_layers": True,
                **overrides}
    return set_keys(config, settings)


PIPELINED = {"mesh.data": 2, "mesh.stage": 2, "mesh.fsdp": 2,
             "partitioning.pipeline_schedule": "circular", "partitioning.pipeline_microbatches": 4,
             "partitioning.pipeline_layers_per_stage": 1}


@pytest.mark.slow
def test_a_pipelined_run_logs_the_data_parallel_losses_and_resumes_bit_for_bit(tmp_path):
    train.run(_decoder_run(4, **{"mesh.data": 8}), str(tmp_path / "data"), quiet=True)
    train.run(_decoder_run(4, **PIPELINED), str(tmp_path / "straight"), quiet=True)
    train.run(_decoder_run(2, **PIPELINED), str(tmp_path / "resumed"), quiet=True)
    train.run(_decoder_run(4, **PIPELINED), str(tmp_path / "resumed"), quiet=True)
    # The same workdir on another layout of the stack (GPipe keeps [layers, ...]) is
    # refused in one line before anything is restored.
    with pytest.raises(errors.ConfigError,
                       match=r"stack.layout: checkpoint '2 circular laps', config 'layers'"):
        train.run(_decoder_run(6, **dict(PIPELINED, **{"partitioning.pipeline_schedule": "gpipe"})),
                  str(tmp_path / "resumed"), quiet=True)
    plain, straight, resumed = (_metrics(tmp_path / name)
                                for name in ("data", "straight", "resumed"))
    assert sorted(resumed) == [1, 2, 3, 4]
    assert [resumed[s]["loss"] for s in range(1, 5)] == [straight[s]["loss"] for s in range(1, 5)]
    for step in range(1, 5):
        np.testing.assert_allclose(straight[step]["loss"], plain[step]["loss"], rtol=1e-5)
        np.testing.assert_allclose(straight[step]["grad_norm"], plain[step]["grad_norm"],
                                   rtol=1e-4)


REFUSED = [
    # (overrides on the decoder run, fragment of the one-line error)
    ({"mesh.data": 2, "mesh.stage": 4, "model.num_layers": 6},
     "model.num_layers=6 does not split over 4 stages"),
    ({"mesh.data": 4, "mesh.stage": 2, "partitioning.pipeline_schedule": "circular",
      "partitioning.pipeline_layers_per_stage": 4, "model.num_layers": 4},
     "does not split over 2 stages x pipeline_layers_per_stage=4"),
    ({"mesh.data": 1, "mesh.stage": 16}, "needs 16 devices but 8 are available"),
    ({"mesh.data": 2, "mesh.stage": 4, "model.numerics.scan_layers": False},
     "set --config.model.numerics.scan_layers=True"),
    ({"mesh.data": 2, "mesh.stage": 4, "model.dropout_rate": 0.1},
     "set --config.model.dropout_rate=0"),
    ({"mesh.data": 1, "mesh.stage": 4, "mesh.context": 2}, "set --config.mesh.context=1"),
    ({"mesh.data": 4, "mesh.stage": 2, "partitioning.pipeline_schedule": "circular",
      "partitioning.pipeline_microbatches": 1}, "use at least 2"),
    ({"mesh.data": 8, "mesh.stage": 1, "partitioning.pipeline_microbatches": 3}, None),
    ({"mesh.data": 2, "mesh.stage": 4, "partitioning.pipeline_microbatches": 3},
     "rows a step do not split into partitioning.pipeline_microbatches=3"),
]


@pytest.mark.parametrize("overrides,fragment", REFUSED)
def test_meshes_and_models_the_stages_cannot_split_are_refused(overrides, fragment):
    check_mesh_on_8(_decoder_run(**overrides), fragment)


def test_an_encoder_decoder_is_refused_with_the_axes_that_do_split_it():
    config = config_lib.load_config_file("configs/quickstart.py")
    config.mesh.stage = 2
    config.mesh.data = 4
    with pytest.raises(errors.ConfigError, match="is not built as a pipeline.*mesh.fsdp"):
        config_lib.check_devices(config_lib.spec_of(config), 8)


def test_a_plan_across_two_slices_reports_the_bubble_and_the_hand_overs_over_dcn():
    """Four stages, two a slice: the stages' hand-overs between slices are host transfers
    over the data-center network, counted as crossing ``dcn``; the bubble of 4 stages and
    4 microbatches is 3/7 of the stages' time, inside the roofline."""
    from test_plan import run_plan
    report = json.loads(run_plan(
        "--config=configs/pretrain/gpt2_tiny.py", "--topology=v5p:2x2x1", "--num_slices=2",
        "--json", "--config.mesh.dcn=2", "--config.mesh.stage=2", "--config.mesh.data=1",
        "--config.mesh.fsdp=2", "--config.model.numerics.scan_layers=True",
        "--config.partitioning.pipeline_over_dcn=True", "--config.batch_size=16",
        # A small vocabulary and short rows: the plan's structure is the same, its
        # compile half as long.
        "--config.model.vocab_size=256", "--config.task_feature_lengths.targets=32").stdout)
    assert report["pipeline"] == {"schedule": "gpipe", "stages": 4, "microbatches": 4,
                                  "repeats": 1, "over_dcn": True,
                                  "bubble": pytest.approx(3 / 7)}
    crossed = {row["axes"]: row for row in report["collectives_per_device"]}
    assert crossed["dcn"]["bytes"] > 0 and crossed["stage"]["bytes"] > 0
    assert report["fits"]


@pytest.mark.slow
@pytest.mark.optimized
def test_the_pages_pipeline_command_trains_as_printed(tmp_path):
    """docs/parallelism.md's pipeline command: gpt2_tiny over 4 stages (4 steps of 8 rows,
    a held-out eval at the end)."""
    import os
    import shlex
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[1]
    page = (root / "docs" / "parallelism.md").read_text()
    block = re.search(r"```\n(XLA_FLAGS=[^`]*?pipeline_run.*?)```", page, flags=re.S).group(1)
    words = shlex.split(block.replace("\\\n", " "))
    env = dict(os.environ, **dict(w.split("=", 1) for w in words[:1]))
    command = [sys.executable, *words[2:]]
    command = [w.replace("/tmp/pipeline_run", str(tmp_path / "run")) for w in command]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600,
                          cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(_metrics(tmp_path / "run")) == [1, 2, 4]
