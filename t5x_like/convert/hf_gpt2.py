"""Hugging Face GPT-2 <-> t5x_like ``DecoderOnly`` parameters.

GPT-2 stores its projections as ``Conv1D`` weights, already ``[in, out]``, with
query, key and value fused into one ``c_attn`` matrix of width ``3 * d_model``.
"""

from __future__ import annotations

import numpy as np

from t5x_like.convert.hf_t5 import TrackedWeights
from t5x_like.errors import UserError

_ACTIVATION = {"gelu_new": "gelu", "gelu": "gelu_exact", "relu": "relu", "silu": "silu",
               "gelu_pytorch_tanh": "gelu"}
_ACTIVATION_BACK = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu", "silu": "silu"}


def model_config_from_hf(hf: dict) -> dict:
    if hf.get("model_type") != "gpt2":
        raise ValueError(f"Expected a GPT-2 config (model_type gpt2), got {hf.get('model_type')!r}.")
    act = hf.get("activation_function", "gelu_new")
    if act not in _ACTIVATION:
        raise UserError(f"GPT-2 activation_function {act!r} does not convert; supported: "
                        f"{', '.join(sorted(_ACTIVATION))}.")
    if hf.get("scale_attn_by_inverse_layer_idx"):
        raise UserError("GPT-2 with scale_attn_by_inverse_layer_idx=true (attention scaled by "
                        "1/layer as well) does not convert: only GPT-2 without "
                        "scale_attn_by_inverse_layer_idx, with the standard 1/sqrt(head_dim) "
                        "scaling, is supported.")
    if not hf.get("scale_attn_weights", True):
        raise UserError("GPT-2 with scale_attn_weights=false (unscaled attention) does not "
                        "convert: only GPT-2 with the standard 1/sqrt(head_dim) scaling "
                        "(scale_attn_weights true) is supported.")
    d_model, heads = int(hf["n_embd"]), int(hf["n_head"])
    return {
        "family": "decoder",
        "vocab_size": int(hf["vocab_size"]),
        "d_model": d_model,
        "num_heads": heads,
        "head_dim": d_model // heads,
        "d_ff": int(hf.get("n_inner") or 4 * d_model),
        "num_layers": int(hf["n_layer"]),
        "max_length": int(hf["n_positions"]),
        "mlp_activations": (_ACTIVATION[act],),
        "use_bias": True,
        "layer_norm_epsilon": float(hf.get("layer_norm_epsilon", 1e-5)),
        "dropout_rate": 0.0,
        "dtype": "float32",
        "bos_id": start_id(hf),
    }


def start_id(hf: dict) -> int:
    """The id a causal LM's sequences start with: ``decoder_start_token_id`` where our
    export wrote it (this framework's runs start with 0), else the BOS (GPT-2's
    <|endoftext|>, Llama's <s>), which is what the model read first in pretraining."""
    value = hf.get("decoder_start_token_id")
    return int(value if value is not None else hf.get("bos_token_id") or 0)


def hf_config_from_model_config(cfg: dict) -> dict:
    modern = {key: cfg.get(key) for key, gpt2 in (("norm", "layernorm"), ("tie_embeddings", True),
                                                  ("sliding_window", 0), ("scan_layers", False))
              if cfg.get(key, gpt2) != gpt2}
    if cfg.get("num_kv_heads") not in (None, 0, cfg["num_heads"]):
        modern["num_kv_heads"] = cfg["num_kv_heads"]
    activations = tuple(cfg.get("mlp_activations", ("gelu",)))
    if len(activations) != 1:
        modern["mlp_activations"] = activations
    if not cfg.get("use_bias", True):
        modern["use_bias"] = False
    if modern:
        raise UserError(f"This decoder has no GPT-2 equivalent ({modern}); export it with "
                        "rotary positions as Llama, or use GPT-2's settings (layernorm, biases, "
                        "one ungated activation, tied embeddings, full attention, unscanned "
                        "layers, as many kv heads as heads).")
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg["vocab_size"], "n_embd": cfg["d_model"], "n_head": cfg["num_heads"],
        "n_layer": cfg["num_layers"], "n_positions": cfg["max_length"], "n_inner": cfg["d_ff"],
        "activation_function": _ACTIVATION_BACK[tuple(cfg["mlp_activations"])[0]],
        "layer_norm_epsilon": cfg["layer_norm_epsilon"], "resid_pdrop": 0.0, "embd_pdrop": 0.0,
        "attn_pdrop": 0.0, "tie_word_embeddings": True,
        # GPT-2's <|endoftext|> is the last id (50256 in the released vocabulary).
        "bos_token_id": cfg["vocab_size"] - 1, "eos_token_id": cfg["vocab_size"] - 1,
        "decoder_start_token_id": cfg.get("bos_id", 0),  # what the model's sequences start with
    }


