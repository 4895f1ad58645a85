"""Hugging Face Longformer (``LongformerForMaskedLM``) -> t5x_like ``EncoderOnly``.

Longformer is RoBERTa with local attention and global tokens that have their own
query/key/value projections (``query_global`` ...). Hugging Face's
``attention_window`` is the whole window (``w`` keys on each side of a token for
``attention_window = 2w``); ours counts keys fewer than ``attention_window``
positions away, so ours is ``w + 1``.
"""

from __future__ import annotations

import numpy as np

from t5x_like.convert import hf_bert
from t5x_like.convert.hf_t5 import TrackedWeights
from t5x_like.errors import UserError

NAMES = dict(hf_bert.ROBERTA_NAMES, prefix="longformer")


def model_config_from_hf(hf: dict) -> dict:
    windows = hf.get("attention_window", 512)
    windows = [windows] if isinstance(windows, int) else list(windows)
    if len(set(windows)) != 1:
        raise UserError(f"Longformer attention_window differs by layer ({windows}) and does "
                        "not convert: only Longformer with one window for every layer is "
                        "supported.")
    if windows[0] % 2:
        raise UserError(f"Longformer attention_window={windows[0]} does not convert: only an "
                        "even attention_window (the same number of keys on each side) is "
                        "supported.")
    cfg = hf_bert.model_config_from_hf(dict(hf, model_type="roberta"), model_type="roberta")
    pad = int(hf.get("pad_token_id", 1))
    cfg.update(pad_id=pad, position_offset=pad + 1, next_sentence_head=False,
               attention_window=windows[0] // 2 + 1, global_attention=True)
    return cfg


def params_from_hf(weights: dict[str, np.ndarray], cfg: dict) -> dict:
    """RoBERTa's tensors through ``hf_bert``, then each layer's global projections."""
    heads, head_dim, d = cfg["num_heads"], cfg["head_dim"], cfg["d_model"]
    is_global = lambda name: name.rsplit(".", 2)[-2].endswith("_global")  # noqa: E731
    params = hf_bert.params_from_hf({k: v for k, v in weights.items() if not is_global(k)},
                                    cfg, names=NAMES)
    tracked = TrackedWeights({k: v for k, v in weights.items() if is_global(k)})
    for i in range(cfg["num_layers"]):
        b = f"{NAMES['prefix']}.encoder.layer.{i}.attention.self"
        for name in ("query", "key", "value"):
            params[f"layers_{i}"]["attention"][f"{name}_global"] = {
                "kernel": tracked[f"{b}.{name}_global.weight"].T.reshape(d, heads, head_dim),
                "bias": tracked[f"{b}.{name}_global.bias"].reshape(heads, head_dim)}
    tracked.check_all_used()
    return params
