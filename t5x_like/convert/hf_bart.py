"""Hugging Face BART (``BartForConditionalGeneration``) <-> t5x_like ``BartEncoderDecoder``.

One shared token embedding (also the output projection) plus ``final_logits_bias``;
learned positions per stack with fairseq's offset of 2 rows; post-norm blocks.
"""

from __future__ import annotations

import numpy as np

from t5x_like.convert.hf_bert import _linear_in, _norm_in, put_out
from t5x_like.convert.hf_gpt2 import _ACTIVATION, _ACTIVATION_BACK
from t5x_like.convert.hf_t5 import TrackedWeights
from t5x_like.errors import UserError


def model_config_from_hf(hf: dict) -> dict:
    if hf.get("model_type") != "bart":
        raise ValueError(f"Expected model_type 'bart', got {hf.get('model_type')!r}.")
    act = hf.get("activation_function", "gelu")
    if act not in _ACTIVATION:
        raise UserError(f"BART activation_function {act!r} does not convert; supported: "
                        f"{', '.join(sorted(_ACTIVATION))}.")
    heads = int(hf["encoder_attention_heads"])
    if int(hf["decoder_attention_heads"]) != heads or hf["encoder_ffn_dim"] != hf["decoder_ffn_dim"]:
        raise UserError("BART with different encoder and decoder head counts or MLP widths "
                        "does not convert: only BART whose encoder_attention_heads and "
                        "encoder_ffn_dim equal decoder_attention_heads and decoder_ffn_dim is "
                        "supported.")
    if hf.get("normalize_before") or hf.get("add_final_layer_norm"):
        raise UserError("Only BART's post-norm layout is supported (not mBART's pre-norm: "
                        "normalize_before / add_final_layer_norm false); a pre-norm model with "
                        "model_type 'mbart' imports as mBART.")
    d_model = int(hf["d_model"])
    return {
        "family": "bart",
        "vocab_size": int(hf["vocab_size"]),
        "d_model": d_model,
        "num_heads": heads,
        "head_dim": d_model // heads,
        "d_ff": int(hf["encoder_ffn_dim"]),
        "num_encoder_layers": int(hf["encoder_layers"]),
        "num_decoder_layers": int(hf["decoder_layers"]),
        "max_length": int(hf["max_position_embeddings"]),
        "mlp_activations": (_ACTIVATION[act],),
        "layer_norm_epsilon": 1e-5,  # fixed in BART's code, not in its config
        "scale_embedding": bool(hf.get("scale_embedding", False)),
        "pad_id": int(hf.get("pad_token_id", 1)),
        "eos_id": int(hf.get("eos_token_id", 2)),
        "decoder_start_id": int(hf.get("decoder_start_token_id", 2)),
        "dropout_rate": 0.0,
        "dtype": "float32",
    }


