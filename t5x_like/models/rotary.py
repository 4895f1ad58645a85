"""Rotary position frequencies: plain RoPE and the context-extension rescalings that
checkpoints' ``config.json`` carries (``rope_type`` ``linear``, ``llama3``, ``yarn``; the
``model.positions.rope`` section, ``config.model_parts.Rope``, holds them here).

Each gives the inverse frequency of every rotated pair of dimensions and a factor on
the rotation's cos and sin (YaRN's attention temperature; 1 for the rest), computed
once in numpy as transformers' ``modeling_rope_utils`` does, so an imported Llama 3.1
or a YaRN-extended Qwen rotates exactly as it did in training. ``dynamic`` NTK (which
changes the frequencies with the length of each batch) and ``longrope`` are not built.
"""

from __future__ import annotations

import math

import numpy as np

from t5x_like.config.model_parts import ROPE_SCALINGS, Rope

ROPE_TYPES = ROPE_SCALINGS


def frequencies(head_dim: int, base: float, scaling: Rope | None = None
                ) -> tuple[np.ndarray, float]:
    """``(inverse frequencies [head_dim / 2] float32, cos/sin factor)``; ``scaling``: the
    rope section whose rescaling applies (None: plain RoPE at ``base``)."""
    scaling = scaling or Rope()
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim
    inv_freq = 1.0 / (base ** exponents)
    kind = scaling.scaling
    if kind == "default":
        return inv_freq.astype(np.float32), 1.0
    if kind == "linear":
        return (inv_freq / scaling.factor).astype(np.float32), 1.0
    if kind == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    return _yarn(head_dim, base, scaling)


def _llama3(inv_freq: np.ndarray, s: Rope) -> np.ndarray:
    low_wavelength = s.original_max_length / s.low_freq_factor
    high_wavelength = s.original_max_length / s.high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    scaled = np.where(wavelength > low_wavelength, inv_freq / s.factor, inv_freq)
    smooth = ((s.original_max_length / wavelength - s.low_freq_factor)
              / (s.high_freq_factor - s.low_freq_factor))
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelength < high_wavelength) & ~(wavelength > low_wavelength)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn(head_dim: int, base: float, s: Rope) -> tuple[np.ndarray, float]:
    factor = s.factor
    attention_factor = s.attention_factor or (1.0 if factor <= 1 else
                                              0.1 * math.log(factor) + 1.0)

    def correction_dim(rotations: float) -> float:
        return (head_dim * math.log(s.original_max_length / (rotations * 2 * math.pi))
                / (2 * math.log(base)))
    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    positions = base ** (np.arange(0, head_dim, 2).astype(np.float32) / head_dim)
    inv_freq = ((1.0 / (factor * positions)) * (1 - extrapolation)
                + (1.0 / positions) * extrapolation)
    return inv_freq.astype(np.float32), float(attention_factor)
