"""Hugging Face Mixtral and Qwen2-MoE <-> t5x_like ``DecoderOnly`` with mixture-of-experts
layers (``models.moe``), and what every mixture-of-experts converter shares.

Both are the Llama layout (``hf_llama``'s attention and SwiGLU readers) with a sparse
feed-forward block:

- Mixtral: every layer sparse; router ``block_sparse_moe.gate`` ``[E, d]``; experts
  ``w1`` (gate), ``w3`` (up), ``w2`` (down); the top ``k`` probabilities renormalised,
  which is the softmax over the top ``k`` logits (``router_softmax="after_top_k"``);
  Mistral's sliding window.
- Qwen2-MoE: layer ``i`` sparse when ``(i + 1) % decoder_sparse_step == 0`` and ``i`` is
  not in ``mlp_only_layers`` (accepted where ``moe_every`` draws the same layers); dense
  layers of ``intermediate_size``, experts of ``moe_intermediate_size``; a shared expert
  (``shared_expert_intermediate_size``) under a sigmoid gate; biases on q/k/v
  (``qkv_bias``); ``norm_topk_prob`` picks ``after_top_k``, else the probabilities over
  all experts read at the top ``k`` (``before_top_k``).

transformers 5 holds experts fused (``experts.gate_up_proj [E, 2 * ff, d]``,
``experts.down_proj [E, d, ff]`` under ``mlp``) but ``save_pretrained`` writes them back
one module per expert (``experts.{j}.w1`` / ``gate_proj``...), as Hub checkpoints hold
them: import reads either, export writes the per-expert names.

Imports dispatch ``dropless``: every token reaches its ``k`` experts, as in transformers,
which drops none. Capacity dispatch (the training default) would drop tokens over an
expert's capacity, so set ``model.moe_dispatch=capacity`` only knowingly.
``router_aux_loss_coef`` becomes ``router_aux_loss_weight`` and Mixtral's
``router_jitter_noise`` ``router_jitter`` (training only; Qwen2-MoE has no jitter, so
export to it drops ours).
"""

from __future__ import annotations

import numpy as np

from t5x_like.convert import hf_llama
from t5x_like.convert.hf_t5 import TrackedWeights
from t5x_like.errors import UserError

_MODEL_TYPES = ("mixtral", "qwen2_moe")
#: Every mixture-of-experts model_type convert imports.
SUPPORTED = ("mixtral", "qwen2_moe", "switch_transformers")
#: Mixture-of-experts model_types of transformers convert does not import: their
#: refusal names the supported ones.
UNSUPPORTED = ("dbrx", "deepseek_v2", "deepseek_v3", "ernie4_5_moe", "glm4_moe", "gpt_oss",
               "granitemoe", "granitemoehybrid", "granitemoeshared", "hunyuan_v1_moe", "jamba",
               "llama4", "minimax", "nllb-moe", "olmoe", "phimoe", "qwen3_moe", "qwen3_next")


def unsupported_message(model_type: str) -> str:
    return (f"model_type {model_type!r} is a mixture of experts convert does not import; the "
            f"mixtures it imports are {', '.join(SUPPORTED)}.")


def moe_every_for(sparse: list[bool]) -> int | None:
    """The ``moe_every`` whose layers ``(i + 1) % moe_every == 0`` are exactly the sparse
    ones, or None (no sparse layer, or a pattern no ``moe_every`` draws)."""
    for every in range(1, len(sparse) + 1):
        if [(i + 1) % every == 0 for i in range(len(sparse))] == sparse:
            return every
    return None


def sparse_layers(cfg: dict, num_layers: int) -> list[bool]:
    every = int(cfg.get("moe_every", 1))
    return [bool(cfg.get("num_experts")) and (i + 1) % every == 0 for i in range(num_layers)]


