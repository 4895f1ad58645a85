"""Quantized training through Qwix, added to any family without touching its definition.

``with_quantized_training(model, settings, lengths)`` returns the same model (same
parameters, same paths) whose methods run under Qwix's interception (``qwix.QtProvider``):
each ``jax.lax.dot_general``, ``jnp.einsum`` or ``jax.lax.ragged_dot`` a chosen layer makes
is replaced by Qwix's quantized one, whose custom gradient quantizes the backward pass too.
Scales are computed in the step from the tensors themselves (absmax, per channel or per
tensor), so parameters and checkpoints stay float: export, evaluation and resume are as
they were.

Which matmuls are quantized is found by module type, not by name, so one rule serves
every family: an abstract ``init`` under a Flax method interceptor records where each
``DenseGeneral`` sits (in a ``MultiHeadAttention``: ``attention``; in an ``Mlp``:
``mlp``; with a ``vocab`` kernel axis: ``output``), where an ``Embed`` is ``attend``ed
(``output``, a tied projection) and where a mixture of experts computes its experts
(``experts``, Qwix's ``ragged_dot``). Qwix's rules then name those module paths exactly.
A router, a head or an MLM transform stays in the compute dtype.

MaxText builds the same rules (``QtRule`` with int8 weights, activations and gradients;
fp8 as ``float8_e4m3fn`` forward and ``float8_e5m2`` backward).
"""

from __future__ import annotations

import dataclasses
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import qwix

from t5x_like.errors import UserError
from t5x_like.models import example_inputs, layers, moe

#: ``kind -> (forward dtype of weights and activations, dtype of gradients)``
KINDS = {"int8": (jnp.int8, jnp.int8), "fp8": (jnp.float8_e4m3fn, jnp.float8_e5m2)}
LAYERS = ("attention", "mlp", "experts", "output")

# The op each kind of layer computes its matmul with (Qwix's op names).
_OPS = {"attention": "dot_general", "mlp": "dot_general", "output": "dot_general",
        "output_tied": "einsum", "experts": "ragged_dot"}


@dataclasses.dataclass(frozen=True)
class QuantSettings:
    """What ``config.quantization`` asks of the model (hashable: models are cached by it)."""

    kind: str = ""
    scales: str = "per_channel"
    layers: tuple[str, ...] = ("attention", "mlp", "experts")

    @property
    def on(self) -> bool:
        return bool(self.kind)

    @classmethod
    def from_config(cls, section) -> QuantSettings:
        if section is None:
            return cls()
        return cls(kind=str(section.kind), scales=str(section.scales),
                   layers=tuple(section.layers))


def quantized_matmuls(model: nn.Module, lengths=None) -> dict[str, tuple[str, ...]]:
    """``{layer kind: module paths}`` of the matmuls each kind of layer makes in ``model``
    (``attention``, ``mlp``, ``output``, ``output_tied``, ``experts``, and
    ``experts_capacity`` for experts behind capacity dispatch, which Qwix cannot tell
    apart from the dispatch einsums), from one abstract ``init``: nothing is computed."""
    found: dict[str, list[str]] = {}

    def record(next_fun, args, kwargs, context):
        kind = _layer_kind(context.module, context.method_name)
        if kind:
            path = "/".join(str(p) for p in context.module.scope.path)
            paths = found.setdefault(kind, [])
            if path not in paths:
                paths.append(path)
        return next_fun(*args, **kwargs)

    inputs = example_inputs(model, lengths)
    with nn.intercept_methods(record):
        jax.eval_shape(lambda: model.init(jax.random.key(0), *inputs))
    return {kind: tuple(paths) for kind, paths in found.items()}


def _layer_kind(module: nn.Module, method: str) -> str | None:
    if isinstance(module, layers.Embed):
        return "output_tied" if method == "attend" else None
    if method != "__call__":
        return None
    if isinstance(module, moe.MoeFeedForward):
        return "experts" if module.settings.dispatch == "dropless" else "experts_capacity"
    if not isinstance(module, layers.DenseGeneral):
        return None
    if "vocab" in tuple(module.kernel_axes):
        return "output"
    if isinstance(module.parent, layers.MultiHeadAttention):
        return "attention"
    if isinstance(module.parent, layers.Mlp):
        return "mlp"
    return None


