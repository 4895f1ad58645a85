"""Per-chip numbers for accelerators: peak dense bf16, int8 and fp8 rates, HBM capacity
and bandwidth. Used for MFU (``train.py``) and by the planner's fits-HBM verdict and
roofline. Keys are substrings of ``jax.Device.device_kind``; the longest match wins.

Figures are the vendors' published per-chip (per JAX device) numbers. TPU v2/v3
expose each TensorCore as a device, so their entries are per core.
"""

from __future__ import annotations

import dataclasses

from t5x_like.errors import UserError

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
    # Dense int8 and fp8 matmul rates per device (None: the vendor publishes none; for
    # fp8 that means the chip has no fp8 matmul units).
    int8_flops: float | None = None
    fp8_flops: float | None = None
    # The side of a TPU's systolic matrix units (0: not modelled): a matmul whose
    # contracted size or output features are not a multiple of it leaves part idle
    # (``planner.step_time``).
    mxu_width: int = 0

    def quantized_peak(self, kind: str) -> float:
        """The peak a matmul of ``kind`` ("", "int8", "fp8") runs at: its own rate where
        published, else bfloat16's."""
        rate = {"int8": self.int8_flops, "fp8": self.fp8_flops}.get(kind)
        return rate or self.peak_flops

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
    "TPU v4": Chip(275e12, 32 * GiB, 1.2e12, int8_flops=275e12, mxu_width=128),
    # ICI and DCN from Cloud TPU's system-architecture pages: v5e 400 GB/s over 4 ports,
    # 2 x 100 Gbps NICs a host of 8 chips; v5p 1,200 GB/s over 6 ports, 50 Gbps DCN a chip;
    # v6e 800 GB/s over 4 ports (its DCN is not published per chip). Int8 doubles the
    # bf16 rate on v5e, v5p and v6e; none of them has fp8 units (Ironwood does). Matrix
    # units (Cloud TPU's architecture pages): 128 x 128 up to v5p, 256 x 256 from v6e.
    "TPU v5 lite": Chip(197e12, 16 * GiB, 819e9, 400e9, 4, 25e9 / 8, int8_flops=394e12,
                        mxu_width=128),  # v5e
    "TPU v5e": Chip(197e12, 16 * GiB, 819e9, 400e9, 4, 25e9 / 8, int8_flops=394e12,
                    mxu_width=128),
    "TPU v5": Chip(459e12, 95 * GiB, 2.765e12, 1200e9, 6, 50e9 / 8,  # v5p reports "TPU v5"
                   int8_flops=918e12, mxu_width=128),
    "TPU v5p": Chip(459e12, 95 * GiB, 2.765e12, 1200e9, 6, 50e9 / 8, int8_flops=918e12,
                    mxu_width=128),
    "TPU v6 lite": Chip(918e12, 32 * GiB, 1.64e12, 800e9, 4, int8_flops=1836e12,
                        mxu_width=256),  # v6e
    "TPU7x": Chip(2307e12, 192 * GiB, 7.37e12, fp8_flops=4614e12),      # Ironwood
    # NVIDIA's dense (not 2:4 sparse) tensor-core rates: A100 has int8 but no fp8.
    "A100-SXM4-40GB": Chip(312e12, 40e9, 1.555e12, int8_flops=624e12),
    "A100-SXM4-80GB": Chip(312e12, 80e9, 2.039e12, int8_flops=624e12),
    "A100": Chip(312e12, 80e9, 2.039e12, int8_flops=624e12),
    "H100 PCIe": Chip(756e12, 80e9, 2.0e12, int8_flops=1513e12, fp8_flops=1513e12),
    # NVLink 4 (H100, H200): 900 GB/s a GPU; NVLink 5 (B200): 1.8 TB/s.
    "H100": Chip(989e12, 80e9, 3.35e12, 900e9, int8_flops=1979e12, fp8_flops=1979e12),
    "H200": Chip(989e12, 141e9, 4.8e12, 900e9, int8_flops=1979e12, fp8_flops=1979e12),
    "B200": Chip(2250e12, 180e9, 8.0e12, 1800e9, int8_flops=4500e12, fp8_flops=4500e12),
    "L4": Chip(121e12, 24e9, 300e9, int8_flops=242.5e12, fp8_flops=242.5e12),
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


def peak_for(device_kind: str, quantization_kind: str = "", override: float = 0.0
             ) -> float | None:
    """Peak FLOP/s per device for a step whose matmuls run in ``quantization_kind``
    ("": bfloat16; "int8", "fp8"): ``override`` when positive, else the table."""
    if override and override > 0:
        return float(override)
    chip = chip_for(device_kind)
    return chip.quantized_peak(quantization_kind) if chip else None


def check_quantization(quantization_kind: str, device_kind: str) -> None:
    """Refuses fp8 matmuls on a chip without fp8 units, naming int8 (which every listed
    TPU and GPU since v4 and A100 runs at its own rate); a chip not in the table (a CPU)
    emulates both."""
    chip = chip_for(device_kind)
    if quantization_kind == "fp8" and chip is not None and chip.fp8_flops is None:
        alternative = ("--config.quantization.kind=int8" if chip.int8_flops
                       else "--config.quantization.kind=")
        raise UserError(f"quantization.kind='fp8' needs fp8 matmul units, which {device_kind} "
                        f"does not have; use {alternative}.")