def stacked_experts(w: TrackedWeights, pattern: str, num_experts: int,
                    names: dict[str, str]) -> dict:
    """Our ``experts`` params from one module per expert, named by ``pattern`` (with
    ``{j}`` and ``{name}``, e.g. ``...experts.{j}.{name}.weight``): ``names`` maps ours
    (``wi_0``, ``wi_1``/``wi``, ``wo``) to theirs; torch's ``[out, in]`` become
    ``[E, in, out]``."""
    return {ours: np.stack([w[pattern.format(j=j, name=theirs)].T for j in range(num_experts)])
            for ours, theirs in names.items()}


def unstacked_experts(experts: dict, pattern: str, names: dict[str, str]) -> dict:
    """The inverse of ``stacked_experts``."""
    out = {}
    for ours, theirs in names.items():
        for j, kernel in enumerate(np.asarray(experts[ours])):
            out[pattern.format(j=j, name=theirs)] = kernel.T
    return out


def _fused_experts(w: TrackedWeights, prefix: str) -> dict:
    """transformers 5's in-memory layout: ``gate_up_proj [E, 2 * ff, d]`` (gate rows
    first), ``down_proj [E, d, ff]``."""
    gate_up = w[f"{prefix}.gate_up_proj"]
    width = gate_up.shape[1] // 2
    return {"wi_0": gate_up[:, :width].transpose(0, 2, 1),
            "wi_1": gate_up[:, width:].transpose(0, 2, 1),
            "wo": w[f"{prefix}.down_proj"].transpose(0, 2, 1)}


_EXPERT_NAMES = {"mixtral": {"wi_0": "w1", "wi_1": "w3", "wo": "w2"},
                 "qwen2_moe": {"wi_0": "gate_proj", "wi_1": "up_proj", "wo": "down_proj"}}
# The module of a sparse block in the per-expert layout (the fused one is always ``mlp``).
_BLOCK = {"mixtral": "block_sparse_moe", "qwen2_moe": "mlp"}


def model_type_for(cfg: dict) -> str:
    """Qwen2-MoE where the model has a shared expert, else Mixtral."""
    return "qwen2_moe" if cfg.get("shared_expert_d_ff") else "mixtral"


def _qwen2_moe_layers(hf: dict) -> int:
    layers = int(hf["num_hidden_layers"])
    step = int(hf.get("decoder_sparse_step") or 1)
    dense_only = {int(i) for i in hf.get("mlp_only_layers") or ()}
    sparse = [int(hf["num_experts"]) > 0 and i not in dense_only and (i + 1) % step == 0
              for i in range(layers)]
    every = moe_every_for(sparse)
    if every is None:
        drawn = [i for i, s in enumerate(sparse) if s]
        raise UserError(
            f"qwen2_moe with decoder_sparse_step={step} and mlp_only_layers="
            f"{sorted(dense_only)} has sparse layers {drawn}, which model.moe_every (layers "
            "with (i + 1) % moe_every == 0) cannot draw; only checkpoints whose mlp_only_layers "
            "leave such a pattern (or are empty) convert.")
    return every


def model_config_from_hf(hf: dict) -> dict:
    kind = hf.get("model_type")
    if kind not in _MODEL_TYPES:
        raise ValueError(f"Expected a Mixtral or Qwen2-MoE config, got {kind!r}.")
    # The attention, norms and positions are Mistral's (Mixtral) and Qwen2's (Qwen2-MoE).
    cfg = hf_llama.model_config_from_hf(
        {**hf, "model_type": "mistral" if kind == "mixtral" else "qwen2"})
    if kind == "mixtral":
        experts, every = int(hf["num_local_experts"]), 1
        cfg.update(expert_d_ff=int(hf["intermediate_size"]), router_softmax="after_top_k",
                   router_jitter=float(hf.get("router_jitter_noise") or 0.0))
    else:
        if not int(hf.get("shared_expert_intermediate_size") or 0):
            raise UserError("qwen2_moe with shared_expert_intermediate_size=0 does not convert: "
                            "the imported Qwen2-MoE has a shared expert beside the routed ones.")
        experts, every = int(hf["num_experts"]), _qwen2_moe_layers(hf)
        cfg.update(expert_d_ff=int(hf["moe_intermediate_size"]),
                   shared_expert_d_ff=int(hf["shared_expert_intermediate_size"]),
                   shared_expert_gate=True, qkv_bias=bool(hf.get("qkv_bias", True)),
                   router_softmax="after_top_k" if hf.get("norm_topk_prob") else "before_top_k")
    cfg.update(num_experts=experts, num_experts_per_token=int(hf["num_experts_per_tok"]),
               moe_every=every, moe_dispatch="dropless",
               router_aux_loss_weight=float(hf.get("router_aux_loss_coef", 0.001)),
               router_z_loss_weight=0.0)
    return cfg


