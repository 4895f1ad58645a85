"""Hugging Face Llama / Mistral <-> t5x_like ``DecoderOnly`` in its modern layout.

Rotary positions, RMSNorm, SwiGLU (``gate_proj`` = ``wi_0`` under SiLU, ``up_proj``
= ``wi_1``), no biases, grouped-query attention; Mistral adds a sliding window.
Torch ``Linear`` weights are ``[out, in]``; ours are ``[in, out]`` split by head.
"""

from __future__ import annotations

import numpy as np

from t5x_like.convert import hf_gpt2
from t5x_like.convert.hf_t5 import TrackedWeights
from t5x_like.errors import UserError

_MODEL_TYPES = ("llama", "mistral")


def _rope_theta(hf: dict) -> float:
    rope = hf.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" or hf.get("rope_scaling"):
        raise UserError(f"Only plain rotary positions are supported (rope_type 'default', no "
                        f"rope_scaling), got rope settings {rope} / rope_scaling "
                        f"{hf.get('rope_scaling')}; scaled or extended RoPE does not convert.")
    return float(rope.get("rope_theta", hf.get("rope_theta", 10_000.0)))


def model_config_from_hf(hf: dict) -> dict:
    if hf.get("model_type") not in _MODEL_TYPES:
        raise ValueError(f"Expected a Llama or Mistral config, got {hf.get('model_type')!r}.")
    if hf.get("hidden_act", "silu") != "silu":
        raise UserError(f"Only SwiGLU (hidden_act 'silu') is supported, got {hf['hidden_act']!r}.")
    biased = [key for key in ("attention_bias", "mlp_bias") if hf.get(key)]
    if biased:
        raise UserError(f"{hf['model_type'].capitalize()} with {' and '.join(biased)}=true does not "
                        "convert: only Llama/Mistral without biases (attention_bias and mlp_bias "
                        "false) is supported.")
    d_model, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
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
        "layer_norm_epsilon": float(hf.get("rms_norm_eps", 1e-6)),
        "norm": "rmsnorm",
        "position_embedding": "rotary",
        "rotary_max_wavelength": _rope_theta(hf),
        "num_kv_heads": int(hf.get("num_key_value_heads") or heads),
        "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "sliding_window": int(hf.get("sliding_window") or 0) if hf["model_type"] == "mistral" else 0,
        "dropout_rate": 0.0,
        "dtype": "float32",
        "bos_id": hf_gpt2.start_id(hf),
    }


def hf_config_from_model_config(cfg: dict) -> dict:
    activations = tuple(cfg.get("mlp_activations", ("gelu",)))
    unlike = {key: value for key, value, llama in (
        ("norm", cfg.get("norm", "layernorm"), "rmsnorm"),
        ("use_bias", cfg.get("use_bias", True), False),
        ("mlp_activations", activations, ("silu", "linear")),
        ("scan_layers", cfg.get("scan_layers", False), False)) if value != llama}
    if unlike:
        raise UserError(f"This rotary decoder has no Llama equivalent ({unlike}); Llama/Mistral "
                        "export needs rmsnorm, no biases, SwiGLU (mlp_activations ('silu', "
                        "'linear')) and unscanned layers.")
    mistral = bool(cfg.get("sliding_window"))
    out = {
        "architectures": ["MistralForCausalLM" if mistral else "LlamaForCausalLM"],
        "model_type": "mistral" if mistral else "llama",
        "vocab_size": cfg["vocab_size"], "hidden_size": cfg["d_model"],
        "intermediate_size": cfg["d_ff"], "num_hidden_layers": cfg["num_layers"],
        "num_attention_heads": cfg["num_heads"],
        "num_key_value_heads": cfg.get("num_kv_heads") or cfg["num_heads"],
        "head_dim": cfg["head_dim"], "hidden_act": "silu",
        "max_position_embeddings": cfg["max_length"], "rms_norm_eps": cfg["layer_norm_epsilon"],
        "rope_parameters": {"rope_theta": cfg["rotary_max_wavelength"], "rope_type": "default"},
        "tie_word_embeddings": cfg["tie_embeddings"], "attention_bias": False, "mlp_bias": False,
        "decoder_start_token_id": cfg.get("bos_id", 0),  # what the model's sequences start with
    }
    if mistral:
        out["sliding_window"] = cfg["sliding_window"]
    return out


