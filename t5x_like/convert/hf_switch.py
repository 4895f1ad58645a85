"""Hugging Face Switch Transformers <-> t5x_like ``EncoderDecoder`` with mixture-of-experts
layers: T5 v1.0 (``hf_t5``'s attention, norms, relative positions and tied, rescaled
output) with a top-1 router every few layers.

A sparse layer's MLP is ``mlp.router.classifier`` ``[E, d]`` (no bias) and
``mlp.experts.expert_{j}.wi``/``wo`` (ReLU, not gated); a dense layer's ``mlp.wi``/``wo``.
Layer ``i`` of a stack is sparse when ``i % step == 1`` (every layer when the step is 1),
the step being ``num_layers // num_sparse_encoder_layers`` (decoder likewise), as
transformers computes it; the encoder's and decoder's sparse layers must be the ones one
``moe_every`` draws (``(i + 1) % moe_every == 0``), which holds for steps 1 and 2.

Routing is Switch's: the softmax over all experts, weighted by the top probability
(``router_softmax="before_top_k"``, ``k=1``), with ``router_jitter_noise`` as
``router_jitter`` and the ``router_aux_loss_coef``/``router_z_loss_coef`` as the loss weights.

Capacity: transformers gives each expert ``expert_capacity`` tokens per sequence, earlier
tokens first, and a token over it leaves the layer as zero (as our capacity dispatch;
transformers 4 passed ``router_prob * hidden`` instead). Ours is a factor
(``ceil(capacity_factor * length / E)``), so imports dispatch ``dropless``, equal to
transformers wherever no expert gets more than ``expert_capacity`` tokens of a sequence.
Export writes ``expert_capacity`` = ``DROPLESS_CAPACITY``, which no sequence reaches:
transformers then drops nothing either.
"""

from __future__ import annotations

import numpy as np

from t5x_like.convert import hf_moe, hf_t5
from t5x_like.errors import UserError

#: The exported ``expert_capacity``: more tokens than any sequence holds.
DROPLESS_CAPACITY = 1 << 16

_EXPERT_NAMES = {"wi": "wi", "wo": "wo"}


def hf_sparse_layers(num_layers: int, num_sparse: int) -> list[bool]:
    """transformers' sparse layers of a stack (``SwitchTransformersStack``)."""
    step = num_layers // num_sparse if num_sparse > 0 else num_layers
    return [step > 0 and (i % step == 1 or step == 1) for i in range(num_layers)]


def _moe_every(hf: dict) -> int:
    encoder_layers = int(hf["num_layers"])
    decoder_layers = int(hf.get("num_decoder_layers") or encoder_layers)
    encoder = hf_sparse_layers(encoder_layers, int(hf.get("num_sparse_encoder_layers", 3)))
    decoder = hf_sparse_layers(decoder_layers, int(hf.get("num_sparse_decoder_layers", 3)))
    every = {hf_moe.moe_every_for(encoder), hf_moe.moe_every_for(decoder)}
    if None in every or len(every) > 1:
        drawn = {stack: [i for i, s in enumerate(flags) if s]
                 for stack, flags in (("encoder", encoder), ("decoder", decoder))}
        raise UserError(
            f"switch_transformers with sparse encoder layers {drawn['encoder']} and decoder "
            f"layers {drawn['decoder']} (num_sparse_encoder_layers="
            f"{hf.get('num_sparse_encoder_layers')}, num_sparse_decoder_layers="
            f"{hf.get('num_sparse_decoder_layers')}) does not convert: our T5 makes layer i of "
            "both stacks sparse when (i + 1) % moe_every == 0, so both steps must be equal and "
            "1 or 2 (every layer or every other).")
    return every.pop()


def model_config_from_hf(hf: dict) -> dict:
    if hf.get("model_type") != "switch_transformers":
        raise ValueError(f"Expected a Switch Transformers config, got {hf.get('model_type')!r}.")
    activation = hf.get("dense_act_fn", "relu")
    if activation.startswith("gated") or activation not in hf_t5._ACTIVATION:
        raise UserError(f"switch_transformers with dense_act_fn {activation!r} does not "
                        f"convert; supported: {', '.join(sorted(hf_t5._ACTIVATION))}.")
    if hf.get("router_bias"):
        raise UserError("switch_transformers with router_bias=true does not convert: our "
                        "router has no bias. Supported: router_bias false, as Google's "
                        "checkpoints.")
    # Everything but the experts is T5 v1.0's (tied and rescaled output when tied).
    cfg = hf_t5.model_config_from_hf({**hf, "model_type": "t5", "feed_forward_proj": activation,
                                      "scale_decoder_outputs": hf.get("tie_word_embeddings",
                                                                      True)})
    cfg.update(num_experts=int(hf["num_experts"]), num_experts_per_token=1,
               moe_every=_moe_every(hf), expert_d_ff=int(hf["d_ff"]),
               router_softmax="before_top_k",
               router_jitter=float(hf.get("router_jitter_noise") or 0.0),
               router_aux_loss_weight=float(hf.get("router_aux_loss_coef", 0.001)),
               router_z_loss_weight=float(hf.get("router_z_loss_coef", 0.001)),
               moe_dispatch="dropless")
    return cfg


