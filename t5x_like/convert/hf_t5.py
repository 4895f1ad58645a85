"""Hugging Face T5 (v1.0, v1.1, mT5) <-> t5x_like ``EncoderDecoder`` parameters.

Hugging Face stores ``nn.Linear`` weights as ``[out, in]`` with heads flattened;
ours are ``[in, heads, head_dim]`` (and ``[heads, head_dim, out]`` for the
attention output), so every matrix is transposed and reshaped.
"""

from __future__ import annotations

import numpy as np

from t5x_like.errors import UserError

# Hugging Face activation names -> ours.
_ACTIVATION = {"relu": "relu", "gelu_new": "gelu", "gelu": "gelu_exact", "silu": "silu",
               "gelu_pytorch_tanh": "gelu"}
_ACTIVATION_BACK = {"relu": "relu", "gelu": "gelu_new", "gelu_exact": "gelu", "silu": "silu"}


def model_config_from_hf(hf: dict) -> dict:
    """Our ``model`` config section for a Hugging Face T5 ``config.json``."""
    if hf.get("model_type") not in ("t5", "mt5"):
        raise ValueError(f"Expected a T5 config (model_type t5 or mt5), got {hf.get('model_type')!r}.")
    proj = hf.get("feed_forward_proj", "relu")
    parts = proj.split("-")
    gated = parts[0] == "gated"
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]
    if act not in _ACTIVATION:
        raise UserError(f"T5 feed_forward_proj {proj!r} does not convert; supported: "
                        f"{', '.join(sorted(_ACTIVATION))}, each also as gated-<act>.")
    # v1.0 multiplies decoder outputs by d_model**-0.5 and projects with the shared
    # embedding; v1.1 and mT5 do neither (older configs say so via tie_word_embeddings).
    scaled = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True))
    return {
        "family": "encoder_decoder",
        "vocab_size": int(hf["vocab_size"]),
        "d_model": int(hf["d_model"]),
        "num_heads": int(hf["num_heads"]),
        "head_dim": int(hf["d_kv"]),
        "d_ff": int(hf["d_ff"]),
        "num_encoder_layers": int(hf["num_layers"]),
        "num_decoder_layers": int(hf.get("num_decoder_layers") or hf["num_layers"]),
        "dropout_rate": 0.0,
        "mlp_activations": (_ACTIVATION[act], "linear") if gated else (_ACTIVATION[act],),
        "logits_via_embedding": bool(scaled),
        "relative_attention_num_buckets": int(hf.get("relative_attention_num_buckets", 32)),
        "relative_attention_max_distance": int(hf.get("relative_attention_max_distance", 128)),
        "layer_norm_epsilon": float(hf.get("layer_norm_epsilon", 1e-6)),
        "dtype": "float32",
    }


def hf_config_from_model_config(cfg: dict) -> dict:
    activations = tuple(cfg["mlp_activations"])
    gated = len(activations) == 2 and activations[1] == "linear"
    act = _ACTIVATION_BACK[activations[0]]
    if gated:
        proj = "gated-gelu" if act == "gelu_new" else f"gated-{act}"
    else:
        proj = "gelu" if act == "gelu" else act
    return {
        "architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
        "vocab_size": cfg["vocab_size"], "d_model": cfg["d_model"], "d_kv": cfg["head_dim"],
        "d_ff": cfg["d_ff"], "num_heads": cfg["num_heads"], "num_layers": cfg["num_encoder_layers"],
        "num_decoder_layers": cfg["num_decoder_layers"], "feed_forward_proj": proj,
        "relative_attention_num_buckets": cfg["relative_attention_num_buckets"],
        "relative_attention_max_distance": cfg["relative_attention_max_distance"],
        "layer_norm_epsilon": cfg["layer_norm_epsilon"], "dropout_rate": 0.0,
        "tie_word_embeddings": bool(cfg["logits_via_embedding"]),
        "scale_decoder_outputs": bool(cfg["logits_via_embedding"]),
        "is_encoder_decoder": True, "pad_token_id": 0, "eos_token_id": 1,
        "decoder_start_token_id": 0,
    }