def _norm(w, name):
    return {"scale": w[f"{name}.weight"], "bias": w[f"{name}.bias"]}


def params_from_hf(weights: dict[str, np.ndarray], cfg: dict) -> dict:
    heads, head_dim, d = cfg["num_heads"], cfg["head_dim"], cfg["d_model"]
    prefix = "transformer." if "transformer.wte.weight" in weights else ""
    w = TrackedWeights(weights)
    params = {
        "token_embedder": {"embedding": w[f"{prefix}wte.weight"]},
        "position_embedder": {"embedding": w[f"{prefix}wpe.weight"]},
        "final_norm": _norm(w, f"{prefix}ln_f"),
    }
    for i in range(cfg["num_layers"]):
        b = f"{prefix}h.{i}"
        qkv_w, qkv_b = w[f"{b}.attn.c_attn.weight"], w[f"{b}.attn.c_attn.bias"]
        attention = {}
        for j, name in enumerate(("query", "key", "value")):
            attention[name] = {"kernel": qkv_w[:, j * d:(j + 1) * d].reshape(d, heads, head_dim),
                               "bias": qkv_b[j * d:(j + 1) * d].reshape(heads, head_dim)}
        attention["out"] = {"kernel": w[f"{b}.attn.c_proj.weight"].reshape(heads, head_dim, d),
                            "bias": w[f"{b}.attn.c_proj.bias"]}
        params[f"layers_{i}"] = {
            "pre_attention_norm": _norm(w, f"{b}.ln_1"),
            "attention": attention,
            "pre_mlp_norm": _norm(w, f"{b}.ln_2"),
            "mlp": {"wi": {"kernel": w[f"{b}.mlp.c_fc.weight"], "bias": w[f"{b}.mlp.c_fc.bias"]},
                    "wo": {"kernel": w[f"{b}.mlp.c_proj.weight"], "bias": w[f"{b}.mlp.c_proj.bias"]}},
        }
    # lm_head is the token embedding (tied); attention masks are buffers, not weights.
    w.check_all_used(ignore=("lm_head.weight",), ignore_suffixes=(".attn.bias", ".attn.masked_bias"))
    return params


def params_to_hf(params: dict, cfg: dict) -> dict[str, np.ndarray]:
    p = {k: v for k, v in params.items()}
    out = {"transformer.wte.weight": p["token_embedder"]["embedding"],
           "transformer.wpe.weight": p["position_embedder"]["embedding"],
           "transformer.ln_f.weight": p["final_norm"]["scale"],
           "transformer.ln_f.bias": p["final_norm"]["bias"]}
    d = cfg["d_model"]
    for i in range(cfg["num_layers"]):
        layer, b = p[f"layers_{i}"], f"transformer.h.{i}"
        att = layer["attention"]
        out[f"{b}.attn.c_attn.weight"] = np.concatenate(
            [np.asarray(att[n]["kernel"]).reshape(d, d) for n in ("query", "key", "value")], axis=1)
        out[f"{b}.attn.c_attn.bias"] = np.concatenate(
            [np.asarray(att[n]["bias"]).reshape(d) for n in ("query", "key", "value")])
        out[f"{b}.attn.c_proj.weight"] = np.asarray(att["out"]["kernel"]).reshape(d, d)
        out[f"{b}.attn.c_proj.bias"] = att["out"]["bias"]
        for ours, theirs in (("pre_attention_norm", "ln_1"), ("pre_mlp_norm", "ln_2")):
            out[f"{b}.{theirs}.weight"] = layer[ours]["scale"]
            out[f"{b}.{theirs}.bias"] = layer[ours]["bias"]
        out[f"{b}.mlp.c_fc.weight"] = layer["mlp"]["wi"]["kernel"]
        out[f"{b}.mlp.c_fc.bias"] = layer["mlp"]["wi"]["bias"]
        out[f"{b}.mlp.c_proj.weight"] = layer["mlp"]["wo"]["kernel"]
        out[f"{b}.mlp.c_proj.bias"] = layer["mlp"]["wo"]["bias"]
    return {k: np.ascontiguousarray(np.asarray(v), dtype=np.float32) for k, v in out.items()}
