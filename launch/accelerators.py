"""Cloud TPU accelerator types as gcloud and xpk spell them: how many hosts (workers) a
slice has, and the TPU VM image (runtime version) that suits JAX on it.

The launcher needs the host count to address every worker by number without asking
the cloud first, so a dry run is complete and deterministic.
"""

from __future__ import annotations

import dataclasses
import re

from t5x_like.errors import UserError


@dataclasses.dataclass(frozen=True)
class Generation:
    unit: str                 # what the number in the type counts: "TensorCores" or "chips"
    units_per_host: int       # in a multi-host slice
    single_host_max: int      # sizes up to this fit one host
    runtime_version: str      # Cloud TPU's base image for JAX on this generation


# Sizes and images from Cloud TPU's "TPU versions" and "TPU software versions" pages.
GENERATIONS = {
    "v2": Generation("TensorCores", 8, 8, "tpu-ubuntu2204-base"),
    "v3": Generation("TensorCores", 8, 8, "tpu-ubuntu2204-base"),
    "v4": Generation("TensorCores", 8, 8, "tpu-ubuntu2204-base"),
    "v5p": Generation("TensorCores", 8, 8, "v2-alpha-tpuv5"),
    "v5litepod": Generation("chips", 4, 8, "v2-alpha-tpuv5-lite"),
    "v6e": Generation("chips", 4, 8, "v2-alpha-tpuv6e"),
}

ALIASES = {"v5e": "v5litepod", "v5lite": "v5litepod"}


@dataclasses.dataclass(frozen=True)
class SliceType:
    name: str                 # e.g. v5litepod-16
    generation: str
    size: int
    hosts: int

    @property
    def default_runtime_version(self) -> str | None:
        spec = GENERATIONS.get(self.generation)
        return spec.runtime_version if spec else None


def parse(accelerator_type: str, hosts_override: int | None = None) -> SliceType:
    """``v5litepod-16`` -> 4 hosts; unknown generations need ``--hosts_per_slice``."""
    match = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", accelerator_type or "")
    if not match:
        raise UserError(f"--accelerator_type={accelerator_type!r} is not of the form "
                        "GENERATION-SIZE as gcloud spells it, e.g. v5litepod-16, v5p-64, "
                        "v4-32, v6e-16.")
    generation, size = match.group(1), int(match.group(2))
    if generation in ALIASES:
        proper = f"{ALIASES[generation]}-{size}"
        raise UserError(f"--accelerator_type={accelerator_type}: Cloud TPU names this type "
                        f"{proper}; pass --accelerator_type={proper}.")
    if hosts_override is not None:
        if hosts_override < 1:
            raise UserError(f"--hosts_per_slice={hosts_override} must be at least 1.")
        return SliceType(accelerator_type, generation, size, hosts_override)
    spec = GENERATIONS.get(generation)
    if spec is None:
        raise UserError(f"--accelerator_type={accelerator_type}: unknown TPU generation "
                        f"{generation!r} (known: {', '.join(GENERATIONS)}). Pass "
                        "--hosts_per_slice=N and --runtime_version=IMAGE for it.")
    if size <= spec.single_host_max:
        return SliceType(accelerator_type, generation, size, 1)
    if size % spec.units_per_host:
        raise UserError(f"--accelerator_type={accelerator_type}: a multi-host {generation} slice "
                        f"has a multiple of {spec.units_per_host} {spec.unit}; pick a size "
                        "Cloud TPU offers (gcloud compute tpus accelerator-types list).")
    return SliceType(accelerator_type, generation, size, size // spec.units_per_host)
