"""Which JAX backends a run starts, decided before JAX is imported.

With the ``tpu`` (or ``dev``) extra installed, JAX tries libtpu on every machine; on
one without TPUs libtpu prints ``E0000 ... INVALID_ARGUMENT: unexpected worker
hostname`` lines at start-up. They are noise, but they read like our errors. So
unless the user chose (``JAX_PLATFORMS`` set, even to the empty string, which means
"every backend") or the machine has TPU chips, runs ask JAX for the GPU backends
whose plugin is installed and whose device files exist, then the CPU. The planner
still compiles for TPU topologies: ``get_topology_desc(platform="tpu")`` loads
libtpu when asked, whatever ``JAX_PLATFORMS`` says.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pkgutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping

# Set beside JAX_PLATFORMS when this module chose it: the choice is about this machine,
# so commands that start work on other machines (sbatch copies the environment into the
# job) drop it again (``environment_for_other_machines``).
CHOSEN_MARKER = "T5X_LIKE_CHOSE_JAX_PLATFORMS"
# Device files of TPU chips: /dev/accel* (v2-v5e), /dev/vfio/N (v5p, v6e and later).
TPU_DEVICE_PATTERNS = ("/dev/accel*", "/dev/vfio/[0-9]*")
# A GPU backend, the substring of its jax_plugins module, and the device file it needs.
GPU_BACKENDS = (("cuda", "cuda", "/dev/nvidia*"), ("rocm", "rocm", "/dev/kfd"))


def installed_jax_plugins() -> list[str]:
    """Module names under the ``jax_plugins`` namespace (``xla_cuda12``, ...), unimported."""
    try:
        spec = importlib.util.find_spec("jax_plugins")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [module.name for module in pkgutil.iter_modules(spec.submodule_search_locations)]


def platforms_without_tpu(environ: Mapping[str, str],
                          plugins: Iterable[str],
                          device_files: Callable[[str], list[str]] = glob.glob) -> str | None:
    """The ``JAX_PLATFORMS`` value to use, or None to leave JAX to choose (the user chose,
    or TPU chips are present)."""
    if "JAX_PLATFORMS" in environ:
        return None
    if any(device_files(pattern) for pattern in TPU_DEVICE_PATTERNS):
        return None
    plugins = list(plugins)
    chosen = [backend for backend, marker, files in GPU_BACKENDS
              if any(marker in name for name in plugins) and device_files(files)]
    return ",".join(chosen + ["cpu"])


def keep_libtpu_off_machines_without_tpus() -> None:
    """Sets ``JAX_PLATFORMS`` for this process and its children when no TPU is attached.

    Called when ``t5x_like`` is imported. If JAX was imported first but has not started a
    backend yet, its config is updated instead (JAX read the variable at import).
    """
    value = platforms_without_tpu(os.environ, installed_jax_plugins())
    if value is None:
        return
    os.environ["JAX_PLATFORMS"] = value
    os.environ[CHOSEN_MARKER] = value
    jax = sys.modules.get("jax")
    if jax is None:
        return
    # Read from sys.modules, not imported: this module stays importable without JAX
    # (``launch/`` runs on the standard library alone), and JAX imports its bridge itself.
    xla_bridge = sys.modules.get("jax._src.xla_bridge")
    try:
        if not xla_bridge.backends_are_initialized() and not jax.config.jax_platforms:
            jax.config.update("jax_platforms", value)
    except AttributeError:  # private API moved: the variable still helps children
        pass


# XLA:TPU's collective scheduling, as MaxText's published runs set it (its
# ``benchmarks/xla_flags_library.py``: CF_FOR_ALL_GATHER and DATA_PARALLEL_OVERLAP, in every
# row of its performance tables): FSDP's weight all-gathers become asynchronous fusions
# continued inside the matmuls they feed, and data-parallel all-reduces overlap the
# backward pass. Without them libtpu runs those collectives synchronously, and the step
# waits for every gather (``planner.step_time`` reads which).
TPU_COMPILER_FLAGS = (
    "--xla_tpu_enable_async_collective_fusion=true",
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
    "--xla_tpu_overlap_compute_collective_tc=true",
    "--xla_enable_async_all_gather=true",
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
    "--xla_tpu_data_parallel_opt_different_sized_ops=true",
)


def use_tpu_compiler_flags(environ=os.environ) -> None:
    """Adds ``TPU_COMPILER_FLAGS`` to ``LIBTPU_INIT_ARGS`` (read when libtpu loads: a TPU
    run's or a TPU plan's compiler), each one the user has not set there already."""
    given = environ.get("LIBTPU_INIT_ARGS", "")
    named = {flag.split("=")[0] for flag in given.split()}
    added = [flag for flag in TPU_COMPILER_FLAGS if flag.split("=")[0] not in named]
    if added:
        environ["LIBTPU_INIT_ARGS"] = " ".join([given, *added]).strip()


def environment_for_other_machines(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the ``JAX_PLATFORMS`` this module chose for this machine (a
    login node without GPUs must not send ``cpu`` to the GPU nodes); a value the user
    set is kept."""
    env = dict(environ)
    chosen = env.pop(CHOSEN_MARKER, None)
    if chosen is not None and env.get("JAX_PLATFORMS") == chosen:
        del env["JAX_PLATFORMS"]
    return env


# libtpu's start-up notice when it compiles for a topology on a machine without TPU chips
# (``plan --topology=v5p:...``): it reads like an error, and there is no chip to name.
LIBTPU_NO_CHIP_NOTICE = "could not determine TPU accelerator type"


# The filter ``without_stderr_lines`` runs in a child process: lines without any of the
# fragments (its arguments) go to its stderr, the caller's own.
_STDERR_FILTER = """
import sys
fragments = [f.encode() for f in sys.argv[1:]]
for line in sys.stdin.buffer:
    if not any(f in line for f in fragments):
        sys.stderr.buffer.write(line)
        sys.stderr.buffer.flush()
"""


@contextlib.contextmanager
def without_stderr_lines(*fragments: str):
    """Runs a block with file descriptor 2 piped through a filter that drops every line
    containing one of ``fragments``: C++ libraries (libtpu) write to the descriptor
    directly, past Python's ``sys.stderr``. The filter is a child process, so a library
    that ends this process from C (libtpu exits 1 on a flag it does not know in
    ``LIBTPU_INIT_ARGS``) still has its last lines reach the user."""
    sys.stderr.flush()
    child = subprocess.Popen([sys.executable, "-c", _STDERR_FILTER, *fragments],
                             stdin=subprocess.PIPE)
    saved = os.dup(2)
    os.dup2(child.stdin.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        child.stdin.close()
        child.wait()
