"""A ragged all-to-all inside ``shard_map``: each device sends each peer a run of rows
of its own length, on every platform.

``jax.lax.ragged_all_to_all`` is XLA's collective for it (TPU and GPU); XLA:CPU does not
implement the opcode. On CPU ``ragged_all_to_all`` gives the same result with a dense
``all_to_all`` of blocks padded to the operand's length and a scatter at the
receivers' offsets: the same contract (``jax.lax.ragged_all_to_all``'s docstring, one
slice per peer), so the code above it, and its tests on fake CPU devices, are the
code a TPU pod runs. The padding makes the CPU form move ``peers`` times the operand;
it is the reference path, as attention's is on CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from t5x_like.system import traced_platform

#: the platforms whose XLA compiles ``ragged-all-to-all``
NATIVE_PLATFORMS = ("tpu", "gpu")


def exclusive_cumsum(sizes: jax.Array, axis: int = 0) -> jax.Array:
    """Offsets of runs of ``sizes`` laid end to end along ``axis``."""
    return jnp.cumsum(sizes, axis=axis) - sizes


def ragged_all_to_all(operand: jax.Array, output: jax.Array, input_offsets: jax.Array,
                      send_sizes: jax.Array, output_offsets: jax.Array, recv_sizes: jax.Array,
                      axis_name: str) -> jax.Array:
    """``jax.lax.ragged_all_to_all`` with one slice per device of ``axis_name``:
    ``operand[input_offsets[j]:][:send_sizes[j]]`` goes to device ``j`` and lands in its
    ``output`` at ``output_offsets[j]``; ``recv_sizes[i]`` rows come from device ``i``.
    Rows of ``output`` nothing lands on keep their value."""
    if traced_platform.current_platform() in NATIVE_PLATFORMS:
        return jax.lax.ragged_all_to_all(operand, output, input_offsets, send_sizes,
                                         output_offsets, recv_sizes, axis_name=axis_name)
    return _padded_all_to_all(operand, output, input_offsets, send_sizes, output_offsets,
                              recv_sizes, axis_name)


def _padded_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes,
                       axis_name):
    # A run is no longer than the operand, nor than the receiver's output (every
    # device's output has this device's shape).
    rows = min(operand.shape[0], output.shape[0])
    within = jnp.arange(rows)
    source = jnp.clip(input_offsets[:, None] + within, 0, operand.shape[0] - 1)
    blocks = jnp.where((within < send_sizes[:, None]).reshape(*source.shape,
                                                               *(1,) * (operand.ndim - 1)),
                       operand[source], 0)
    received = jax.lax.all_to_all(blocks, axis_name, 0, 0, tiled=True)  # block i: from i
    landing = jax.lax.all_to_all(output_offsets, axis_name, 0, 0, tiled=True)
    target = jnp.where(within < recv_sizes[:, None], landing[:, None] + within,
                       output.shape[0])  # past the end: dropped
    return output.at[target.reshape(-1)].set(
        received.reshape(-1, *operand.shape[1:]).astype(output.dtype), mode="drop")