def _attention_in(w, prefix: str, heads: int, head_dim: int, d: int) -> dict:
    out = {ours: {"kernel": w[f"{prefix}.{theirs}.weight"].T.reshape(d, heads, head_dim),
                  "bias": w[f"{prefix}.{theirs}.bias"].reshape(heads, head_dim)}
           for ours, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj"))}
    out["out"] = {"kernel": w[f"{prefix}.out_proj.weight"].T.reshape(heads, head_dim, d),
                  "bias": w[f"{prefix}.out_proj.bias"]}
    return out


def params_from_hf(weights: dict[str, np.ndarray], cfg: dict) -> dict:
    heads, head_dim, d = cfg["num_heads"], cfg["head_dim"], cfg["d_model"]
    w = TrackedWeights(weights)
    attention = lambda prefix: _attention_in(w, prefix, heads, head_dim, d)  # noqa: E731
    mlp = lambda b: {"wi": _linear_in(w, f"{b}.fc1"), "wo": _linear_in(w, f"{b}.fc2")}  # noqa: E731
    shared = "model.shared.weight" if "model.shared.weight" in weights else "model.encoder.embed_tokens.weight"
    params = {
        "token_embedder": {"embedding": w[shared]},
        "encoder_positions": {"embedding": w["model.encoder.embed_positions.weight"]},
        "decoder_positions": {"embedding": w["model.decoder.embed_positions.weight"]},
        "encoder_embedding_norm": _norm_in(w, "model.encoder.layernorm_embedding"),
        "decoder_embedding_norm": _norm_in(w, "model.decoder.layernorm_embedding"),
        "final_logits_bias": w["final_logits_bias"].reshape(-1),
        "encoder": {}, "decoder": {},
    }
    for i in range(cfg["num_encoder_layers"]):
        b = f"model.encoder.layers.{i}"
        params["encoder"][f"layers_{i}"] = {
            "attention": attention(f"{b}.self_attn"),
            "attention_norm": _norm_in(w, f"{b}.self_attn_layer_norm"),
            "mlp": mlp(b), "mlp_norm": _norm_in(w, f"{b}.final_layer_norm")}
    for i in range(cfg["num_decoder_layers"]):
        b = f"model.decoder.layers.{i}"
        params["decoder"][f"layers_{i}"] = {
            "self_attention": attention(f"{b}.self_attn"),
            "self_attention_norm": _norm_in(w, f"{b}.self_attn_layer_norm"),
            "encoder_decoder_attention": attention(f"{b}.encoder_attn"),
            "cross_attention_norm": _norm_in(w, f"{b}.encoder_attn_layer_norm"),
            "mlp": mlp(b), "mlp_norm": _norm_in(w, f"{b}.final_layer_norm")}
    # Both stacks' embed_tokens and lm_head are the shared embedding (tied).
    w.check_all_used(ignore=("model.shared.weight", "model.encoder.embed_tokens.weight",
                             "model.decoder.embed_tokens.weight", "lm_head.weight"))
    return params


# -- export ---------------------------------------------------------------------------------

#: the stack-final LayerNorms an mBART (pre-norm) model adds to BART's tensors
FINAL_NORMS = {"encoder_final_norm": "model.encoder.layer_norm",
               "decoder_final_norm": "model.decoder.layer_norm"}


def hf_config_from_model_config(cfg: dict) -> dict:
    """BART's config (post-norm), or mBART's for a pre-norm model with final norms: the
    two layouts Hugging Face has for this family; the special ids are the model's own
    (``export_hf`` sets the tokenizer's bos/eos/pad over them)."""
    pre_norm = bool(cfg.get("pre_norm"))
    if pre_norm != bool(cfg.get("final_layer_norm")):
        raise UserError("A BART-family model with pre_norm but no final_layer_norm (or the "
                        "reverse) has no Hugging Face layout; BART is post-norm without, mBART "
                        "pre-norm with stack-final norms.")
    if cfg.get("scan_layers"):
        raise UserError("A BART model with scanned layers (model.numerics.scan_layers) does "
                        "not export yet; export a run trained unscanned.")
    activations = tuple(cfg["mlp_activations"])
    if len(activations) != 1 or activations[0] not in _ACTIVATION_BACK:
        raise UserError(f"A BART model with mlp_activations={activations} does not export: "
                        "Hugging Face BART has one activation of "
                        f"{', '.join(sorted(_ACTIVATION_BACK))}.")
    model_type = "mbart" if pre_norm else "bart"
    return {
        "architectures": ["MBartForConditionalGeneration" if pre_norm
                          else "BartForConditionalGeneration"],
        "model_type": model_type, "vocab_size": cfg["vocab_size"], "d_model": cfg["d_model"],
        "encoder_layers": cfg["num_encoder_layers"], "decoder_layers": cfg["num_decoder_layers"],
        "encoder_attention_heads": cfg["num_heads"], "decoder_attention_heads": cfg["num_heads"],
        "encoder_ffn_dim": cfg["d_ff"], "decoder_ffn_dim": cfg["d_ff"],
        "activation_function": _ACTIVATION_BACK[activations[0]],
        "max_position_embeddings": cfg["max_length"],
        "scale_embedding": bool(cfg.get("scale_embedding")),
        "normalize_before": pre_norm, "add_final_layer_norm": pre_norm,
        "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0,
        "is_encoder_decoder": True, "tie_word_embeddings": True,
        "pad_token_id": cfg["pad_id"], "eos_token_id": cfg["eos_id"],
        "bos_token_id": cfg["decoder_start_id"], "forced_eos_token_id": cfg["eos_id"],
        "decoder_start_token_id": cfg["decoder_start_id"],
    }


def _attention_out(params: dict, prefix: str) -> dict[str, np.ndarray]:
    """:func:`_attention_in` backwards: per-head kernels and biases as Linear layers."""
    out = {}
    for ours, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
        kernel = np.asarray(params[ours]["kernel"])
        out[f"{prefix}.{theirs}.weight"] = kernel.reshape(kernel.shape[0], -1).T
        out[f"{prefix}.{theirs}.bias"] = np.asarray(params[ours]["bias"]).reshape(-1)
    kernel = np.asarray(params["out"]["kernel"])
    out[f"{prefix}.out_proj.weight"] = kernel.reshape(-1, kernel.shape[-1]).T
    out[f"{prefix}.out_proj.bias"] = np.asarray(params["out"]["bias"])
    return out


def params_to_hf(params: dict, cfg: dict) -> dict[str, np.ndarray]:
    """:func:`params_from_hf` backwards (and mBART's stack-final norms where the model has
    them); the shared embedding is written once per name Hugging Face ties to it."""
    out: dict[str, np.ndarray] = {}
    embedding = np.asarray(params["token_embedder"]["embedding"])
    for name in ("model.shared.weight", "model.encoder.embed_tokens.weight",
                 "model.decoder.embed_tokens.weight", "lm_head.weight"):
        out[name] = embedding
    out["model.encoder.embed_positions.weight"] = np.asarray(
        params["encoder_positions"]["embedding"])
    out["model.decoder.embed_positions.weight"] = np.asarray(
        params["decoder_positions"]["embedding"])
    put_out(out, "model.encoder.layernorm_embedding", params["encoder_embedding_norm"])
    put_out(out, "model.decoder.layernorm_embedding", params["decoder_embedding_norm"])
    out["final_logits_bias"] = np.asarray(params["final_logits_bias"]).reshape(1, -1)
    for i in range(cfg["num_encoder_layers"]):
        layer, b = params["encoder"][f"layers_{i}"], f"model.encoder.layers.{i}"
        out.update(_attention_out(layer["attention"], f"{b}.self_attn"))
        put_out(out, f"{b}.self_attn_layer_norm", layer["attention_norm"])
        put_out(out, f"{b}.fc1", layer["mlp"]["wi"])
        put_out(out, f"{b}.fc2", layer["mlp"]["wo"])
        put_out(out, f"{b}.final_layer_norm", layer["mlp_norm"])
    for i in range(cfg["num_decoder_layers"]):
        layer, b = params["decoder"][f"layers_{i}"], f"model.decoder.layers.{i}"
        out.update(_attention_out(layer["self_attention"], f"{b}.self_attn"))
        put_out(out, f"{b}.self_attn_layer_norm", layer["self_attention_norm"])
        out.update(_attention_out(layer["encoder_decoder_attention"], f"{b}.encoder_attn"))
        put_out(out, f"{b}.encoder_attn_layer_norm", layer["cross_attention_norm"])
        put_out(out, f"{b}.fc1", layer["mlp"]["wi"])
        put_out(out, f"{b}.fc2", layer["mlp"]["wo"])
        put_out(out, f"{b}.final_layer_norm", layer["mlp_norm"])
    for ours, theirs in FINAL_NORMS.items():
        if ours in params:
            put_out(out, theirs, params[ours])
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}
