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

from t5x_like.models.layers import gradient_boundary
from t5x_like.models.moe import COLLECTION as ROUTER_COLLECTION

REMAT_POLICIES = {
    "none": None,  # no remat: keep every activation
    "full": jax.checkpoint_policies.nothing_saveable,  # recompute the whole block
    "dots": jax.checkpoint_policies.checkpoint_dots,  # keep matmul outputs
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # MaxText's default
}


def check_remat_policy(policy: str) -> None:
    if policy not in REMAT_POLICIES:
        raise ValueError(f"Unknown remat_policy {policy!r}; choose from {sorted(REMAT_POLICIES)}.")


def run_stack(block_cls: type[nn.Module], config: Any, num_layers: int, x, *args,
              scan: bool = False, remat_policy: str = "none", static_argnums: tuple[int, ...] = (),
              shared: bool = False, layer_attributes=None):
    """Applies ``num_layers`` blocks ``block_cls(config)`` to ``x``; ``args`` go to every block.

    Must be called inside a parent's ``nn.compact`` method (the blocks become the
    parent's children). ``static_argnums`` are the positions in ``args`` of Python
    values (flags such as ``deterministic``), which remat must not trace.
    ``shared`` applies one block ``num_layers`` times (ALBERT's cross-layer sharing).
    Blocks take ``scanned`` and return ``(x, None)`` when it is set.
    ``layer_attributes(i)``: extra constructor attributes of block ``i`` (Gemma's
    alternating layer types); a loop only, since a scan repeats one block.
    """
    check_remat_policy(remat_policy)
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
    scanned = nn.scan(block, variable_axes={"params": 0, "cache": 0, ROUTER_COLLECTION: 0},
                      split_rngs={"params": True, "dropout": True},
                      in_axes=(nn.broadcast,) * len(args), length=num_layers,
                      metadata_params={nn.PARTITION_NAME: "layers"})
    x, _ = scanned(config, scanned=True, name="layers")(x, *args)
    return x


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