def _num_sparse_for(cfg: dict, layers: int, stack: str) -> int:
    """The ``num_sparse_*_layers`` whose transformers layers are ours, or a refusal."""
    ours = hf_moe.sparse_layers(cfg, layers)
    for count in range(1, layers + 1):
        if hf_sparse_layers(layers, count) == ours:
            return count
    raise UserError(f"Switch Transformers cannot place the {stack}'s sparse layers "
                    f"{[i for i, s in enumerate(ours) if s]} (model.moe_every="
                    f"{cfg.get('moe_every', 1)}): its layer i is sparse when i % step == 1; "
                    "export a model with moe_every 1 or 2.")


def hf_config_from_model_config(cfg: dict) -> dict:
    activations = tuple(cfg["mlp_activations"])
    problems = []
    if len(activations) != 1:
        problems.append(f"mlp_activations={activations} (Switch's MLPs are not gated)")
    if int(cfg["num_experts_per_token"]) != 1:
        problems.append(f"num_experts_per_token={cfg['num_experts_per_token']} (Switch is "
                        "top-1)")
    if cfg.get("router_softmax", "before_top_k") != "before_top_k":
        problems.append("router_softmax='after_top_k' (Switch weighs by the top probability: "
                        "'before_top_k')")
    if cfg.get("shared_expert_d_ff"):
        problems.append("a shared expert")
    if int(cfg.get("expert_d_ff") or cfg["d_ff"]) != int(cfg["d_ff"]):
        problems.append(f"expert_d_ff={cfg['expert_d_ff']} unlike d_ff={cfg['d_ff']} (Switch's "
                        "experts are as wide as its dense MLPs)")
    if problems:
        raise UserError(f"This encoder-decoder mixture of experts has no Switch Transformers "
                        f"equivalent: {'; '.join(problems)}. Change those keys.")
    base = hf_t5.hf_config_from_model_config(cfg)
    base.pop("feed_forward_proj")
    base.pop("scale_decoder_outputs")
    return {**base, "architectures": ["SwitchTransformersForConditionalGeneration"],
            "model_type": "switch_transformers", "dense_act_fn": hf_t5._ACTIVATION_BACK[
                activations[0]],
            "num_experts": int(cfg["num_experts"]), "expert_capacity": DROPLESS_CAPACITY,
            "num_sparse_encoder_layers": _num_sparse_for(cfg, cfg["num_encoder_layers"],
                                                         "encoder"),
            "num_sparse_decoder_layers": _num_sparse_for(cfg, cfg["num_decoder_layers"],
                                                         "decoder"),
            "router_bias": False, "router_jitter_noise": float(cfg.get("router_jitter", 0.0)),
            "router_aux_loss_coef": float(cfg.get("router_aux_loss_weight", 0.01)),
            "router_z_loss_coef": float(cfg.get("router_z_loss_weight", 0.0))}


def _layers(cfg: dict, stack: str) -> list[bool]:
    return hf_moe.sparse_layers(cfg, cfg[f"num_{stack}_layers"])


def _expert_pattern(prefix: str) -> str:
    return f"{prefix}.mlp.experts.expert_{{j}}.{{name}}.weight"


def _feed_forward_in(w, cfg: dict, stack: str, index: int, prefix: str) -> dict:
    if not _layers(cfg, stack)[index]:
        return {"wi": {"kernel": w[f"{prefix}.mlp.wi.weight"].T},
                "wo": {"kernel": w[f"{prefix}.mlp.wo.weight"].T}}
    return {"router": {"kernel": w[f"{prefix}.mlp.router.classifier.weight"].T},
            "experts": hf_moe.stacked_experts(w, _expert_pattern(prefix), cfg["num_experts"],
                                              _EXPERT_NAMES)}


def _feed_forward_out(mlp: dict, cfg: dict, stack: str, index: int, prefix: str) -> dict:
    if not _layers(cfg, stack)[index]:
        return {f"{prefix}.mlp.{name}.weight": np.asarray(mlp[name]["kernel"]).T
                for name in ("wi", "wo")}
    return {f"{prefix}.mlp.router.classifier.weight": np.asarray(mlp["router"]["kernel"]).T,
            **hf_moe.unstacked_experts(mlp["experts"], _expert_pattern(prefix), _EXPERT_NAMES)}


def params_from_hf(weights: dict[str, np.ndarray], cfg: dict) -> dict:
    return hf_t5.params_from_hf(weights, cfg, _feed_forward_in)


def params_to_hf(params: dict, cfg: dict) -> dict[str, np.ndarray]:
    return hf_t5.params_to_hf(params, cfg, _feed_forward_out)
