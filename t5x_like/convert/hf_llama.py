"""Hugging Face Llama / Mistral / Qwen2 / Qwen3 <-> t5x_like ``DecoderOnly`` in its modern
layout.

Rotary positions (with Llama 3.1's and YaRN's rescalings, ``hf_rope``), RMSNorm, SwiGLU
(``gate_proj`` = ``wi_0`` under SiLU, ``up_proj`` = ``wi_1``), grouped-query attention;
Mistral adds a sliding window, Qwen2 biases on the query/key/value projections (and
sliding layers from ``max_window_layers`` on, when ``use_sliding_window``), Qwen3 an
RMSNorm over each head's queries and keys. Torch ``Linear`` weights are ``[out, in]``;
ours are ``[in, out]`` split by head.
"""

from __future__ import annotations

import numpy as np

from t5x_like.convert import hf_gpt2, hf_rope
from t5x_like.convert.hf_t5 import TrackedWeights
from t5x_like.errors import UserError

_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def model_config_from_hf(hf: dict) -> dict:
    kind = hf.get("model_type")
    if kind not in _MODEL_TYPES:
        raise ValueError(f"Expected a Llama, Mistral or Qwen config, got {kind!r}.")
    if hf.get("hidden_act", "silu") != "silu":
        raise UserError(f"Only SwiGLU (hidden_act 'silu') is supported, got {hf['hidden_act']!r}.")
    # Qwen2 always biases q/k/v (its config has no switch); the others' attention_bias
    # also biases the output projection, which the decoder does not build.
    biased = [key for key in ("attention_bias", "mlp_bias") if hf.get(key)]
    if biased:
        raise UserError(f"{kind} with {' and '.join(biased)}=true does not convert: "
                        "supported are Llama/Mistral/Qwen3 without biases (attention_bias and "
                        "mlp_bias false) and Qwen2 (biases on q/k/v only).")
    d_model, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    if kind == "mistral":
        layer_types, window = (), int(hf.get("sliding_window") or 0)
    elif kind in ("qwen2", "qwen3"):
        layer_types, window = hf_rope.layer_types_from_hf(hf)
    else:
        layer_types, window = (), 0
    return {
        "family": "decoder",
        "vocab_size": int(hf["vocab_size"]),
        "d_model": d_model,
        "num_heads": heads,
        "head_dim": int(hf.get("head_dim") or d_model // heads),
        "d_ff": int(hf["intermediate_size"]),
        "num_layers": int(hf["num_hidden_layers"]),
        "max_length": int(hf.get("max_position_embeddings", 2048)),
        "mlp_activations": ("silu", "linear"),
        "use_bias": False,
        "qkv_bias": kind == "qwen2",
        "qk_norm": kind == "qwen3",
        "layer_norm_epsilon": float(hf.get("rms_norm_eps", 1e-6)),
        "norm": "rmsnorm",
        "position_embedding": "rotary",
        **hf_rope.fields_from_hf(hf),
        "num_kv_heads": int(hf.get("num_key_value_heads") or heads),
        "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "sliding_window": window,
        "layer_types": layer_types,
        "dropout_rate": 0.0,
        "dtype": "float32",
        "bos_id": hf_gpt2.start_id(hf),
    }


def model_type_for(cfg: dict) -> str:
    """The Hugging Face architecture a rotary decoder config is: its switches decide."""
    if cfg.get("qk_norm") and not cfg.get("qkv_bias"):
        return "qwen3"
    if cfg.get("qkv_bias") and not cfg.get("qk_norm"):
        return "qwen2"
    if cfg.get("qk_norm"):
        raise UserError("A decoder with both qkv_bias and qk_norm has no Hugging Face "
                        "equivalent (Qwen2 has the biases, Qwen3 the norms); export one of them.")
    if cfg.get("layer_types"):
        raise UserError("Llama and Mistral have no per-layer attention types; a decoder with "
                        "model.layer_types exports as Qwen2/Qwen3 (qkv_bias or qk_norm) or Gemma.")
    return "mistral" if cfg.get("sliding_window") else "llama"


def hf_config_from_model_config(cfg: dict) -> dict:
    activations = tuple(cfg.get("mlp_activations", ("gelu",)))
    unlike = {key: value for key, value, llama in (
        ("norm", cfg.get("norm", "layernorm"), "rmsnorm"),
        ("use_bias", cfg.get("use_bias", True), False),
        ("mlp_activations", activations, ("silu", "linear")),
        ("scan_layers", cfg.get("scan_layers", False), False)) if value != llama}
    if unlike:
        raise UserError(f"This rotary decoder has no Llama equivalent ({unlike}); Llama/Mistral/"
                        "Qwen export needs rmsnorm, no biases, SwiGLU (mlp_activations ('silu', "
                        "'linear')) and unscanned layers.")
    kind = model_type_for(cfg)
    names = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
             "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
    out = {
        "architectures": [names[kind]],
        "model_type": kind,
        "vocab_size": cfg["vocab_size"], "hidden_size": cfg["d_model"],
        "intermediate_size": cfg["d_ff"], "num_hidden_layers": cfg["num_layers"],
        "num_attention_heads": cfg["num_heads"],
        "num_key_value_heads": cfg.get("num_kv_heads") or cfg["num_heads"],
        "head_dim": cfg["head_dim"], "hidden_act": "silu",
        "max_position_embeddings": cfg["max_length"], "rms_norm_eps": cfg["layer_norm_epsilon"],
        "rope_parameters": hf_rope.parameters_from_model_config(cfg),
        "tie_word_embeddings": cfg["tie_embeddings"],
        "decoder_start_token_id": cfg.get("bos_id", 0),  # what the model's sequences start with
    }
    if kind != "qwen2":
        out.update(attention_bias=False)
    if kind in ("llama", "mistral"):
        out.update(mlp_bias=False)
    if kind == "mistral":
        out["sliding_window"] = cfg["sliding_window"]
    if kind in ("qwen2", "qwen3"):
        window = int(cfg.get("sliding_window") or 0)
        types = list(cfg.get("layer_types") or
                     [("sliding_attention" if window else "full_attention")] * cfg["num_layers"])
        out.update(use_sliding_window=bool(window), sliding_window=window or None,
                   layer_types=types,
                   max_window_layers=types.index("sliding_attention")
                   if "sliding_attention" in types else cfg["num_layers"])
    return out


def _plain_norm_in(tensor: np.ndarray) -> dict:
    return {"scale": tensor}


def _plain_norm_out(node: dict) -> np.ndarray:
    return node["scale"]


def attention_from_hf(w: TrackedWeights, b: str, cfg: dict, norm_in=_plain_norm_in) -> dict:
    """Layer ``b``'s ``self_attn`` tensors as our attention params: the four projections
    split by head, Qwen2's q/k/v biases, the per-head q/k norms (read by ``norm_in``:
    Gemma's are ``1 + w``). Shared by every rotary decoder converter."""
    heads, kv_heads, head_dim = cfg["num_heads"], cfg["num_kv_heads"], cfg["head_dim"]
    d = cfg["d_model"]
    attention = {
        "query": {"kernel": w[f"{b}.self_attn.q_proj.weight"].T.reshape(d, heads, head_dim)},
        "key": {"kernel": w[f"{b}.self_attn.k_proj.weight"].T.reshape(d, kv_heads, head_dim)},
        "value": {"kernel": w[f"{b}.self_attn.v_proj.weight"].T.reshape(d, kv_heads, head_dim)},
        "out": {"kernel": w[f"{b}.self_attn.o_proj.weight"].T.reshape(heads, head_dim, d)},
    }
    if cfg.get("qkv_bias"):
        for name, proj, count in (("query", "q", heads), ("key", "k", kv_heads),
                                  ("value", "v", kv_heads)):
            attention[name]["bias"] = w[f"{b}.self_attn.{proj}_proj.bias"].reshape(
                count, head_dim)
    if cfg.get("qk_norm"):
        attention["query_norm"] = norm_in(w[f"{b}.self_attn.q_norm.weight"])
        attention["key_norm"] = norm_in(w[f"{b}.self_attn.k_norm.weight"])
    return attention


def attention_to_hf(att: dict, b: str, cfg: dict, norm_out=_plain_norm_out) -> dict:
    """The inverse of ``attention_from_hf``."""
    heads, head_dim, d = cfg["num_heads"], cfg["head_dim"], cfg["d_model"]
    kv_width = (cfg.get("num_kv_heads") or heads) * head_dim
    out = {
        f"{b}.self_attn.q_proj.weight": np.asarray(att["query"]["kernel"]).reshape(
            d, heads * head_dim).T,
        f"{b}.self_attn.k_proj.weight": np.asarray(att["key"]["kernel"]).reshape(d, kv_width).T,
        f"{b}.self_attn.v_proj.weight": np.asarray(att["value"]["kernel"]).reshape(
            d, kv_width).T,
        f"{b}.self_attn.o_proj.weight": np.asarray(att["out"]["kernel"]).reshape(
            heads * head_dim, d).T,
    }
    if cfg.get("qkv_bias"):
        for name, proj in (("query", "q"), ("key", "k"), ("value", "v")):
            out[f"{b}.self_attn.{proj}_proj.bias"] = np.asarray(att[name]["bias"]).reshape(-1)
    if cfg.get("qk_norm"):
        out[f"{b}.self_attn.q_norm.weight"] = norm_out(att["query_norm"])
        out[f"{b}.self_attn.k_norm.weight"] = norm_out(att["key_norm"])
    return out


def gated_mlp_from_hf(w: TrackedWeights, b: str, module: str = "mlp") -> dict:
    """``gate_proj`` (under the activation), ``up_proj`` and ``down_proj`` of layer ``b``'s
    ``module`` (Qwen2-MoE's shared expert is ``mlp.shared_expert``)."""
    return {"wi_0": {"kernel": w[f"{b}.{module}.gate_proj.weight"].T},
            "wi_1": {"kernel": w[f"{b}.{module}.up_proj.weight"].T},
            "wo": {"kernel": w[f"{b}.{module}.down_proj.weight"].T}}


def gated_mlp_to_hf(mlp: dict, b: str, module: str = "mlp") -> dict:
    return {f"{b}.{module}.gate_proj.weight": np.asarray(mlp["wi_0"]["kernel"]).T,
            f"{b}.{module}.up_proj.weight": np.asarray(mlp["wi_1"]["kernel"]).T,
            f"{b}.{module}.down_proj.weight": np.asarray(mlp["wo"]["kernel"]).T}


def params_from_hf(weights: dict[str, np.ndarray], cfg: dict) -> dict:
    w = TrackedWeights(weights)
    params = {"token_embedder": {"embedding": w["model.embed_tokens.weight"]},
              "final_norm": {"scale": w["model.norm.weight"]}}
    if not cfg["tie_embeddings"]:
        params["logits_dense"] = {"kernel": w["lm_head.weight"].T}
    for i in range(cfg["num_layers"]):
        b = f"model.layers.{i}"
        params[f"layers_{i}"] = {
            "pre_attention_norm": {"scale": w[f"{b}.input_layernorm.weight"]},
            "attention": attention_from_hf(w, b, cfg),
            "pre_mlp_norm": {"scale": w[f"{b}.post_attention_layernorm.weight"]},
            "mlp": gated_mlp_from_hf(w, b),
        }
    w.check_all_used(ignore=("lm_head.weight",) if cfg["tie_embeddings"] else (),
                     ignore_suffixes=(".rotary_emb.inv_freq",))
    return params


def params_to_hf(params: dict, cfg: dict) -> dict[str, np.ndarray]:
    out = {"model.embed_tokens.weight": params["token_embedder"]["embedding"],
           "model.norm.weight": params["final_norm"]["scale"]}
    if not cfg["tie_embeddings"]:
        out["lm_head.weight"] = np.asarray(params["logits_dense"]["kernel"]).T
    for i in range(cfg["num_layers"]):
        layer, b = params[f"layers_{i}"], f"model.layers.{i}"
        out.update(attention_to_hf(layer["attention"], b, cfg))
        out[f"{b}.input_layernorm.weight"] = layer["pre_attention_norm"]["scale"]
        out[f"{b}.post_attention_layernorm.weight"] = layer["pre_mlp_norm"]["scale"]
        out.update(gated_mlp_to_hf(layer["mlp"], b))
    return {k: np.ascontiguousarray(np.asarray(v), dtype=np.float32) for k, v in out.items()}
