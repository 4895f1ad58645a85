"""Hugging Face mBART (``MBartForConditionalGeneration``) -> t5x_like ``BartEncoderDecoder``.

mBART's tensors are BART's (``hf_bart``) plus a LayerNorm after each stack
(``model.encoder.layer_norm``, ``model.decoder.layer_norm``); its blocks are
pre-LayerNorm, so the same per-layer norms sit before their sublayer
(``pre_norm``), and embeddings are scaled by sqrt(d_model) when the config says
``scale_embedding`` (mbart-large-cc25 does). Decoder inputs start with the target's
language id (``decoder_start_from_targets``), as ``shift_tokens_right`` does there.
"""

from __future__ import annotations

import numpy as np

from t5x_like.convert import hf_bart

FINAL_NORMS = hf_bart.FINAL_NORMS


def model_config_from_hf(hf: dict) -> dict:
    if hf.get("model_type") != "mbart":
        raise ValueError(f"Expected model_type 'mbart', got {hf.get('model_type')!r}.")
    start = hf.get("decoder_start_token_id")  # null in mbart-large-cc25: the eos id
    cfg = hf_bart.model_config_from_hf(dict(
        hf, model_type="bart", normalize_before=False, add_final_layer_norm=False,
        decoder_start_token_id=hf.get("eos_token_id", 2) if start is None else start))
    cfg.update(pre_norm=True, final_layer_norm=True, decoder_start_from_targets=True,
               scale_embedding=bool(hf.get("scale_embedding", False)))
    return cfg


def params_from_hf(weights: dict[str, np.ndarray], cfg: dict) -> dict:
    norms = {ours: {"scale": weights[f"{theirs}.weight"], "bias": weights[f"{theirs}.bias"]}
             for ours, theirs in FINAL_NORMS.items()}
    final = {f"{theirs}.{kind}" for theirs in FINAL_NORMS.values() for kind in ("weight", "bias")}
    params = hf_bart.params_from_hf({k: v for k, v in weights.items() if k not in final}, cfg)
    params.update(norms)
    return params