def hf_config_from_model_config(cfg: dict) -> dict:
    kind = model_type_for(cfg)
    problems = []
    if cfg.get("qk_norm"):
        problems.append("qk_norm (neither has per-head query/key norms)")
    if kind == "mixtral":
        if cfg.get("router_softmax", "before_top_k") != "after_top_k":
            problems.append("router_softmax='before_top_k' (Mixtral renormalises the top k: "
                            "'after_top_k')")
        if int(cfg.get("moe_every", 1)) != 1:
            problems.append(f"moe_every={cfg['moe_every']} (every Mixtral layer is sparse)")
        if cfg.get("qkv_bias"):
            problems.append("qkv_bias (Mixtral has no attention biases)")
        if cfg.get("layer_types"):
            problems.append("layer_types (Mixtral's window is every layer's)")
    elif not cfg.get("shared_expert_gate"):
        problems.append("shared_expert_gate=False (Qwen2-MoE gates its shared expert)")
    if problems:
        target = {"mixtral": "Mixtral (no shared expert)",
                  "qwen2_moe": "Qwen2-MoE (a shared expert)"}[kind]
        raise UserError(f"This mixture of experts exports as {target} but has "
                        f"{'; '.join(problems)}; change those keys or export a model that "
                        "has a Hugging Face equivalent.")
    # Attention, norms, positions and sliding window as the dense family writes them.
    base = hf_llama.hf_config_from_model_config(
        {**cfg, "qkv_bias": kind == "qwen2_moe", "qk_norm": False})
    for key in ("attention_bias", "mlp_bias"):
        base.pop(key, None)
    expert_width = int(cfg.get("expert_d_ff") or cfg["d_ff"])
    shared = {"num_experts_per_tok": int(cfg["num_experts_per_token"]),
              "router_aux_loss_coef": float(cfg.get("router_aux_loss_weight", 0.01)),
              "output_router_logits": False}
    if kind == "mixtral":
        return {**base, **shared, "architectures": ["MixtralForCausalLM"],
                "model_type": "mixtral", "intermediate_size": expert_width,
                "num_local_experts": int(cfg["num_experts"]),
                "sliding_window": int(cfg.get("sliding_window") or 0) or None,
                "router_jitter_noise": float(cfg.get("router_jitter", 0.0))}
    return {**base, **shared, "architectures": ["Qwen2MoeForCausalLM"],
            "model_type": "qwen2_moe", "qkv_bias": bool(cfg.get("qkv_bias")),
            "num_experts": int(cfg["num_experts"]), "moe_intermediate_size": expert_width,
            "shared_expert_intermediate_size": int(cfg["shared_expert_d_ff"]),
            "decoder_sparse_step": int(cfg.get("moe_every", 1)), "mlp_only_layers": [],
            "norm_topk_prob": cfg.get("router_softmax") == "after_top_k"}


