"""Hugging Face BERT (``BertForPreTraining``) <-> t5x_like ``EncoderOnly``.

Linear weights are ``[out, in]`` there and ``[in, out]`` (heads split) here. The
masked-LM decoder matrix is the word embedding (tied); its bias is ``mlm_bias``.
The folder must hold the pretraining heads (``BertForPreTraining``); a bare
``BertModel`` folder is reported as missing ``cls.*`` tensors.
"""

from __future__ import annotations

import numpy as np

from t5x_like.convert.hf_t5 import TrackedWeights
from t5x_like.errors import UserError

_ACTIVATION = {"gelu": "gelu_exact", "gelu_new": "gelu", "relu": "relu", "silu": "silu"}
_ACTIVATION_BACK = {"gelu_exact": "gelu", "gelu": "gelu_new", "relu": "relu", "silu": "silu"}


# Where BERT and RoBERTa keep the same tensors.
BERT_NAMES = {"prefix": "bert", "mlm_transform": "cls.predictions.transform.dense",
              "mlm_norm": "cls.predictions.transform.LayerNorm", "mlm_bias": "cls.predictions.bias",
              "tied": ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")}
ROBERTA_NAMES = {"prefix": "roberta", "mlm_transform": "lm_head.dense",
                 "mlm_norm": "lm_head.layer_norm", "mlm_bias": "lm_head.bias",
                 "tied": ("lm_head.decoder.weight", "lm_head.decoder.bias")}


def model_config_from_hf(hf: dict, model_type: str = "bert") -> dict:
    if hf.get("model_type") != model_type:
        raise ValueError(f"Expected model_type {model_type!r}, got {hf.get('model_type')!r}.")
    act = hf.get("hidden_act", "gelu")
    if act not in _ACTIVATION:
        raise UserError(f"model_type {model_type!r} with hidden_act {act!r} does not convert; "
                        f"supported: {', '.join(sorted(_ACTIVATION))}.")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise UserError(f"model_type {model_type!r} with position_embedding_type "
                        f"{hf.get('position_embedding_type')!r} does not convert: only absolute "
                        "position embeddings are supported.")
    d_model, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    return {
        "family": "encoder",
        "vocab_size": int(hf["vocab_size"]),
        "d_model": d_model,
        "num_heads": heads,
        "head_dim": d_model // heads,
        "d_ff": int(hf["intermediate_size"]),
        "num_layers": int(hf["num_hidden_layers"]),
        "max_length": int(hf["max_position_embeddings"]),
        "type_vocab_size": int(hf.get("type_vocab_size", 2)),
        "mlp_activations": (_ACTIVATION[act],),
        "layer_norm_epsilon": float(hf.get("layer_norm_eps", 1e-12)),
        "pad_id": int(hf.get("pad_token_id", 0) or 0),
        "position_offset": 0,
        "next_sentence_head": True,
        "dropout_rate": 0.0,
        "dtype": "float32",
    }


def hf_config_from_model_config(cfg: dict) -> dict:
    if (cfg.get("position_offset", 0) or cfg.get("embedding_dim") or cfg.get("share_layers")
            or cfg.get("span_boundary_head") or cfg.get("attention_window")):
        raise UserError("Only BERT-layout encoders export so far (RoBERTa-style position "
                        "offsets, ALBERT's factorized or shared layers, the span-boundary "
                        "head and local attention do not).")
    # With the next-sentence head: BertForPreTraining (pooler and NSP); without it (an MLM
    # run here): BertForMaskedLM, which has neither.
    nsp = cfg.get("next_sentence_head", True)
    return {
        "architectures": ["BertForPreTraining" if nsp else "BertForMaskedLM"],
        "model_type": "bert",
        "vocab_size": cfg["vocab_size"], "hidden_size": cfg["d_model"],
        "num_attention_heads": cfg["num_heads"], "num_hidden_layers": cfg["num_layers"],
        "intermediate_size": cfg["d_ff"], "max_position_embeddings": cfg["max_length"],
        "type_vocab_size": cfg["type_vocab_size"],
        "hidden_act": _ACTIVATION_BACK[tuple(cfg["mlp_activations"])[0]],
        "layer_norm_eps": cfg["layer_norm_epsilon"], "pad_token_id": cfg["pad_id"],
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        "position_embedding_type": "absolute", "tie_word_embeddings": True,
    }


def _linear_in(w, name):
    return {"kernel": w[f"{name}.weight"].T, "bias": w[f"{name}.bias"]}


def _norm_in(w, name):
    return {"scale": w[f"{name}.weight"], "bias": w[f"{name}.bias"]}


def put_out(out: dict, name: str, p: dict) -> None:
    """A dense layer (2-D ``kernel``) or a LayerNorm (``scale``) as ``{name}.weight``
    and ``{name}.bias`` in Hugging Face's layout: :func:`_linear_in` and :func:`_norm_in`
    backwards."""
    weight = np.asarray(p["kernel"]).T if "kernel" in p else np.asarray(p["scale"])
    out[f"{name}.weight"], out[f"{name}.bias"] = weight, np.asarray(p["bias"])


# Where one post-LayerNorm block keeps its tensors below its prefix: BERT, RoBERTa and
# ELECTRA name them alike; DistilBERT has its own names (hf_distilbert).
BERT_LAYER = {"query": "attention.self.query", "key": "attention.self.key",
              "value": "attention.self.value", "out": "attention.output.dense",
              "attention_norm": "attention.output.LayerNorm", "wi": "intermediate.dense",
              "wo": "output.dense", "mlp_norm": "output.LayerNorm"}


def attention_from_hf(w, b: str, heads: int, head_dim: int, d: int, names: dict = BERT_LAYER
                      ) -> dict:
    """Hugging Face's query/key/value/out Linear layers with biases under ``b``
    (``names``: where each sits below it) as per-head kernels and biases."""
    attention = {}
    for name in ("query", "key", "value"):
        weight, bias = w[f"{b}.{names[name]}.weight"], w[f"{b}.{names[name]}.bias"]
        attention[name] = {"kernel": weight.T.reshape(d, heads, head_dim),
                           "bias": bias.reshape(heads, head_dim)}
    attention["out"] = {"kernel": w[f"{b}.{names['out']}.weight"].T.reshape(heads, head_dim, d),
                        "bias": w[f"{b}.{names['out']}.bias"]}
    return attention


def layer_from_hf(w, b: str, heads: int, head_dim: int, d: int, names: dict = BERT_LAYER) -> dict:
    """One post-LayerNorm block of the Hugging Face tensors under prefix ``b``."""
    return {"attention": attention_from_hf(w, b, heads, head_dim, d, names),
            "attention_norm": _norm_in(w, f"{b}.{names['attention_norm']}"),
            "mlp": {"wi": _linear_in(w, f"{b}.{names['wi']}"),
                    "wo": _linear_in(w, f"{b}.{names['wo']}")},
            "mlp_norm": _norm_in(w, f"{b}.{names['mlp_norm']}")}


def attention_to_hf(attention: dict, b: str, d: int, names: dict = BERT_LAYER
                    ) -> dict[str, np.ndarray]:
    """Per-head query/key/value/out kernels and biases as Hugging Face Linear layers under
    ``b`` (``names``: where each sits below it); :func:`attention_from_hf` backwards."""
    arr = np.asarray
    out = {}
    for name in ("query", "key", "value"):
        p = attention[name]
        out[f"{b}.{names[name]}.weight"] = arr(p["kernel"]).reshape(d, -1).T
        out[f"{b}.{names[name]}.bias"] = arr(p["bias"]).reshape(-1)
    o = attention["out"]
    out[f"{b}.{names['out']}.weight"] = arr(o["kernel"]).reshape(-1, d).T
    out[f"{b}.{names['out']}.bias"] = arr(o["bias"])
    return out


def layer_to_hf(layer: dict, b: str, d: int, names: dict = BERT_LAYER) -> dict[str, np.ndarray]:
    """:func:`layer_from_hf` backwards."""
    out = attention_to_hf(layer["attention"], b, d, names)
    for ours, p in (("wi", layer["mlp"]["wi"]), ("wo", layer["mlp"]["wo"]),
                    ("attention_norm", layer["attention_norm"]), ("mlp_norm", layer["mlp_norm"])):
        put_out(out, f"{b}.{names[ours]}", p)
    return out


def params_from_hf(weights: dict[str, np.ndarray], cfg: dict, names: dict = BERT_NAMES) -> dict:
    heads, head_dim, d = cfg["num_heads"], cfg["head_dim"], cfg["d_model"]
    w = TrackedWeights(weights)
    prefix = names["prefix"]
    e = f"{prefix}.embeddings"
    params = {
        "token_embedder": {"embedding": w[f"{e}.word_embeddings.weight"]},
        "position_embedder": {"embedding": w[f"{e}.position_embeddings.weight"]},
        "token_type_embedder": {"embedding": w[f"{e}.token_type_embeddings.weight"]},
        "embedding_norm": _norm_in(w, f"{e}.LayerNorm"),
        "mlm_transform": _linear_in(w, names["mlm_transform"]),
        "mlm_norm": _norm_in(w, names["mlm_norm"]),
        "mlm_bias": w[names["mlm_bias"]],
    }
    if cfg.get("next_sentence_head", True) and "cls.seq_relationship.weight" not in weights:
        # BertForMaskedLM as transformers saves it (our MLM-only export among them): no
        # pooler, no NSP head; the folder imports without the next-sentence head.
        cfg["next_sentence_head"] = False
    if cfg.get("next_sentence_head", True):
        params["pooler"] = _linear_in(w, f"{prefix}.pooler.dense")
        params["nsp"] = _linear_in(w, "cls.seq_relationship")
    for i in range(cfg["num_layers"]):
        params[f"layers_{i}"] = layer_from_hf(w, f"{prefix}.encoder.layer.{i}", heads, head_dim, d)
    # The decoder matrix and bias are tied copies of the word embedding and the MLM bias.
    w.check_all_used(ignore=names["tied"], ignore_suffixes=("position_ids",))
    return params


def params_to_hf(params: dict, cfg: dict) -> dict[str, np.ndarray]:
    d = cfg["d_model"]
    arr = np.asarray
    out = {}
    e = "bert.embeddings"
    out[f"{e}.word_embeddings.weight"] = arr(params["token_embedder"]["embedding"])
    out[f"{e}.position_embeddings.weight"] = arr(params["position_embedder"]["embedding"])
    out[f"{e}.token_type_embeddings.weight"] = arr(params["token_type_embedder"]["embedding"])
    for name, ours in ((f"{e}.LayerNorm", "embedding_norm"), ("bert.pooler.dense", "pooler"),
                       ("cls.predictions.transform.dense", "mlm_transform"),
                       ("cls.predictions.transform.LayerNorm", "mlm_norm"),
                       ("cls.seq_relationship", "nsp")):
        if ours in params:  # no pooler or NSP without the next-sentence head
            put_out(out, name, params[ours])
    out["cls.predictions.bias"] = arr(params["mlm_bias"])
    for i in range(cfg["num_layers"]):
        out.update(layer_to_hf(params[f"layers_{i}"], f"bert.encoder.layer.{i}", d))
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}
