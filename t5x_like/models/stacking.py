"""A stack of identical blocks: a Python loop or ``nn.scan``, with optional remat.

A loop names the blocks ``layers_0 .. layers_{n-1}`` (the layout checkpoints
converted from Hugging Face use). ``scan`` compiles one block and stacks the
parameters along a leading ``layers`` axis under one name, ``layers``: compile
time stops growing with depth, which is what makes XL/XXL models practical.
``stack_layer_params`` / ``unstack_layer_params`` move parameters between the two.

Remat (``jax.checkpoint``) trades compute for activation memory; the policy says
which intermediates the backward pass may keep instead of recomputing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from t5x_like.models import pipeline_parallel
from t5x_like.models.layers import gradient_boundary
from t5x_like.models.moe import COLLECTION as ROUTER_COLLECTION

# The name a stacked block's input carries under ``offload``.
BLOCK_INPUT = "block_input"

REMAT_POLICIES = {
    "none": None,  # no remat: keep every activation
    "full": jax.checkpoint_policies.nothing_saveable,  # recompute the whole block
    "dots": jax.checkpoint_policies.checkpoint_dots,  # keep matmul outputs
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # MaxText's default
    # Recompute the whole block, its input kept in host memory instead of HBM until the
    # backward pass needs it (MaxText's ``decoder_layer_input`` offload): what a deep
    # stack saves leaves HBM, at the cost of a copy each way over the host link.
    "offload": jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=[BLOCK_INPUT],
        offload_src="device", offload_dst="pinned_host"),
}


def check_remat_policy(policy: str) -> None:
    if policy not in REMAT_POLICIES:
        raise ValueError(f"Unknown remat_policy {policy!r}; choose from {sorted(REMAT_POLICIES)}.")


def run_stack(block_cls: type[nn.Module], config: Any, num_layers: int, x, *args,
              scan: bool = False, remat_policy: str = "none", static_argnums: tuple[int, ...] = (),
              shared: bool = False, layer_attributes=None, pipelined: bool = True):
    """Applies ``num_layers`` blocks ``block_cls(config)`` to ``x``; ``args`` go to every block.

    Must be called inside a parent's ``nn.compact`` method (the blocks become the
    parent's children). ``static_argnums`` are the positions in ``args`` of Python
    values (flags such as ``deterministic``), which remat must not trace.
    ``shared`` applies one block ``num_layers`` times (ALBERT's cross-layer sharing).
    Blocks take ``scanned`` and return ``(x, None)`` when it is set.
    ``layer_attributes(i)``: extra constructor attributes of block ``i`` (Gemma's
    alternating layer types); a loop only, since a scan repeats one block.
    A scan traced over a pipeline ``stage`` axis runs as a pipeline (``models/pipeline_parallel.py``)
    unless ``pipelined`` is False (decoding steps); its parameters are the same either way.
    """
    check_remat_policy(remat_policy)
    if remat_policy == "offload":
        block_cls = _input_named(block_cls)
    block = block_cls
    if remat_policy != "none":
        # nn.remat counts ``self`` and ``x`` before ``args``.
        block = nn.remat(block_cls, policy=REMAT_POLICIES[remat_policy], prevent_cse=not scan,
                         static_argnums=tuple(2 + i for i in static_argnums))
    if shared:
        layer = block(config, name="shared_layer")
        for _ in range(num_layers):
            x = layer(gradient_boundary(x), *args)
        return x
    if not scan:
        for i in range(num_layers):
            extra = layer_attributes(i) if layer_attributes is not None else {}
            x = block(config, name=f"layers_{i}", **extra)(gradient_boundary(x), *args)
        return x
    if layer_attributes is not None:
        raise ValueError("A scanned stack repeats one block; per-layer attributes need a loop.")
    repeats = pipeline_parallel.stored_repeats(num_layers)
    scanned = _scan(block, len(args), num_layers, "layers")
    if repeats > 1:  # a circular pipeline's layout: [repeats, stages x layers a visit, ...]
        # stored reshaped, created and applied as the plain stack (the same initial values)
        scanned = nn.map_variables(
            scanned, "params", init=True, mutable=True,
            trans_in_fn=lambda tree: _reshape_layers(tree, lambda shape: (-1,) + shape[2:]),
            trans_out_fn=lambda tree: _reshape_layers(tree, lambda shape: (repeats, -1) + shape[1:],
                                                      "circular_repeats"))
    stack = scanned(config, scanned=True, name="layers")
    settings, stages = pipeline_parallel.current_settings(), pipeline_parallel.stage_count()
    microbatches = settings.num_microbatches(stages)
    # Rows the microbatches do not divide (an evaluator's own batch) take the plain scan,
    # on the same parameters: correct, not lean.
    if (not (pipelined and stages > 1 and x.shape[0] % microbatches == 0)
            or stack.is_initializing()):
        x, _ = stack(x, *args)
        return x
    policy = REMAT_POLICIES[remat_policy]

    def layer(params, h, layer_args):
        def apply(params, h):
            return block_cls(config).apply({"params": params}, h, *layer_args)
        if remat_policy != "none":
            apply = jax.checkpoint(apply, policy=policy)
        return apply(params, h)

    return pipeline_parallel.run(layer, nn.meta.unbox(stack.variables["params"]), x, args, stages=stages,
                        microbatches=microbatches, repeats=repeats,
                        remat=remat_policy != "none")


def _input_named(block_cls: type[nn.Module]) -> type[nn.Module]:
    """``block_cls`` whose input is named ``BLOCK_INPUT`` (``jax.ad_checkpoint.
    checkpoint_name``), what the ``offload`` policy moves to host memory."""
    class NamedInput(block_cls):
        def __call__(self, x, *args, **kwargs):
            return super().__call__(checkpoint_name(x, BLOCK_INPUT), *args, **kwargs)
    NamedInput.__name__ = NamedInput.__qualname__ = block_cls.__name__
    return NamedInput


def _reshape_layers(tree, new_shape, new_axis: str | None = None):
    """Every leaf of a stack's parameter tree reshaped along its leading axes; boxed
    leaves (initialisation) get ``new_axis`` in front of their logical names, or lose
    their first name when it is None."""
    def reshape(leaf):
        if isinstance(leaf, nn.LogicallyPartitioned):
            names = (new_axis, *leaf.names) if new_axis else leaf.names[1:]
            return leaf.replace_boxed(reshape(leaf.value)).replace(names=names)
        return leaf.reshape(new_shape(leaf.shape))
    return jax.tree.map(reshape, tree, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


def _scan(block, num_args: int, length: int, axis_name: str):
    return nn.scan(block, variable_axes={"params": 0, "cache": 0, ROUTER_COLLECTION: 0},
                   split_rngs={"params": True, "dropout": True},
                   in_axes=(nn.broadcast,) * num_args, length=length,
                   metadata_params={nn.PARTITION_NAME: axis_name})


def stack_layer_params(params: Mapping, prefix: str = "layers_") -> dict:
    """Loop layout (``layers_i``) -> scan layout (``layers`` with a leading layer axis),
    at every level of the tree where per-layer entries appear (encoder and decoder
    stacks may have different depths)."""
    params = dict(params)
    if f"{prefix}0" in params:
        per_layer = []
        while f"{prefix}{len(per_layer)}" in params:
            per_layer.append(params.pop(f"{prefix}{len(per_layer)}"))
        params["layers"] = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]),
                                        *per_layer)
        return params
    return {k: stack_layer_params(v, prefix) if isinstance(v, Mapping) else v
            for k, v in params.items()}


def unstack_layer_params(params: Mapping, prefix: str = "layers_") -> dict:
    """Scan layout -> loop layout, the inverse of ``stack_layer_params``."""
    params = dict(params)
    if "layers" in params:
        stacked = params.pop("layers")
        num_layers = len(jax.tree.leaves(stacked)[0])
        for i in range(num_layers):
            params[f"{prefix}{i}"] = jax.tree.map(lambda x, i=i: np.asarray(x)[i], stacked)
        return params
    return {k: unstack_layer_params(v, prefix) if isinstance(v, Mapping) else v
            for k, v in params.items()}
