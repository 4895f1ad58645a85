"""No libtpu start-up noise on machines without TPUs, and JAX still finds real chips."""

import os
import pathlib
import subprocess
import sys

import pytest

from t5x_like.system import platforms

REPO = pathlib.Path(__file__).resolve().parents[1]


def files(present: dict[str, list[str]]):
    return lambda pattern: present.get(pattern, [])


def test_cpu_only_machine_runs_on_the_cpu_backend():
    assert platforms.platforms_without_tpu({}, [], files({})) == "cpu"


def test_the_users_choice_is_kept_even_when_empty():
    assert platforms.platforms_without_tpu({"JAX_PLATFORMS": ""}, [], files({})) is None
    assert platforms.platforms_without_tpu({"JAX_PLATFORMS": "tpu"}, [], files({})) is None


def test_tpu_chips_leave_jax_to_choose():
    assert platforms.platforms_without_tpu({}, [], files({"/dev/accel*": ["/dev/accel0"]})) is None
    assert platforms.platforms_without_tpu({}, [], files({"/dev/vfio/[0-9]*": ["/dev/vfio/0"]})) \
        is None


def test_gpu_backend_needs_both_its_plugin_and_its_devices():
    nvidia = files({"/dev/nvidia*": ["/dev/nvidia0", "/dev/nvidiactl"]})
    assert platforms.platforms_without_tpu({}, ["xla_cuda12"], nvidia) == "cuda,cpu"
    assert platforms.platforms_without_tpu({}, ["xla_cuda12"], files({})) == "cpu"
    assert platforms.platforms_without_tpu({}, [], nvidia) == "cpu"


def test_only_our_own_choice_is_dropped_for_other_machines():
    ours = {"JAX_PLATFORMS": "cpu", platforms.CHOSEN_MARKER: "cpu", "HOME": "/h"}
    assert platforms.environment_for_other_machines(ours) == {"HOME": "/h"}
    users = {"JAX_PLATFORMS": "cuda", platforms.CHOSEN_MARKER: "cpu"}  # changed since
    assert platforms.environment_for_other_machines(users) == {"JAX_PLATFORMS": "cuda"}
    assert platforms.environment_for_other_machines({"JAX_PLATFORMS": "tpu"}) == {
        "JAX_PLATFORMS": "tpu"}


NOISE = ("E0000", "libtpu", "TPU_WORKER_HOSTNAMES", "InitGoogle")


def environment_without_a_platform_choice() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}


def test_starting_jax_through_the_package_prints_no_libtpu_lines():
    result = subprocess.run(
        [sys.executable, "-c", "import t5x_like, jax; print(jax.devices()[0].platform)"],
        cwd=REPO, env=environment_without_a_platform_choice(), capture_output=True, text=True,
        timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "cpu"
    assert not any(noise in result.stderr for noise in NOISE), result.stderr


@pytest.mark.slow
def test_cpu_training_run_prints_no_libtpu_lines(tmp_path):
    env = environment_without_a_platform_choice()
    result = subprocess.run(
        [sys.executable, "-m", "t5x_like.train", "--config=configs/quickstart.py",
         f"--workdir={tmp_path}", "--config.num_train_steps=2", "--config.batch_size=2",
         "--config.model.d_model=16", "--config.model.d_ff=32", "--config.model.num_heads=2",
         "--config.model.head_dim=8", "--config.model.num_encoder_layers=1",
         "--config.model.num_decoder_layers=1", "--config.task_feature_lengths.inputs=16",
         "--config.task_feature_lengths.targets=8", "--config.eval_batches=1",
         "--quiet"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert '"step": 2' in (tmp_path / "metrics.jsonl").read_text()
    assert not any(noise in output for noise in NOISE), output


def test_tpu_compiler_flags_are_added_once_and_never_over_the_users():
    """MaxText's collective flags join ``LIBTPU_INIT_ARGS``; a flag the user set keeps the
    user's value, and adding twice adds nothing."""
    environ = {"LIBTPU_INIT_ARGS": "--xla_tpu_enable_async_collective_fusion=false --other=1"}
    platforms.use_tpu_compiler_flags(environ)
    flags = environ["LIBTPU_INIT_ARGS"].split()
    assert flags[:2] == ["--xla_tpu_enable_async_collective_fusion=false", "--other=1"]
    assert set(flags[2:]) == set(platforms.TPU_COMPILER_FLAGS[1:])
    platforms.use_tpu_compiler_flags(environ)
    assert environ["LIBTPU_INIT_ARGS"].split() == flags
    fresh = {}
    platforms.use_tpu_compiler_flags(fresh)
    assert fresh["LIBTPU_INIT_ARGS"].split() == list(platforms.TPU_COMPILER_FLAGS)


@pytest.mark.parametrize("ends", ["returns", "exits from C"])
def test_filtered_stderr_keeps_the_other_lines_even_when_the_process_ends_inside(ends):
    """``without_stderr_lines`` drops libtpu's no-chip notice and keeps the rest, in order,
    also when a library ends the process inside the block (libtpu exits 1 on an unknown
    ``LIBTPU_INIT_ARGS`` flag: its line used to vanish with the caught output)."""
    script = f"""
import os, sys
from t5x_like.system import platforms
with platforms.without_stderr_lines({platforms.LIBTPU_NO_CHIP_NOTICE!r}):
    os.write(2, b"kept: unknown flag\\n")
    os.write(2, b"dropped: {platforms.LIBTPU_NO_CHIP_NOTICE}\\n")
    if {ends == "exits from C"!r}:
        os._exit(1)
sys.stderr.write("after the block\\n")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    expected = ["kept: unknown flag"] + (["after the block"] if ends == "returns" else [])
    assert done.stderr.splitlines() == expected, done.stderr
    assert done.returncode == (0 if ends == "returns" else 1)
