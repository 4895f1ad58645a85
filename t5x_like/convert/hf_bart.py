"""Hugging Face BART (``BartForConditionalGeneration``) <-> t5x_like ``BartEncoderDecoder``.

One shared token embedding (also the output projection) plus ``final_logits_bias``;
learned positions per stack with fairseq's offset of 2 rows; post-norm blocks.
"""

from __future__ import annotations

import numpy as np

from t5x_like.convert.hf_bert import (
    _norm_in,
    attention_from_hf,
    attention_to_hf,
    layer_from_hf,
    layer_to_hf,
    put_out,
)
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


# Where a BART block keeps its tensors below its prefix, in hf_bert's layer names; a
# decoder block's cross-attention sits under ``encoder_attn`` alike.
BART_LAYER = {"query": "self_attn.q_proj", "key": "self_attn.k_proj",
              "value": "self_attn.v_proj", "out": "self_attn.out_proj",
              "attention_norm": "self_attn_layer_norm", "wi": "fc1", "wo": "fc2",
              "mlp_norm": "final_layer_norm"}
CROSS_ATTENTION = {name: value.replace("self_attn", "encoder_attn")
                   for name, value in BART_LAYER.items() if value.startswith("self_attn.")}


def params_from_hf(weights: dict[str, np.ndarray], cfg: dict) -> dict:
    heads, head_dim, d = cfg["num_heads"], cfg["head_dim"], cfg["d_model"]
    w = TrackedWeights(weights)
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
    for i in range(cfg["num_encoder_layers"]):  # a BERT block's params under BART's names
        params["encoder"][f"layers_{i}"] = layer_from_hf(
            w, f"model.encoder.layers.{i}", heads, head_dim, d, BART_LAYER)
    for i in range(cfg["num_decoder_layers"]):
        b = f"model.decoder.layers.{i}"
        block = layer_from_hf(w, b, heads, head_dim, d, BART_LAYER)
        params["decoder"][f"layers_{i}"] = {
            "self_attention": block["attention"],
            "self_attention_norm": block["attention_norm"],
            "encoder_decoder_attention": attention_from_hf(w, b, heads, head_dim, d,
                                                           CROSS_ATTENTION),
            "cross_attention_norm": _norm_in(w, f"{b}.encoder_attn_layer_norm"),
            "mlp": block["mlp"], "mlp_norm": block["mlp_norm"]}
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
    d = cfg["d_model"]
    for i in range(cfg["num_encoder_layers"]):  # a BERT block's params under BART's names
        out.update(layer_to_hf(params["encoder"][f"layers_{i}"], f"model.encoder.layers.{i}",
                               d, BART_LAYER))
    for i in range(cfg["num_decoder_layers"]):
        layer, b = params["decoder"][f"layers_{i}"], f"model.decoder.layers.{i}"
        block = {"attention": layer["self_attention"],
                 "attention_norm": layer["self_attention_norm"], "mlp": layer["mlp"],
                 "mlp_norm": layer["mlp_norm"]}
        out.update(layer_to_hf(block, b, d, BART_LAYER))
        out.update(attention_to_hf(layer["encoder_decoder_attention"], b, d, CROSS_ATTENTION))
        put_out(out, f"{b}.encoder_attn_layer_norm", layer["cross_attention_norm"])
    for ours, theirs in FINAL_NORMS.items():
        if ours in params:
            put_out(out, theirs, params[ours])
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}
