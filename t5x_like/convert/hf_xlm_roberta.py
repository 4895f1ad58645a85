"""Hugging Face XLM-RoBERTa (``XLMRobertaForMaskedLM``) -> t5x_like ``EncoderOnly``.

XLM-R is RoBERTa's network (Conneau et al. 2020) with a 250k SentencePiece vocabulary:
the same tensors under ``roberta.*`` and ``lm_head.*``, positions counted after the
padding index, no next-sentence head. Only the config's ``model_type`` differs.
"""

from __future__ import annotations

import numpy as np

from t5x_like.convert import hf_bert


def model_config_from_hf(hf: dict) -> dict:
    cfg = hf_bert.model_config_from_hf(hf, model_type="xlm-roberta")
    pad = int(hf.get("pad_token_id", 1))
    cfg.update(pad_id=pad, position_offset=pad + 1, next_sentence_head=False)
    return cfg


def params_from_hf(weights: dict[str, np.ndarray], cfg: dict) -> dict:
    return hf_bert.params_from_hf(weights, cfg, names=hf_bert.ROBERTA_NAMES)