def missing_tensor(key: str) -> UserError:
    """The refusal for a tensor the config's model needs and the checkpoint lacks."""
    return UserError(f"The checkpoint has no tensor {key!r}; its config.json describes another "
                     "model than these weights, or the folder holds the bare model without the "
                     "heads convert reads (save the pretraining model, e.g. BertForPreTraining, "
                     "GPT2LMHeadModel). Copy config.json and weights from the same "
                     "save_pretrained folder.")


class TrackedWeights(dict):
    """Checkpoint tensors that remember which were read, so leftovers can be reported."""

    def __init__(self, weights):
        super().__init__(weights)
        self.used: set[str] = set()

    def __getitem__(self, key):
        if key not in self:
            raise missing_tensor(key)
        self.used.add(key)
        return dict.__getitem__(self, key)

    def check_all_used(self, ignore=(), ignore_suffixes=()) -> None:
        unused = sorted(k for k in set(self) - self.used - set(ignore)
                        if not k.endswith(tuple(ignore_suffixes)))
        if unused:
            raise UserError(f"{len(unused)} checkpoint tensors have no place in the model, e.g. "
                            f"{unused[:3]}; the config.json does not match the weights. Copy "
                            "both from the same save_pretrained folder.")


def _attention_in(hf_attn: dict, prefix: str, heads: int, head_dim: int) -> dict:
    def proj(name):
        w = hf_attn[f"{prefix}.{name}.weight"]           # [heads*head_dim, d_model]
        return {"kernel": w.T.reshape(w.shape[1], heads, head_dim)}

    o = hf_attn[f"{prefix}.o.weight"]                   # [d_model, heads*head_dim]
    return {"query": proj("q"), "key": proj("k"), "value": proj("v"),
            "out": {"kernel": o.T.reshape(heads, head_dim, o.shape[0])}}


def _attention_out(params: dict, prefix: str) -> dict:
    out = {}
    for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v")):
        k = params[ours]["kernel"]
        out[f"{prefix}.{theirs}.weight"] = k.reshape(k.shape[0], -1).T
    o = params["out"]["kernel"]
    out[f"{prefix}.o.weight"] = o.reshape(-1, o.shape[-1]).T
    return out


def _mlp_in(w: dict, prefix: str, gated: bool) -> dict:
    if gated:
        return {"wi_0": {"kernel": w[f"{prefix}.wi_0.weight"].T},
                "wi_1": {"kernel": w[f"{prefix}.wi_1.weight"].T},
                "wo": {"kernel": w[f"{prefix}.wo.weight"].T}}
    return {"wi": {"kernel": w[f"{prefix}.wi.weight"].T}, "wo": {"kernel": w[f"{prefix}.wo.weight"].T}}


def _mlp_out(params: dict, prefix: str) -> dict:
    return {f"{prefix}.{name}.weight": params[name]["kernel"].T for name in params}


def _t5_feed_forward_in(w, cfg: dict, stack: str, index: int, prefix: str) -> dict:
    return _mlp_in(w, f"{prefix}.DenseReluDense", len(cfg["mlp_activations"]) == 2)


def _t5_feed_forward_out(mlp: dict, cfg: dict, stack: str, index: int, prefix: str) -> dict:
    return _mlp_out(mlp, f"{prefix}.DenseReluDense")


