"""RoPE settings between a Hugging Face ``config.json`` and the decoder's ``rope_*`` and
``rotary_max_wavelength`` fields, for every rotary decoder family (Llama, Mistral, Qwen,
Gemma).

transformers 5 writes ``rope_parameters`` (per layer type for Gemma 3); older configs
carry ``rope_theta`` and ``rope_scaling``. Both are read. The rescalings the decoder
computes (``models.rotary``) import; the rest are refused by name.
"""

from __future__ import annotations

import math

from t5x_like.errors import UserError
from t5x_like.models import rotary


def rope_parameters(hf: dict, layer_type: str | None = None) -> dict:
    """The RoPE settings of ``hf`` (of ``layer_type``'s layers where they differ)."""
    params = hf.get("rope_parameters")
    if params is None:  # transformers 4's layout
        params = dict(hf.get("rope_scaling") or {})
        params.setdefault("rope_theta", hf.get("rope_theta", 10_000.0))
        if "type" in params and "rope_type" not in params:
            params["rope_type"] = params.pop("type")
    elif layer_type is not None and layer_type in params:
        params = params[layer_type]
    elif "full_attention" in params or "sliding_attention" in params:
        params = params.get("full_attention") or params.get("sliding_attention")
    return dict(params)


def fields_from_hf(hf: dict, layer_type: str | None = None) -> dict:
    """``rotary_max_wavelength`` and the ``rope_*`` fields; a type not built is refused."""
    p = rope_parameters(hf, layer_type)
    kind = p.get("rope_type", "default")
    if kind not in rotary.ROPE_TYPES:
        raise UserError(f"RoPE type {kind!r} ({hf.get('model_type')} config.json) does not "
                        f"convert; supported rope_type: {', '.join(rotary.ROPE_TYPES)} (dynamic NTK, "
                        "longrope and others change the frequencies per batch or per layer).")
    if float(p.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UserError(f"partial_rotary_factor={p['partial_rotary_factor']} does not convert; "
                        "only RoPE over the whole head dimension is built.")
    fields = {"rotary_max_wavelength": float(p.get("rope_theta", 10_000.0)), "rope_type": kind}
    max_length = int(hf.get("max_position_embeddings", 2048))
    original = int(p.get("original_max_position_embeddings") or max_length)
    if kind == "linear":
        fields["rope_factor"] = float(p["factor"])
    elif kind == "llama3":
        fields.update(rope_factor=float(p["factor"]),
                      rope_low_freq_factor=float(p["low_freq_factor"]),
                      rope_high_freq_factor=float(p["high_freq_factor"]),
                      rope_original_max_length=original)
    elif kind == "yarn":
        factor = p.get("factor")
        factor = float(factor) if factor is not None else max_length / original
        attention_factor = p.get("attention_factor")
        if attention_factor is None and p.get("mscale") and p.get("mscale_all_dim"):
            def mscale(scale):
                return 1.0 if factor <= 1 else 0.1 * scale * math.log(factor) + 1.0
            attention_factor = mscale(p["mscale"]) / mscale(p["mscale_all_dim"])
        fields.update(rope_factor=factor, rope_original_max_length=original,
                      rope_beta_fast=float(p.get("beta_fast") or 32.0),
                      rope_beta_slow=float(p.get("beta_slow") or 1.0),
                      rope_attention_factor=float(attention_factor or 0.0),
                      rope_truncate=bool(p.get("truncate", True)))
    return fields


def parameters_from_model_config(cfg: dict) -> dict:
    """The ``rope_parameters`` a model config's global layers export as."""
    kind = cfg.get("rope_type", "default")
    out = {"rope_type": kind, "rope_theta": cfg["rotary_max_wavelength"]}
    if kind == "linear":
        out["factor"] = cfg["rope_factor"]
    elif kind == "llama3":
        out.update(factor=cfg["rope_factor"], low_freq_factor=cfg["rope_low_freq_factor"],
                   high_freq_factor=cfg["rope_high_freq_factor"],
                   original_max_position_embeddings=cfg["rope_original_max_length"])
    elif kind == "yarn":
        out.update(factor=cfg["rope_factor"],
                   original_max_position_embeddings=cfg["rope_original_max_length"],
                   beta_fast=cfg["rope_beta_fast"], beta_slow=cfg["rope_beta_slow"],
                   truncate=cfg.get("rope_truncate", True))
        if cfg.get("rope_attention_factor"):
            out["attention_factor"] = cfg["rope_attention_factor"]
    return out


def layer_types_from_hf(hf: dict) -> tuple[tuple[str, ...], int]:
    """``(layer_types, sliding_window)``: () when every layer is alike (every layer
    sliding means ``sliding_window`` set, as Mistral), else the per-layer names."""
    window = int(hf.get("sliding_window") or 0)
    if hf.get("use_sliding_window") is False:  # Qwen: a window configured but off
        window = 0
    if not window:
        return (), 0
    types = tuple(hf.get("layer_types") or ())
    if not types:
        return (), window
    layers = int(hf["num_hidden_layers"])
    if len(types) != layers:
        raise UserError(f"config.json lists {len(types)} layer_types for {layers} layers; "
                        "re-save the model with save_pretrained.")
    if set(types) == {"sliding_attention"}:
        return (), window
    if set(types) == {"full_attention"}:
        return (), 0
    return types, window