def _sparse_block_from_hf(w: TrackedWeights, b: str, cfg: dict, kind: str) -> dict:
    fused = f"{b}.mlp.experts.gate_up_proj"
    if fused in w:
        block, experts = "mlp", _fused_experts(w, f"{b}.mlp.experts")
    else:
        block = _BLOCK[kind]
        experts = stacked_experts(w, f"{b}.{block}.experts.{{j}}.{{name}}.weight",
                                  cfg["num_experts"], _EXPERT_NAMES[kind])
    mlp = {"router": {"kernel": w[f"{b}.{block}.gate.weight"].T}, "experts": experts}
    if kind == "qwen2_moe":
        mlp["shared_expert"] = hf_llama.gated_mlp_from_hf(w, b, "mlp.shared_expert")
        mlp["shared_expert_gate"] = {"kernel": w[f"{b}.mlp.shared_expert_gate.weight"].T}
    return mlp


def _sparse_block_to_hf(mlp: dict, b: str, kind: str) -> dict:
    block = _BLOCK[kind]
    out = {f"{b}.{block}.gate.weight": np.asarray(mlp["router"]["kernel"]).T,
           **unstacked_experts(mlp["experts"], f"{b}.{block}.experts.{{j}}.{{name}}.weight",
                               _EXPERT_NAMES[kind])}
    if kind == "qwen2_moe":
        out.update(hf_llama.gated_mlp_to_hf(mlp["shared_expert"], b, "mlp.shared_expert"))
        out[f"{b}.mlp.shared_expert_gate.weight"] = np.asarray(
            mlp["shared_expert_gate"]["kernel"]).T
    return out


def params_from_hf(weights: dict[str, np.ndarray], cfg: dict) -> dict:
    kind = model_type_for(cfg)
    w = TrackedWeights(weights)
    params = {"token_embedder": {"embedding": w["model.embed_tokens.weight"]},
              "final_norm": {"scale": w["model.norm.weight"]}}
    if not cfg["tie_embeddings"]:
        params["logits_dense"] = {"kernel": w["lm_head.weight"].T}
    for i, sparse in enumerate(sparse_layers(cfg, cfg["num_layers"])):
        b = f"model.layers.{i}"
        params[f"layers_{i}"] = {
            "pre_attention_norm": {"scale": w[f"{b}.input_layernorm.weight"]},
            "attention": hf_llama.attention_from_hf(w, b, cfg),
            "pre_mlp_norm": {"scale": w[f"{b}.post_attention_layernorm.weight"]},
            "mlp": (_sparse_block_from_hf(w, b, cfg, kind) if sparse
                    else hf_llama.gated_mlp_from_hf(w, b)),
        }
    w.check_all_used(ignore=("lm_head.weight",) if cfg["tie_embeddings"] else (),
                     ignore_suffixes=(".rotary_emb.inv_freq",))
    return params


def params_to_hf(params: dict, cfg: dict) -> dict[str, np.ndarray]:
    kind = model_type_for(cfg)
    out = {"model.embed_tokens.weight": params["token_embedder"]["embedding"],
           "model.norm.weight": params["final_norm"]["scale"]}
    if not cfg["tie_embeddings"]:
        out["lm_head.weight"] = np.asarray(params["logits_dense"]["kernel"]).T
    for i, sparse in enumerate(sparse_layers(cfg, cfg["num_layers"])):
        layer, b = params[f"layers_{i}"], f"model.layers.{i}"
        out.update(hf_llama.attention_to_hf(layer["attention"], b, cfg))
        out[f"{b}.input_layernorm.weight"] = layer["pre_attention_norm"]["scale"]
        out[f"{b}.post_attention_layernorm.weight"] = layer["pre_mlp_norm"]["scale"]
        out.update(_sparse_block_to_hf(layer["mlp"], b, kind) if sparse
                   else hf_llama.gated_mlp_to_hf(layer["mlp"], b))
    return {k: np.ascontiguousarray(np.asarray(v), dtype=np.float32) for k, v in out.items()}
