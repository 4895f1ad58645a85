"""Hugging Face ALBERT (``AlbertForPreTraining``) -> t5x_like ``EncoderOnly``.

ALBERT is BERT's block with factorized embeddings (width ``embedding_size``,
projected to ``hidden_size`` by ``embedding_hidden_mapping_in``), one block
shared by every layer, an MLM head that maps back to the embedding width, and
a sentence-order head shaped like BERT's next-sentence head.
"""

from __future__ import annotations

import numpy as np

from t5x_like.convert import hf_bert
from t5x_like.convert.hf_t5 import TrackedWeights
from t5x_like.errors import UserError

_linear_in, _norm_in = hf_bert._linear_in, hf_bert._norm_in


def model_config_from_hf(hf: dict) -> dict:
    if hf.get("model_type") != "albert":
        raise ValueError(f"Expected model_type 'albert', got {hf.get('model_type')!r}.")
    if int(hf.get("num_hidden_groups", 1)) != 1 or int(hf.get("inner_group_num", 1)) != 1:
        raise UserError("Only ALBERT with one shared layer (num_hidden_groups=1, "
                        "inner_group_num=1, as in every released ALBERT) is supported; got "
                        f"num_hidden_groups={hf.get('num_hidden_groups', 1)}, "
                        f"inner_group_num={hf.get('inner_group_num', 1)}.")
    cfg = hf_bert.model_config_from_hf(dict(hf, hidden_act=hf.get("hidden_act", "gelu_new")),
                                       model_type="albert")
    cfg.update(embedding_dim=int(hf["embedding_size"]), share_layers=True)
    return cfg


def params_from_hf(weights: dict[str, np.ndarray], cfg: dict) -> dict:
    heads, head_dim, d = cfg["num_heads"], cfg["head_dim"], cfg["d_model"]
    w = TrackedWeights(weights)
    e = "albert.embeddings"
    b = "albert.encoder.albert_layer_groups.0.albert_layers.0"
    attention = {name: {"kernel": w[f"{b}.attention.{name}.weight"].T.reshape(d, heads, head_dim),
                        "bias": w[f"{b}.attention.{name}.bias"].reshape(heads, head_dim)}
                 for name in ("query", "key", "value")}
    attention["out"] = {"kernel": w[f"{b}.attention.dense.weight"].T.reshape(heads, head_dim, d),
                        "bias": w[f"{b}.attention.dense.bias"]}
    params = {
        "token_embedder": {"embedding": w[f"{e}.word_embeddings.weight"]},
        "position_embedder": {"embedding": w[f"{e}.position_embeddings.weight"]},
        "token_type_embedder": {"embedding": w[f"{e}.token_type_embeddings.weight"]},
        "embedding_norm": _norm_in(w, f"{e}.LayerNorm"),
        "embedding_projection": _linear_in(w, "albert.encoder.embedding_hidden_mapping_in"),
        "shared_layer": {
            "attention": attention,
            "attention_norm": _norm_in(w, f"{b}.attention.LayerNorm"),
            "mlp": {"wi": _linear_in(w, f"{b}.ffn"), "wo": _linear_in(w, f"{b}.ffn_output")},
            "mlp_norm": _norm_in(w, f"{b}.full_layer_layer_norm"),
        },
        "mlm_transform": _linear_in(w, "predictions.dense"),
        "mlm_norm": _norm_in(w, "predictions.LayerNorm"),
        "mlm_bias": w["predictions.bias"],
        "pooler": _linear_in(w, "albert.pooler"),
        "nsp": _linear_in(w, "sop_classifier.classifier"),
    }
    # The decoder matrix and bias are tied copies of the word embedding and the MLM bias.
    w.check_all_used(ignore=("predictions.decoder.weight", "predictions.decoder.bias"),
                     ignore_suffixes=("position_ids", "token_type_ids"))
    return params
