"""Hugging Face RoBERTa (``RobertaForMaskedLM``) -> t5x_like ``EncoderOnly``.

RoBERTa is BERT's network with other tensor names, no next-sentence head, and
positions that start after the padding index (``pad_token_id + 1``).
"""

from __future__ import annotations

import numpy as np

from t5x_like.convert import hf_bert


def model_config_from_hf(hf: dict, model_type: str = "roberta") -> dict:
    cfg = hf_bert.model_config_from_hf(hf, model_type=model_type)
    pad = int(hf.get("pad_token_id", 1))
    cfg.update(pad_id=pad, position_offset=pad + 1, next_sentence_head=False)
    return cfg


def params_from_hf(weights: dict[str, np.ndarray], cfg: dict) -> dict:
    return hf_bert.params_from_hf(weights, cfg, names=hf_bert.ROBERTA_NAMES)