def training_rules(settings: QuantSettings, matmuls: dict[str, tuple[str, ...]]
                   ) -> list[qwix.QtRule]:
    """Qwix's quantized-training rules for ``settings.layers`` of a model whose matmuls
    are ``matmuls`` (``quantized_matmuls``). Refuses a layer the model does not have."""
    forward, backward = KINDS[settings.kind]
    if "experts" in settings.layers and matmuls.get("experts_capacity"):
        raise UserError(
            "quantization.layers has 'experts', which Qwix quantizes in the expert matmuls "
            "of dropless dispatch; this model's experts use capacity dispatch. Set "
            "--config.model.experts.dispatch=dropless or leave 'experts' out of "
            "quantization.layers.")
    rules = []
    for layer in settings.layers:
        for kind in (layer, "output_tied") if layer == "output" else (layer,):
            paths = matmuls.get(kind, ())
            if paths:
                rules.append(qwix.QtRule(
                    module_path="|".join(re.escape(p) for p in paths), op_names=(_OPS[kind],),
                    weight_qtype=forward, act_qtype=forward, bwd_qtype=backward,
                    disable_channelwise_axes=settings.scales == "per_tensor"))
    if not rules:
        raise UserError(f"quantization.layers={list(settings.layers)} matches no matmul of "
                        f"this model (it has {sorted(k for k in matmuls if k in LAYERS)}); "
                        "name those or set --config.quantization.kind=.")
    return rules


def _intercepted_methods(model: nn.Module) -> tuple[str, ...]:
    """``__call__`` and the public methods a structure calls by name (``encode``,
    ``decode``, ...): those the family's class defines beyond ``nn.Module``'s own."""
    base = set(dir(nn.Module))
    names = {"__call__"}
    for cls in type(model).__mro__:
        if cls is nn.Module or not issubclass(cls, nn.Module):
            continue
        names.update(name for name, value in vars(cls).items()
                     if callable(value) and not name.startswith("_") and name not in base)
    return tuple(sorted(names))


def with_quantized_training(model: nn.Module, settings: QuantSettings, lengths=None
                            ) -> nn.Module:
    """``model`` whose chosen matmuls Qwix quantizes in the forward and backward pass
    (``model`` itself when ``settings`` is off). Its parameters are ``model``'s."""
    if not settings.on:
        return model
    rules = training_rules(settings, quantized_matmuls(model, lengths))
    return qwix.quantize_model(model, qwix.QtProvider(rules),
                               methods=_intercepted_methods(model))


#: the layers whose kernels decoding reads in int8 (weights only: activations stay in
#: the compute dtype, and the output projection keeps its precision, as is usual)
WEIGHT_LAYERS = ("attention", "mlp")


def with_int8_weights(model: nn.Module, lengths=None) -> nn.Module:
    """``model`` whose attention and MLP kernels are int8 with one scale per output
    channel (Qwix's post-training quantization): its params are ``qwix.quantize_params``
    of the float ones, and each matmul multiplies by the int8 values, then the scales."""
    matmuls = quantized_matmuls(model, lengths)
    paths = [p for layer in WEIGHT_LAYERS for p in matmuls.get(layer, ())]
    if not paths:
        raise UserError(f"quantization.weights='int8' quantizes attention and MLP kernels, and "
                        f"this model has none Qwix can reach (it has {sorted(matmuls)}); "
                        "set --config.quantization.weights=.")
    rule = qwix.QuantizationRule(module_path="|".join(re.escape(p) for p in paths),
                                 op_names=("dot_general",), weight_qtype=jnp.int8)
    return qwix.quantize_model(model, qwix.PtqProvider([rule]),
                               methods=_intercepted_methods(model))
