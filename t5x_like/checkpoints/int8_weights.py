"""Decoding and scoring with int8 weights (``quantization.weights='int8'``): ``eval``,
``infer`` and the lm-evaluation-harness model read a float checkpoint, quantize its
attention and MLP kernels to int8 with one scale per output channel (Qwix's
post-training quantization, ``models.quantization.with_int8_weights``), and run the
model whose matmuls read them. A decode step reads each weight once, so its HBM bytes
for those kernels halve against bfloat16 (``plan --decode`` counts them).

The int8 values and their scales are saved beside the checkpoint's steps
(``CHECKPOINT/int8_weights/STEP.npz``) and read back by the next evaluation of the same
step instead of quantizing again (single-process runs; a multi-process run quantizes in
memory on its mesh).
"""

from __future__ import annotations

import copy
import io

import flax.linen as nn
import jax
import numpy as np
import qwix
from jax.sharding import NamedSharding, PartitionSpec

from t5x_like.engine import trainer as trainer_lib
from t5x_like.errors import UserError
from t5x_like.models import example_inputs, quantization
from t5x_like.system import storage

FOLDER = "int8_weights"


def weights_for(config, structure, trainer):
    """The weights a runner of ``config``'s checkpoints reads: ``Int8Weights`` with
    ``quantization.weights='int8'``, else the float ones as they are."""
    if config.quantization.weights == "int8":
        return Int8Weights(structure, trainer)
    return FloatWeights(structure, trainer)


class FloatWeights:
    """The checkpoint's own weights: ``structure``, ``shardings`` and ``restore`` as
    ``Int8Weights`` offers them."""

    def __init__(self, structure, trainer):
        self.structure, self.shardings = structure, trainer.state_shardings.params
        self.abstract_params = trainer.abstract_state.params

    def quantize(self, params):
        return params

    def restore(self, source, step: int, trainer):
        return source.restore_params(step, trainer)


class Int8Weights:
    """A structure whose model reads int8 kernels, and the params it takes: ``structure``
    and ``shardings`` replace the float ones where a runner is built; ``quantize`` (or
    ``restore``) turns each restored float params tree into the int8 one."""

    def __init__(self, structure, trainer):
        numerics = getattr(getattr(structure.model, "config", None), "numerics", None)
        if getattr(numerics, "scan_layers", False):
            raise UserError("quantization.weights='int8' quantizes each layer's kernels, and "
                            "this model scans its layers (one stacked kernel a projection, "
                            "which Qwix's post-training quantization does not split); evaluate "
                            "it with float weights: --config.quantization.weights=.")
        lengths = trainer.model_feature_lengths
        model = quantization.with_int8_weights(structure.model, lengths)
        inputs = example_inputs(structure.model, lengths)
        with trainer_lib.traced_for(trainer.mesh, trainer.pipeline_settings):
            self.abstract = jax.eval_shape(
                lambda: model.init(jax.random.key(0), *inputs))["params"]
        self.structure = copy.copy(structure)
        self.structure.model = model
        self.shardings = _shardings(nn.unbox(self.abstract), trainer.state_shardings.params)
        #: shapes, dtypes and shardings of the int8 params (what ``plan --decode`` compiles)
        self.abstract_params = jax.tree.map(
            lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                                        sharding=sharding),
            nn.unbox(self.abstract), self.shardings)
        self._quantize = jax.jit(lambda params: qwix.quantize_params(params, self.abstract),
                                 out_shardings=self.shardings)

    def quantize(self, params):
        """The int8 params of a float params tree on the trainer's mesh."""
        return self._quantize(params)

    def restore(self, source, step: int, trainer):
        """``step``'s int8 params: read from beside the checkpoint when saved there, else
        quantized from its float params and saved (single-process runs)."""
        file = storage.path(source.path) / FOLDER / f"{step}.npz"
        single = jax.process_count() == 1
        if single and file.exists():
            return self._read(file)
        params = self.quantize(source.restore_params(step, trainer))
        if single:
            try:
                self._write(file, params)
            except OSError:  # a read-only checkpoint (someone else's folder): keep it in memory
                pass
        return params

    def _write(self, file, params) -> None:
        flat = {jax.tree_util.keystr(path): np.asarray(leaf)
                for path, leaf in jax.tree_util.tree_leaves_with_path(jax.device_get(params))}
        buffer = io.BytesIO()
        np.savez(buffer, **flat)
        file.parent.mkdir(parents=True, exist_ok=True)
        partial = file.parent / (file.name + ".partial")
        partial.write_bytes(buffer.getvalue())
        partial.rename(file)

    def _read(self, file):
        with np.load(io.BytesIO(file.read_bytes())) as saved:
            stored = dict(saved)
        leaves, treedef = jax.tree_util.tree_flatten_with_path(nn.unbox(self.abstract))
        values = []
        for path, leaf in leaves:
            key = jax.tree_util.keystr(path)
            value = stored.get(key)
            if value is None or value.shape != leaf.shape or value.dtype != leaf.dtype:
                raise UserError(f"{file} does not hold this model's int8 weights ({key}); "
                                "delete it to quantize the checkpoint again.")
            values.append(value)
        params = jax.tree_util.tree_unflatten(treedef, values)
        return jax.device_put(params, self.shardings)


def _shardings(abstract, float_shardings):
    """Each int8 leaf's sharding: its kernel's; a scale's, with the dims it keeps at 1
    (the contracted ones) unsharded."""
    def place(path, leaf):
        kernel = _kernel_sharding(path, float_shardings)
        spec = tuple(kernel.spec) + (None,) * (len(leaf.shape) - len(kernel.spec))
        spec = tuple(axis if size > 1 else None for axis, size in zip(spec, leaf.shape,
                                                                       strict=False))
        return NamedSharding(kernel.mesh, PartitionSpec(*spec))
    return jax.tree_util.tree_map_with_path(place, abstract)


def _kernel_sharding(path, float_shardings):
    """The float params' sharding at ``path``, walking down past Qwix's ``array``,
    ``qvalue`` and ``scale`` fields."""
    node = float_shardings
    for key in path:
        name = getattr(key, "key", getattr(key, "name", None))
        if isinstance(node, dict) and name in node:
            node = node[name]
        elif isinstance(node, NamedSharding):
            break
    if not isinstance(node, NamedSharding):
        raise ValueError(f"No float sharding for {jax.tree_util.keystr(path)}")
    return node
