"""Test setup: 8 fake CPU devices, set before JAX is imported anywhere."""

import contextlib
import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compiled programs shared by every test of a run: many tests (and the commands they run
# as subprocesses, which inherit this) compile the same tiny train steps. One cache per
# pytest run, made by the controller before its workers start, removed when it ends, so
# no run reads another's executables.
if "T5XL_TEST_JAX_CACHE" not in os.environ:
    os.environ["T5XL_TEST_JAX_CACHE"] = tempfile.mkdtemp(prefix="t5xl_jax_cache_")
    os.environ["T5XL_TEST_JAX_CACHE_OWNER"] = str(os.getpid())
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ["T5XL_TEST_JAX_CACHE"])
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

import ci_guard
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import t5x_like.builtin_tasks  # noqa: F401  (the built-in tasks, as every command registers them)
from t5x_like import config_lib

# Modules that mostly compile: their tests build many small programs and run each a few
# times, so they compile with XLA's optimisations mostly off (``jax_disable_most_
# optimizations``: LLVM at -O0 without its expensive passes; XLA's HLO passes, and so the
# numerics, unchanged), in this process and in the commands they start. The rest mostly
# execute (many steps, kill -9 rounds, attention kernels, harness scoring) and keep the
# optimised code. Chosen from two whole runs, every module at -O0 against none, and
# checked alone (docs/testing.md): these modules' time went from 2,623 s to 1,971 s. The
# multi-process modules joined later (their launches of a few steps are mostly compiles:
# 597 s to 473 s for their seven slow tests, measured back to back under the same load),
# then training and the engine's runs (269 s to 189 s), distillation (106 s to 76 s) and
# the optimizers (110 s to 75 s), each module alone, both ways back to back. Evaluation,
# decoding, generation, the families' and packed runs, plug-ins, RAG, the summary, the
# spec's fingerprints and the preference and parallelism removals came last
# (1,048 s to 769 s over a whole run's durations against those modules alone at -O0, each
# 17-41% less), with FLOP counts, local checkpoints, heads, collectives, chat SFT and
# retrieval (185 s to 115 s, each 27-54%). The engine's removals and the faults module
# (165 s to 150 s alone) run the checks of training and the engine's runs again, mostly
# on the same programs: at -O0 too, those come from the run's compilation cache.
FAST_COMPILE_MODULES = frozenset({
    "test_benchmarks_smoke.py", "test_peft.py", "test_moe.py", "test_context_parallel.py",
    "test_preference_training.py", "test_model_features.py", "test_rl.py",
    "test_optim_and_loss.py", "test_convert_open_decoders.py", "test_partitioning.py",
    "test_held_out_eval.py", "test_removal_low_precision.py", "test_electra.py",
    "test_retrieval_runs.py", "test_convert_longformer.py", "test_data_errors.py",
    "test_bilm.py", "test_pipeline.py", "test_generation_engine.py",
    "test_removal_generation.py", "test_quantization.py", "test_multihost.py",
    "test_local_checkpoints_multihost.py", "test_elastic_resume.py", "test_multihost_preemption.py",
    "test_cloud_storage.py", "test_training.py", "test_engine_runs.py", "test_distill.py",
    "test_optimizers.py", "test_evaluation.py", "test_decoding.py", "test_plugins.py",
    "test_train_families.py", "test_removal_preference.py", "test_packed_model_inputs.py",
    "test_removal_parallelism.py", "test_decoder_generation.py", "test_rag.py",
    "test_summary.py", "test_spec_compat.py", "test_flops.py", "test_local_checkpoints.py",
    "test_heads.py", "test_hlo_collectives.py", "test_chat_sft.py", "test_retrieval.py",
    "test_removal_engine.py", "test_faults.py",
})


@contextlib.contextmanager
def _xla_optimisations(on: bool):
    """XLA's optimisations on or off in this process (the flag is read at every compile)
    and, through ``JAX_DISABLE_MOST_OPTIMIZATIONS``, in the commands it starts; the
    setting before is restored on exit."""
    import jax
    before = jax.config.read("jax_disable_most_optimizations")
    with pytest.MonkeyPatch.context() as patch:
        if on:
            patch.delenv("JAX_DISABLE_MOST_OPTIMIZATIONS", raising=False)
        else:
            patch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "true")
        jax.config.update("jax_disable_most_optimizations", not on)
        try:
            yield
        finally:
            jax.config.update("jax_disable_most_optimizations", before)


