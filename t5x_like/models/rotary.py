"""Rotary position frequencies: plain RoPE and the context-extension rescalings that
checkpoints' ``config.json`` carries (``rope_type`` ``linear``, ``llama3``, ``yarn``).

Each gives the inverse frequency of every rotated pair of dimensions and a factor on
the rotation's cos and sin (YaRN's attention temperature; 1 for the rest), computed
once in numpy as transformers' ``modeling_rope_utils`` does, so an imported Llama 3.1
or a YaRN-extended Qwen rotates exactly as it did in training. ``dynamic`` NTK (which
changes the frequencies with the length of each batch) and ``longrope`` are not built.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """The rescaling of a model's global rotary frequencies (defaults: none).

    ``factor``: how many times the pretraining context is extended (linear, llama3,
    yarn). Llama 3.1: wavelengths longer than ``original_max_length /
    low_freq_factor`` are stretched by ``factor``, shorter than ``original_max_length /
    high_freq_factor`` kept, smoothly between. YaRN: dimensions rotating more than
    ``beta_fast`` times over the original context keep their frequency, fewer than
    ``beta_slow`` are interpolated, a ramp between; cos and sin are scaled by
    ``attention_factor`` (0: ``0.1 ln(factor) + 1``)."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_length: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float = 0.0
    truncate: bool = True

    def __post_init__(self):
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {self.rope_type!r} is not built; choose from "
                             f"{ROPE_TYPES}.")

    @classmethod
    def from_config(cls, cfg) -> RopeScaling:
        """From a decoder config's ``rope_*`` fields."""
        return cls(rope_type=cfg.rope_type, factor=cfg.rope_factor,
                   low_freq_factor=cfg.rope_low_freq_factor,
                   high_freq_factor=cfg.rope_high_freq_factor,
                   original_max_length=cfg.rope_original_max_length,
                   beta_fast=cfg.rope_beta_fast, beta_slow=cfg.rope_beta_slow,
                   attention_factor=cfg.rope_attention_factor, truncate=cfg.rope_truncate)


def frequencies(head_dim: int, base: float, scaling: RopeScaling | None = None
                ) -> tuple[np.ndarray, float]:
    """``(inverse frequencies [head_dim / 2] float32, cos/sin factor)``."""
    scaling = scaling or RopeScaling()
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim
    inv_freq = 1.0 / (base ** exponents)
    kind = scaling.rope_type
    if kind == "default":
        return inv_freq.astype(np.float32), 1.0
    if kind == "linear":
        return (inv_freq / scaling.factor).astype(np.float32), 1.0
    if kind == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    return _yarn(head_dim, base, scaling)


def _llama3(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    low_wavelength = s.original_max_length / s.low_freq_factor
    high_wavelength = s.original_max_length / s.high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    scaled = np.where(wavelength > low_wavelength, inv_freq / s.factor, inv_freq)
    smooth = ((s.original_max_length / wavelength - s.low_freq_factor)
              / (s.high_freq_factor - s.low_freq_factor))
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelength < high_wavelength) & ~(wavelength > low_wavelength)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn(head_dim: int, base: float, s: RopeScaling) -> tuple[np.ndarray, float]:
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
