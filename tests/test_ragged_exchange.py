"""The ragged all-to-all: XLA's collective on TPU and GPU, a padded all-to-all on CPU with
the same contract, checked on fake CPU devices against a loop over the runs."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from t5x_like.models import ragged_exchange
from t5x_like.system import traced_platform


def _exchange(devices, operand, output, *offsets_and_sizes):
    """``ragged_all_to_all`` over an axis of ``devices``: every argument stacked
    ``[devices, ...]``, one row a device."""
    mesh = jax.make_mesh((devices,), ("x",), devices=jax.devices()[:devices])
    spec = PartitionSpec("x")

    def body(*args):
        args = [a[0] for a in args]
        return ragged_exchange.ragged_all_to_all(*args, axis_name="x")[None]
    args = [jax.device_put(np.asarray(a), NamedSharding(mesh, spec))
            for a in (operand, output, *offsets_and_sizes)]
    return np.asarray(jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))(
        *args))


def test_the_cpu_form_gives_the_documented_example():
    """``jax.lax.ragged_all_to_all``'s docstring example, two devices."""
    result = _exchange(2, [[1, 2, 2], [3, 4, 0]], [[0, 0, 0, 0], [0, 0, 0, 0]],
                       [[0, 1], [0, 1]], [[1, 2], [1, 1]], [[0, 0], [1, 2]], [[1, 1], [2, 1]])
    np.testing.assert_array_equal(result, [[1, 3, 0, 0], [2, 2, 4, 0]])


def test_runs_of_any_length_land_where_their_senders_say():
    """Four devices, each with random runs for every peer (empty ones included) packed
    after a gap, landing at offsets that leave gaps; rows nothing lands on keep the
    output's value."""
    rng = np.random.default_rng(0)
    devices, rows, width = 4, 12, 3
    sizes = rng.integers(0, 4, (devices, devices))  # [source, destination]
    sizes[1, 2] = 0
    gap = 1
    input_offsets = gap + np.cumsum(sizes, axis=1) - sizes
    landing = 2 * (np.cumsum(sizes, axis=0) - sizes)  # a gap after every run
    operand = rng.normal(size=(devices, rows, width)).astype(np.float32)
    output = np.full((devices, 3 * rows, width), -7.0, np.float32)
    expected = output.copy()
    for source in range(devices):
        for destination in range(devices):
            run = operand[source, input_offsets[source, destination]:][:sizes[source, destination]]
            at = landing[source, destination]
            expected[destination, at:at + len(run)] = run
    result = _exchange(devices, operand, output, input_offsets.astype(np.int32),
                       sizes.astype(np.int32), landing.astype(np.int32),
                       sizes.T.astype(np.int32))
    np.testing.assert_array_equal(result, expected)


def test_tpu_and_gpu_programs_use_xlas_collective_and_cpu_programs_do_not():
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])

    def lowered(platform):
        def body(operand):
            sizes = jnp.ones(2, jnp.int32)
            return ragged_exchange.ragged_all_to_all(
                operand, jnp.zeros_like(operand), jnp.arange(2, dtype=jnp.int32), sizes,
                jax.lax.axis_index("x") + jnp.zeros(2, jnp.int32), sizes, "x")
        function = jax.shard_map(body, mesh=mesh, in_specs=PartitionSpec("x"),
                                 out_specs=PartitionSpec("x"))
        with traced_platform.target_platform(platform):
            operand = jax.ShapeDtypeStruct((4, 8), jnp.float32,
                                           sharding=NamedSharding(mesh, PartitionSpec("x")))
            return jax.jit(function).lower(operand).as_text()

    for platform in ("tpu", "gpu"):
        assert "ragged_all_to_all" in lowered(platform)
    assert "ragged_all_to_all" not in lowered("cpu") and "all_to_all" in lowered("cpu")
