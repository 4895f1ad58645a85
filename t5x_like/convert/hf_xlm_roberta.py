"""Hugging Face XLM-RoBERTa (``XLMRobertaForMaskedLM``) -> t5x_like ``EncoderOnly``.

XLM-R is RoBERTa's network (Conneau et al. 2020) with a 250k SentencePiece vocabulary:
the same tensors under ``roberta.*`` and ``lm_head.*``, positions counted after the
padding index, no next-sentence head. Only the config's ``model_type`` differs.
"""

from __future__ import annotations

from t5x_like.convert import hf_roberta

params_from_hf = hf_roberta.params_from_hf


def model_config_from_hf(hf: dict) -> dict:
    return hf_roberta.model_config_from_hf(hf, model_type="xlm-roberta")