@pytest.fixture(autouse=True, scope="module")
def _compile_effort(request):
    """XLA's optimisations off for ``FAST_COMPILE_MODULES``, on for the others.
    Module-scoped and autouse, so it is set before a module's own module-scoped fixtures
    compile; a module runs in one worker (``--dist loadscope``)."""
    with _xla_optimisations(on=request.node.path.name not in FAST_COMPILE_MODULES):
        yield


@pytest.fixture(autouse=True)
def _optimized_test(request):
    """A test marked ``optimized`` in a ``FAST_COMPILE_MODULES`` module compiles with XLA's
    optimisations on: it mostly executes (a command trained as printed), where the module's
    other tests mostly compile."""
    if (request.node.get_closest_marker("optimized") is None
            or request.node.path.name not in FAST_COMPILE_MODULES):
        yield
        return
    with _xla_optimisations(on=True):
        yield


def set_keys(config, values: dict):
    """``{"a.b.c": value}`` written into the config's nested sections, values as given
    (not parsed from text, as ``--config.a.b.c=`` overrides are)."""
    for key, value in values.items():
        node = config
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return config


def check_mesh_on_8(config, fragment: str | None) -> None:
    """A config's spec and 8-device mesh checks: refused with a ``ConfigError`` naming
    ``fragment``, or (``fragment`` None) accepted."""
    import re

    from t5x_like import errors
    if fragment is None:
        config_lib.check_devices(config_lib.spec_of(config), 8)
        return
    with pytest.raises(errors.ConfigError, match=re.escape(fragment)):
        config_lib.validate(config)
        config_lib.check_devices(config_lib.spec_of(config), 8)


def drawn_params(model, *inputs, seed=0):
    """Parameters in the tree, shapes and dtypes ``model.init`` gives them for ``inputs``
    (traced, not compiled), drawn in numpy: normal, standard deviation 0.2."""
    shapes = nn.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), *inputs))["params"])
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, 0.2, s.shape), s.dtype), shapes)


def tiny_config(**overrides):
    """A model small enough to compile and train in seconds on fake devices."""
    config = config_lib.default_config()
    config.task_feature_lengths = {"inputs": 32, "targets": 8}
    config.batch_size = 16
    config.num_train_steps = 30
    config.log_every_steps = 5
    config.eval_every_steps = 15
    config.checkpoint_every_steps = 15
    config.eval_batches = 2
    model = config.model
    model.d_model = 32
    model.num_heads = 2
    model.head_dim = 16
    model.d_ff = 64
    model.num_encoder_layers = 1
    model.num_decoder_layers = 1
    config.optimizer.learning_rate = 3e-2
    config.optimizer.warmup_steps = 5
    set_keys(config, overrides)
    config_lib.validate(config)
    return config


@pytest.fixture
def tiny():
    return tiny_config


def structure_loss(family, model, z_loss: float = 1e-4, label_smoothing: float = 0.0):
    """``family``'s training loss on ``model``, as train and eval compute it: its structure
    calls the model, its pure objective scores the outputs. ``(params, batch, rng=None,
    **normalizers) -> (objective, metrics)``."""
    import ml_collections

    from t5x_like import structures
    loss_fn = structures.structure_class(family)(model).loss_fn(
        ml_collections.ConfigDict({"z_loss": z_loss, "label_smoothing": label_smoothing}))
    return lambda params, batch, rng=None, **kw: loss_fn(model, params, batch, rng, **kw)


# A skipped or xfail-marked test passes quietly: in CI (CI=true, as .ci/run sets) it fails
# the run instead, unless tests/ci_guard.py lists it with the reason it cannot run there.
def pytest_configure(config):
    ci_guard.register(config)


def pytest_unconfigure(config):
    if os.environ.get("T5XL_TEST_JAX_CACHE_OWNER") == str(os.getpid()):
        shutil.rmtree(os.environ["T5XL_TEST_JAX_CACHE"], ignore_errors=True)