def params_from_hf(weights: dict[str, np.ndarray], cfg: dict,
                   feed_forward_in=_t5_feed_forward_in) -> dict:
    """Our parameter tree from Hugging Face T5 tensors (missing or extra names raise).

    ``feed_forward_in(w, cfg, stack, i, prefix)`` reads layer ``i``'s MLP of ``stack``
    ("encoder"/"decoder") under ``prefix`` (its ``layer.N``); Switch passes its own."""
    heads, head_dim = cfg["num_heads"], cfg["head_dim"]
    w = TrackedWeights(weights)
    embedding_name = next((n for n in ("shared.weight", "encoder.embed_tokens.weight",
                                       "decoder.embed_tokens.weight") if n in weights), "shared.weight")
    params = {"token_embedder": {"embedding": w[embedding_name]}}
    encoder = {"relpos_bias": {"rel_embedding":
               w["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].T},
               "final_norm": {"scale": w["encoder.final_layer_norm.weight"]}}
    for i in range(cfg["num_encoder_layers"]):
        b = f"encoder.block.{i}.layer"
        encoder[f"layers_{i}"] = {
            "pre_attention_norm": {"scale": w[f"{b}.0.layer_norm.weight"]},
            "attention": _attention_in(w, f"{b}.0.SelfAttention", heads, head_dim),
            "pre_mlp_norm": {"scale": w[f"{b}.1.layer_norm.weight"]},
            "mlp": feed_forward_in(w, cfg, "encoder", i, f"{b}.1"),
        }
    decoder = {"relpos_bias": {"rel_embedding":
               w["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].T},
               "final_norm": {"scale": w["decoder.final_layer_norm.weight"]}}
    for i in range(cfg["num_decoder_layers"]):
        b = f"decoder.block.{i}.layer"
        decoder[f"layers_{i}"] = {
            "pre_self_attention_norm": {"scale": w[f"{b}.0.layer_norm.weight"]},
            "self_attention": _attention_in(w, f"{b}.0.SelfAttention", heads, head_dim),
            "pre_cross_attention_norm": {"scale": w[f"{b}.1.layer_norm.weight"]},
            "encoder_decoder_attention": _attention_in(w, f"{b}.1.EncDecAttention", heads, head_dim),
            "pre_mlp_norm": {"scale": w[f"{b}.2.layer_norm.weight"]},
            "mlp": feed_forward_in(w, cfg, "decoder", i, f"{b}.2"),
        }
    if not cfg["logits_via_embedding"]:
        # transformers 5 ties lm_head to the embedding and may not store it separately.
        head = w["lm_head.weight"] if "lm_head.weight" in weights else w[embedding_name]
        decoder["logits_dense"] = {"kernel": head.T}
    params["encoder"], params["decoder"] = encoder, decoder
    w.check_all_used(ignore=("shared.weight", "encoder.embed_tokens.weight",
                             "decoder.embed_tokens.weight", "lm_head.weight"))
    return params


def params_to_hf(params: dict, cfg: dict,
                 feed_forward_out=_t5_feed_forward_out) -> dict[str, np.ndarray]:
    p = _to_numpy(params)
    out = {"shared.weight": p["token_embedder"]["embedding"]}
    enc, dec = p["encoder"], p["decoder"]
    out["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = \
        enc["relpos_bias"]["rel_embedding"].T
    out["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = \
        dec["relpos_bias"]["rel_embedding"].T
    out["encoder.final_layer_norm.weight"] = enc["final_norm"]["scale"]
    out["decoder.final_layer_norm.weight"] = dec["final_norm"]["scale"]
    for i in range(cfg["num_encoder_layers"]):
        layer, b = enc[f"layers_{i}"], f"encoder.block.{i}.layer"
        out[f"{b}.0.layer_norm.weight"] = layer["pre_attention_norm"]["scale"]
        out.update(_attention_out(layer["attention"], f"{b}.0.SelfAttention"))
        out[f"{b}.1.layer_norm.weight"] = layer["pre_mlp_norm"]["scale"]
        out.update(feed_forward_out(layer["mlp"], cfg, "encoder", i, f"{b}.1"))
    for i in range(cfg["num_decoder_layers"]):
        layer, b = dec[f"layers_{i}"], f"decoder.block.{i}.layer"
        out[f"{b}.0.layer_norm.weight"] = layer["pre_self_attention_norm"]["scale"]
        out.update(_attention_out(layer["self_attention"], f"{b}.0.SelfAttention"))
        out[f"{b}.1.layer_norm.weight"] = layer["pre_cross_attention_norm"]["scale"]
        out.update(_attention_out(layer["encoder_decoder_attention"], f"{b}.1.EncDecAttention"))
        out[f"{b}.2.layer_norm.weight"] = layer["pre_mlp_norm"]["scale"]
        out.update(feed_forward_out(layer["mlp"], cfg, "decoder", i, f"{b}.2"))
    if not cfg["logits_via_embedding"]:
        out["lm_head.weight"] = dec["logits_dense"]["kernel"].T
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def _to_numpy(tree):
    if isinstance(tree, dict):
        return {k: _to_numpy(v) for k, v in tree.items()}
    return np.asarray(tree)
