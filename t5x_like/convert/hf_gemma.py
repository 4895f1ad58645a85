"""Hugging Face Gemma 2 / Gemma 3 (text) <-> t5x_like ``DecoderOnly`` with Gemma's switches.

Both: token embeddings scaled by sqrt(d_model), RMSNorm before and after each sublayer,
GeGLU with the tanh GELU, grouped-query attention scaled by ``query_pre_attn_scalar **
-0.5``, sliding and full layers alternating (``layer_types``), tied embeddings. Gemma 2
soft-caps the attention logits and the final logits; Gemma 3 normalises each head's
queries and keys instead, and rotates its sliding layers by a RoPE base of their own.

Gemma's RMSNorm multiplies by ``1 + weight``; ours by ``scale``: import adds the one,
export takes it off.
"""

from __future__ import annotations

import numpy as np

from t5x_like.convert import hf_gpt2, hf_llama, hf_rope
from t5x_like.convert.hf_t5 import TrackedWeights
from t5x_like.errors import UserError

_MODEL_TYPES = ("gemma2", "gemma3_text")
_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu", "gelu": "gelu_exact"}


def model_config_from_hf(hf: dict) -> dict:
    kind = hf.get("model_type")
    if kind not in _MODEL_TYPES:
        raise ValueError(f"Expected a Gemma 2 or Gemma 3 text config, got {kind!r}.")
    activation = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if activation not in _ACTIVATIONS:
        raise UserError(f"{kind} with hidden_activation {activation!r} does not convert; "
                        f"supported: {', '.join(_ACTIVATIONS)}.")
    for key in ("attention_bias", "use_bidirectional_attention"):
        if hf.get(key):
            raise UserError(f"{kind} with {key}=true does not convert; only the causal, "
                            "bias-free Gemma is supported.")
    d_model, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    layer_types, window = hf_rope.layer_types_from_hf(hf)
    rope = hf_rope.fields_from_hf(hf, "full_attention")
    local = 0.0
    if kind == "gemma3_text":
        sliding = hf_rope.rope_parameters(hf, "sliding_attention")
        if "sliding_attention" in (hf.get("rope_parameters") or {}):
            if sliding.get("rope_type", "default") != "default":
                raise UserError(f"Gemma 3's sliding layers with rope_type "
                                f"{sliding['rope_type']!r} do not convert; only their plain "
                                "RoPE (rope_type 'default') is built.")
            local = float(sliding.get("rope_theta", 10_000.0))
        else:  # transformers 4's layout
            local = float(hf.get("rope_local_base_freq", 10_000.0))
    return {
        "family": "decoder",
        "vocab_size": int(hf["vocab_size"]),
        "d_model": d_model,
        "num_heads": heads,
        "head_dim": int(hf.get("head_dim") or d_model // heads),
        "d_ff": int(hf["intermediate_size"]),
        "num_layers": int(hf["num_hidden_layers"]),
        "max_length": int(hf.get("max_position_embeddings", 8192)),
        "mlp_activations": (_ACTIVATIONS[activation], "linear"),
        "use_bias": False,
        "qk_norm": kind == "gemma3_text",
        "post_sublayer_norms": True,
        "scale_embeddings": True,
        "query_pre_attention_scalar": float(hf.get("query_pre_attn_scalar") or 0.0),
        "attention_logit_softcap": float(hf.get("attn_logit_softcapping") or 0.0),
        "final_logit_softcap": float(hf.get("final_logit_softcapping") or 0.0),
        "layer_norm_epsilon": float(hf.get("rms_norm_eps", 1e-6)),
        "norm": "rmsnorm",
        "position_embedding": "rotary",
        **rope,
        "local_rotary_max_wavelength": local,
        "num_kv_heads": int(hf.get("num_key_value_heads") or heads),
        "tie_embeddings": bool(hf.get("tie_word_embeddings", True)),
        "sliding_window": window,
        "layer_types": layer_types,
        "dropout_rate": 0.0,
        "dtype": "float32",
        "bos_id": hf_gpt2.start_id(hf),
    }


def hf_config_from_model_config(cfg: dict) -> dict:
    gemma = {"norm": "rmsnorm", "use_bias": False, "post_sublayer_norms": True,
             "scale_embeddings": True, "scan_layers": False}
    unlike = {key: cfg.get(key) for key, value in gemma.items()
              if cfg.get(key, False if key == "scan_layers" else None) != value}
    activation = tuple(cfg.get("mlp_activations", ()))
    names = {value: key for key, value in _ACTIVATIONS.items()}
    if len(activation) != 2 or activation[1] != "linear" or activation[0] not in names:
        unlike["mlp_activations"] = activation
    if unlike:
        raise UserError(f"This decoder has no Gemma equivalent ({unlike}); Gemma export needs "
                        "rmsnorm, no biases, sublayer output norms, scaled embeddings, a gated "
                        "GELU MLP and unscanned layers.")
    gemma3 = bool(cfg.get("qk_norm"))
    if gemma3 and (cfg.get("attention_logit_softcap") or cfg.get("final_logit_softcap")):
        raise UserError("A Gemma-style decoder with both q/k norms and logit soft-capping has "
                        "no Hugging Face equivalent (Gemma 3 has the norms, Gemma 2 the caps).")
    window = int(cfg.get("sliding_window") or 0)
    types = list(cfg.get("layer_types") or
                 [("sliding_attention" if window else "full_attention")] * cfg["num_layers"])
    rope = hf_rope.parameters_from_model_config(cfg)
    out = {
        "architectures": ["Gemma3ForCausalLM" if gemma3 else "Gemma2ForCausalLM"],
        "model_type": "gemma3_text" if gemma3 else "gemma2",
        "vocab_size": cfg["vocab_size"], "hidden_size": cfg["d_model"],
        "intermediate_size": cfg["d_ff"], "num_hidden_layers": cfg["num_layers"],
        "num_attention_heads": cfg["num_heads"],
        "num_key_value_heads": cfg.get("num_kv_heads") or cfg["num_heads"],
        "head_dim": cfg["head_dim"], "hidden_activation": names[activation[0]],
        "max_position_embeddings": cfg["max_length"], "rms_norm_eps": cfg["layer_norm_epsilon"],
        "query_pre_attn_scalar": _whole(cfg.get("query_pre_attention_scalar") or cfg["head_dim"]),
        "attn_logit_softcapping": cfg.get("attention_logit_softcap") or None,
        "final_logit_softcapping": cfg.get("final_logit_softcap") or None,
        "sliding_window": window or None, "layer_types": types,
        "tie_word_embeddings": cfg["tie_embeddings"], "attention_bias": False,
        "decoder_start_token_id": cfg.get("bos_id", 0),
        "rope_parameters": rope,
    }
    if gemma3:
        local = cfg.get("local_rotary_max_wavelength") or cfg["rotary_max_wavelength"]
        out["rope_parameters"] = {"full_attention": rope, "sliding_attention": {
            "rope_type": "default", "rope_theta": local}}
    return out


def _whole(value: float) -> int | float:
    """transformers types ``query_pre_attn_scalar`` as an int (256 for every Gemma)."""
    return int(value) if float(value).is_integer() else float(value)


def _norm_in(tensor: np.ndarray) -> dict:
    """Gemma's RMSNorm multiplies by ``1 + weight``."""
    return {"scale": tensor + np.float32(1.0)}


def _norm_out(node: dict) -> np.ndarray:
    return np.asarray(node["scale"]) - np.float32(1.0)


def params_from_hf(weights: dict[str, np.ndarray], cfg: dict) -> dict:
    w = TrackedWeights(weights)
    params = {"token_embedder": {"embedding": w["model.embed_tokens.weight"]},
              "final_norm": _norm_in(w["model.norm.weight"])}
    if not cfg["tie_embeddings"]:
        params["logits_dense"] = {"kernel": w["lm_head.weight"].T}
    for i in range(cfg["num_layers"]):
        b = f"model.layers.{i}"
        params[f"layers_{i}"] = {
            "pre_attention_norm": _norm_in(w[f"{b}.input_layernorm.weight"]),
            "attention": hf_llama.attention_from_hf(w, b, cfg, _norm_in),
            "post_attention_norm": _norm_in(w[f"{b}.post_attention_layernorm.weight"]),
            "pre_mlp_norm": _norm_in(w[f"{b}.pre_feedforward_layernorm.weight"]),
            "post_mlp_norm": _norm_in(w[f"{b}.post_feedforward_layernorm.weight"]),
            "mlp": hf_llama.gated_mlp_from_hf(w, b),
        }
    w.check_all_used(ignore=("lm_head.weight",) if cfg["tie_embeddings"] else (),
                     ignore_suffixes=(".rotary_emb.inv_freq",))
    return params


def params_to_hf(params: dict, cfg: dict) -> dict[str, np.ndarray]:
    out = {"model.embed_tokens.weight": params["token_embedder"]["embedding"],
           "model.norm.weight": _norm_out(params["final_norm"])}
    if not cfg["tie_embeddings"]:
        out["lm_head.weight"] = np.asarray(params["logits_dense"]["kernel"]).T
    for i in range(cfg["num_layers"]):
        layer, b = params[f"layers_{i}"], f"model.layers.{i}"
        out.update(hf_llama.attention_to_hf(layer["attention"], b, cfg, _norm_out))
        out[f"{b}.input_layernorm.weight"] = _norm_out(layer["pre_attention_norm"])
        out[f"{b}.post_attention_layernorm.weight"] = _norm_out(layer["post_attention_norm"])
        out[f"{b}.pre_feedforward_layernorm.weight"] = _norm_out(layer["pre_mlp_norm"])
        out[f"{b}.post_feedforward_layernorm.weight"] = _norm_out(layer["post_mlp_norm"])
        out.update(hf_llama.gated_mlp_to_hf(layer["mlp"], b))
    return {k: np.ascontiguousarray(np.asarray(v), dtype=np.float32) for k, v in out.items()}
