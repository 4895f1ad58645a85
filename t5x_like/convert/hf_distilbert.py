"""Hugging Face DistilBERT (``DistilBertForMaskedLM``) <-> t5x_like ``EncoderOnly``.

DistilBERT is BERT's post-LayerNorm encoder without token types, pooler or
next-sentence head. Here it is an encoder with ``type_vocab_size = 1`` whose one
token-type row is zero on import; export folds that row into the position
embeddings (every token adds both), so any such encoder exports exactly.
"""

from __future__ import annotations

import functools

import numpy as np

from t5x_like.convert import hf_bert
from t5x_like.convert.hf_t5 import TrackedWeights
from t5x_like.errors import UserError

# A block's tensors below its prefix (hf_bert.BERT_LAYER's keys).
_LAYER = {"query": "attention.q_lin", "key": "attention.k_lin", "value": "attention.v_lin",
          "out": "attention.out_lin", "attention_norm": "sa_layer_norm", "wi": "ffn.lin1",
          "wo": "ffn.lin2", "mlp_norm": "output_layer_norm"}


def model_config_from_hf(hf: dict) -> dict:
    if hf.get("model_type") != "distilbert":
        raise ValueError(f"Expected model_type 'distilbert', got {hf.get('model_type')!r}.")
    activation = hf.get("activation", "gelu")
    if activation not in ("gelu", "relu"):
        raise UserError(f"DistilBERT activation {activation!r} does not convert; supported: "
                        "gelu, relu.")
    d_model, heads = int(hf["dim"]), int(hf["n_heads"])
    return {"family": "encoder", "vocab_size": int(hf["vocab_size"]), "d_model": d_model,
            "num_heads": heads, "head_dim": d_model // heads, "d_ff": int(hf["hidden_dim"]),
            "num_layers": int(hf["n_layers"]),
            "max_length": int(hf["max_position_embeddings"]), "type_vocab_size": 1,
            "mlp_activations": ("gelu_exact" if activation == "gelu" else "relu",),
            "layer_norm_epsilon": 1e-12, "pad_id": int(hf.get("pad_token_id", 0) or 0),
            "position_offset": 0, "next_sentence_head": False, "dropout_rate": 0.0,
            "dtype": "float32"}


def hf_config_from_model_config(cfg: dict) -> dict:
    if (cfg.get("type_vocab_size") != 1 or cfg.get("next_sentence_head", True)
            or cfg.get("position_offset", 0) or cfg.get("embedding_dim")
            or cfg.get("share_layers") or cfg.get("span_boundary_head")
            or cfg.get("attention_window") or cfg["num_heads"] * cfg["head_dim"] != cfg["d_model"]
            or float(cfg.get("layer_norm_epsilon", 1e-12)) != 1e-12):
        raise UserError("Only DistilBERT-layout encoders export as DistilBERT: one token "
                        "type, no next-sentence head, positions from 0, no factorized or "
                        "shared layers, heads x head_dim = d_model, LayerNorm epsilon 1e-12.")
    activation = tuple(cfg["mlp_activations"])[0]
    return {"architectures": ["DistilBertForMaskedLM"], "model_type": "distilbert",
            "vocab_size": cfg["vocab_size"], "dim": cfg["d_model"], "n_heads": cfg["num_heads"],
            "n_layers": cfg["num_layers"], "hidden_dim": cfg["d_ff"],
            "max_position_embeddings": cfg["max_length"], "sinusoidal_pos_embds": False,
            "activation": "gelu" if activation == "gelu_exact" else activation,
            "pad_token_id": cfg["pad_id"], "dropout": 0.0, "attention_dropout": 0.0,
            "tie_word_embeddings": True}


def params_from_hf(weights: dict[str, np.ndarray], cfg: dict) -> dict:
    w = TrackedWeights(weights)
    heads, head_dim, d = cfg["num_heads"], cfg["head_dim"], cfg["d_model"]
    e = "distilbert.embeddings"
    params = {
        "token_embedder": {"embedding": w[f"{e}.word_embeddings.weight"]},
        "position_embedder": {"embedding": w[f"{e}.position_embeddings.weight"]},
        "token_type_embedder": {"embedding": np.zeros((1, d), np.float32)},
        "embedding_norm": hf_bert._norm_in(w, f"{e}.LayerNorm"),
        "mlm_transform": hf_bert._linear_in(w, "vocab_transform"),
        "mlm_norm": hf_bert._norm_in(w, "vocab_layer_norm"),
        "mlm_bias": w["vocab_projector.bias"],
    }
    for i in range(cfg["num_layers"]):
        params[f"layers_{i}"] = hf_bert.layer_from_hf(w, f"distilbert.transformer.layer.{i}",
                                                      heads, head_dim, d, _LAYER)
    w.check_all_used(ignore=("vocab_projector.weight",), ignore_suffixes=("position_ids",))
    return params


def params_to_hf(params: dict, cfg: dict) -> dict[str, np.ndarray]:
    arr = np.asarray
    d = cfg["d_model"]
    out = {}
    put = functools.partial(hf_bert.put_out, out)
    e = "distilbert.embeddings"
    out[f"{e}.word_embeddings.weight"] = arr(params["token_embedder"]["embedding"])
    # The one token-type row is added to every token, as the position row is: fold it in.
    out[f"{e}.position_embeddings.weight"] = (arr(params["position_embedder"]["embedding"])
                                              + arr(params["token_type_embedder"]["embedding"])[0])
    put(f"{e}.LayerNorm", params["embedding_norm"])
    put("vocab_transform", params["mlm_transform"])
    put("vocab_layer_norm", params["mlm_norm"])
    # vocab_projector.weight is the word embedding: transformers ties it on load.
    out["vocab_projector.bias"] = arr(params["mlm_bias"])
    for i in range(cfg["num_layers"]):
        out.update(hf_bert.layer_to_hf(params[f"layers_{i}"], f"distilbert.transformer.layer.{i}",
                                       d, _LAYER))
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}