def params_from_hf(weights: dict[str, np.ndarray], cfg: dict) -> dict:
    heads, kv_heads, head_dim = cfg["num_heads"], cfg["num_kv_heads"], cfg["head_dim"]
    d = cfg["d_model"]
    w = TrackedWeights(weights)
    params = {"token_embedder": {"embedding": w["model.embed_tokens.weight"]},
              "final_norm": {"scale": w["model.norm.weight"]}}
    if not cfg["tie_embeddings"]:
        params["logits_dense"] = {"kernel": w["lm_head.weight"].T}
    for i in range(cfg["num_layers"]):
        b = f"model.layers.{i}"
        attention = {
            "query": {"kernel": w[f"{b}.self_attn.q_proj.weight"].T.reshape(d, heads, head_dim)},
            "key": {"kernel": w[f"{b}.self_attn.k_proj.weight"].T.reshape(d, kv_heads, head_dim)},
            "value": {"kernel": w[f"{b}.self_attn.v_proj.weight"].T.reshape(d, kv_heads, head_dim)},
            "out": {"kernel": w[f"{b}.self_attn.o_proj.weight"].T.reshape(heads, head_dim, d)},
        }
        params[f"layers_{i}"] = {
            "pre_attention_norm": {"scale": w[f"{b}.input_layernorm.weight"]},
            "attention": attention,
            "pre_mlp_norm": {"scale": w[f"{b}.post_attention_layernorm.weight"]},
            "mlp": {"wi_0": {"kernel": w[f"{b}.mlp.gate_proj.weight"].T},
                    "wi_1": {"kernel": w[f"{b}.mlp.up_proj.weight"].T},
                    "wo": {"kernel": w[f"{b}.mlp.down_proj.weight"].T}},
        }
    w.check_all_used(ignore=("lm_head.weight",) if cfg["tie_embeddings"] else (),
                     ignore_suffixes=(".rotary_emb.inv_freq",))
    return params


def params_to_hf(params: dict, cfg: dict) -> dict[str, np.ndarray]:
    heads, head_dim, d = cfg["num_heads"], cfg["head_dim"], cfg["d_model"]
    kv_width = (cfg.get("num_kv_heads") or heads) * head_dim
    out = {"model.embed_tokens.weight": params["token_embedder"]["embedding"],
           "model.norm.weight": params["final_norm"]["scale"]}
    if not cfg["tie_embeddings"]:
        out["lm_head.weight"] = np.asarray(params["logits_dense"]["kernel"]).T
    for i in range(cfg["num_layers"]):
        layer, b = params[f"layers_{i}"], f"model.layers.{i}"
        att = layer["attention"]
        out[f"{b}.self_attn.q_proj.weight"] = np.asarray(att["query"]["kernel"]).reshape(
            d, heads * head_dim).T
        out[f"{b}.self_attn.k_proj.weight"] = np.asarray(att["key"]["kernel"]).reshape(
            d, kv_width).T
        out[f"{b}.self_attn.v_proj.weight"] = np.asarray(att["value"]["kernel"]).reshape(
            d, kv_width).T
        out[f"{b}.self_attn.o_proj.weight"] = np.asarray(att["out"]["kernel"]).reshape(
            heads * head_dim, d).T
        out[f"{b}.input_layernorm.weight"] = layer["pre_attention_norm"]["scale"]
        out[f"{b}.post_attention_layernorm.weight"] = layer["pre_mlp_norm"]["scale"]
        out[f"{b}.mlp.gate_proj.weight"] = np.asarray(layer["mlp"]["wi_0"]["kernel"]).T
        out[f"{b}.mlp.up_proj.weight"] = np.asarray(layer["mlp"]["wi_1"]["kernel"]).T
        out[f"{b}.mlp.down_proj.weight"] = np.asarray(layer["mlp"]["wo"]["kernel"]).T
    return {k: np.ascontiguousarray(np.asarray(v), dtype=np.float32) for k, v in out.items()}
