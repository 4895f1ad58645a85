"""Per-chip numbers for accelerators: peak dense bf16 FLOP/s, HBM capacity and
bandwidth. Used for MFU (``train.py``) and by the planner's fits-HBM verdict and
roofline. Keys are substrings of ``jax.Device.device_kind``; the longest match wins.

Figures are the vendors' published per-chip (per JAX device) numbers. TPU v2/v3
expose each TensorCore as a device, so their entries are per core.
"""

from __future__ import annotations

import dataclasses

GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class Chip:
    peak_flops: float        # dense bf16 FLOP/s per JAX device
    hbm_bytes: float         # memory per JAX device
    hbm_bandwidth: float     # bytes/s per JAX device


CHIPS: dict[str, Chip] = {
    "TPU v2": Chip(22.5e12, 8 * GiB, 350e9),
    "TPU v3": Chip(61.5e12, 16 * GiB, 450e9),
    "TPU v4": Chip(275e12, 32 * GiB, 1.2e12),
    "TPU v5 lite": Chip(197e12, 16 * GiB, 819e9),   # v5e
    "TPU v5e": Chip(197e12, 16 * GiB, 819e9),
    "TPU v5": Chip(459e12, 95 * GiB, 2.765e12),     # v5p reports "TPU v5"
    "TPU v5p": Chip(459e12, 95 * GiB, 2.765e12),
    "TPU v6 lite": Chip(918e12, 32 * GiB, 1.64e12),  # v6e (Trillium)
    "TPU7x": Chip(2307e12, 192 * GiB, 7.37e12),      # Ironwood
    "A100-SXM4-40GB": Chip(312e12, 40e9, 1.555e12),
    "A100-SXM4-80GB": Chip(312e12, 80e9, 2.039e12),
    "A100": Chip(312e12, 80e9, 2.039e12),
    "H100 PCIe": Chip(756e12, 80e9, 2.0e12),
    "H100": Chip(989e12, 80e9, 3.35e12),
    "H200": Chip(989e12, 141e9, 4.8e12),
    "B200": Chip(2250e12, 180e9, 8.0e12),
    "L4": Chip(121e12, 24e9, 300e9),
}


def chip_for(device_kind: str) -> Chip | None:
    """The table entry whose key is the longest substring of ``device_kind`` (None: unknown,
    e.g. CPU)."""
    matches = [key for key in CHIPS if key.lower() in device_kind.lower()]
    return CHIPS[max(matches, key=len)] if matches else None


def peak_flops(device_kind: str, override: float = 0.0) -> float | None:
    """Peak FLOP/s per device: ``override`` when positive, else the table (None if unknown)."""
    if override and override > 0:
        return float(override)
    chip = chip_for(device_kind)
    return chip.peak_flops if chip else None
