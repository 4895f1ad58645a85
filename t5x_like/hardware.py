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
    # Links (None: not in the table, no communication time): the chip's bidirectional
    # inter-chip bandwidth over all its ports, bytes/s; the ports (two per torus
    # dimension; 0 for a GPU's switched NVLink, where every axis gets all of it); and
    # the data-center network's bytes/s per chip (multi-slice's dcn axis).
    ici_bandwidth: float | None = None
    ici_ports: int = 0
    dcn_bandwidth: float | None = None

    def axis_bandwidth(self, over_dcn: bool, ici_axes: int) -> float | None:
        """Bytes/s one device's collective over mesh axes gets: the data-center network
        when it crosses slices; else the links of as many torus dimensions as mesh axes
        it crosses (a mesh axis is taken to lie along one dimension, both directions:
        an approximation; XLA may route over more), all NVLink on a GPU."""
        if over_dcn:
            return self.dcn_bandwidth
        if not self.ici_bandwidth:
            return None
        if not self.ici_ports:
            return self.ici_bandwidth
        dimensions = self.ici_ports // 2
        return self.ici_bandwidth * min(max(ici_axes, 1), dimensions) / dimensions


CHIPS: dict[str, Chip] = {
    "TPU v2": Chip(22.5e12, 8 * GiB, 350e9),
    "TPU v3": Chip(61.5e12, 16 * GiB, 450e9),
    "TPU v4": Chip(275e12, 32 * GiB, 1.2e12),
    # ICI and DCN from Cloud TPU's system-architecture pages: v5e 400 GB/s over 4 ports,
    # 2 x 100 Gbps NICs a host of 8 chips; v5p 1,200 GB/s over 6 ports, 50 Gbps DCN a chip;
    # v6e 800 GB/s over 4 ports (its DCN is not published per chip).
    "TPU v5 lite": Chip(197e12, 16 * GiB, 819e9, 400e9, 4, 25e9 / 8),   # v5e
    "TPU v5e": Chip(197e12, 16 * GiB, 819e9, 400e9, 4, 25e9 / 8),
    "TPU v5": Chip(459e12, 95 * GiB, 2.765e12, 1200e9, 6, 50e9 / 8),     # v5p reports "TPU v5"
    "TPU v5p": Chip(459e12, 95 * GiB, 2.765e12, 1200e9, 6, 50e9 / 8),
    "TPU v6 lite": Chip(918e12, 32 * GiB, 1.64e12, 800e9, 4),  # v6e (Trillium)
    "TPU7x": Chip(2307e12, 192 * GiB, 7.37e12),      # Ironwood
    "A100-SXM4-40GB": Chip(312e12, 40e9, 1.555e12),
    "A100-SXM4-80GB": Chip(312e12, 80e9, 2.039e12),
    "A100": Chip(312e12, 80e9, 2.039e12),
    "H100 PCIe": Chip(756e12, 80e9, 2.0e12),
    # NVLink 4 (H100, H200): 900 GB/s a GPU; NVLink 5 (B200): 1.8 TB/s.
    "H100": Chip(989e12, 80e9, 3.35e12, 900e9),
    "H200": Chip(989e12, 141e9, 4.8e12, 900e9),
    "B200": Chip(2250e12, 180e9, 8.0e12, 1800e9),
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
