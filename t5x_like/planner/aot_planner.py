"""Compile a config for a topology ahead of time, without the chips: per-device memory,
whether it fits HBM, FLOPs, HBM traffic by source and a roofline step time and MFU.

The service behind ``python -m t5x_like.plan`` (which formats its reports) and
``scaling plan --topology`` (which plans the compute-optimal model it picks). TPU
topologies compile through libtpu's compiler via ``jax.experimental.topologies`` (no TPU
needed; ``topology.prepare_compiler_environment`` before JAX starts), ``cpu:N`` on fake
CPU devices. It imports JAX at its top: the commands import it after their config is read
(``planner/topology.py`` is what they need before). The roofline is ``max(FLOPs / peak,
bytes accessed / HBM bandwidth, collective bytes / link bandwidth)`` per device
(``hlo_collectives``): an optimistic bound, each taken to overlap the others. Beside it,
a prediction: the compiled schedule played instruction by instruction on the chip
(``step_time``: per-op matmul fill and HBM time, collectives overlapped only where the
compiler made them asynchronous).
"""

from __future__ import annotations

import importlib.util
import math
import re

import jax
import numpy as np
from jax.experimental import topologies
from jax.sharding import NamedSharding, PartitionSpec

from t5x_like import errors, modes, structures
from t5x_like.checkpoints import int8_weights
from t5x_like.config import spec_of
from t5x_like.engine import flops, partitioning
from t5x_like.engine import trainer as trainer_lib
from t5x_like.models import pipeline_parallel
from t5x_like.planner import hlo_collectives, hlo_matmuls, hlo_traffic, step_time
from t5x_like.planner.topology import GiB, PlanError, parse_topology, prepare_compiler_environment
from t5x_like.system import hardware, platforms

__all__ = ["GiB", "PlanError", "parse_topology", "per_device_bytes", "plan", "plan_decode",
           "prepare_compiler_environment", "topology_devices"]

# How many of the largest sources of HBM traffic a report names.
TRAFFIC_ROWS = 8


def topology_devices(text: str, num_slices: int = 1) -> list:
    """Devices to compile for; no hardware is touched for TPU topologies. ``num_slices``
    copies of a TPU topology joined over DCN make a multi-slice target."""
    platform, spec = parse_topology(text)
    if num_slices < 1 or (num_slices > 1 and platform == "cpu"):
        raise PlanError(f"--num_slices={num_slices}: give a positive number of TPU slices; "
                        "for CPU, rehearse slices with --config.mesh.dcn on cpu:N.")
    if platform == "cpu":
        try:
            jax.config.update("jax_num_cpu_devices", spec)
        except RuntimeError:  # JAX already started (in a test): its devices are what there is
            pass
        devices = jax.devices("cpu")
        if len(devices) < spec:
            raise PlanError(f"--topology=cpu:{spec}: JAX was started with {len(devices)} CPU "
                            "devices; run the planner in a fresh process.")
        return devices[:spec]
    try:
        with platforms.without_stderr_lines(platforms.LIBTPU_NO_CHIP_NOTICE):
            return list(topologies.get_topology_desc(platform="tpu", topology_name=spec,
                                                     num_slices=num_slices).devices)
    except Exception as e:  # noqa: BLE001 - the compiler's errors vary by cause
        if importlib.util.find_spec("libtpu") is None:
            raise PlanError(f"Cannot compile for {spec}: libtpu is not installed. TPU topologies "
                            f"need it: {errors.install_hint('tpu')} (works without a TPU).") from e
        raise PlanError(f"Cannot compile for {spec}: {str(e).splitlines()[0]}") from e


def per_device_bytes(abstract_tree) -> list[tuple[str, int]]:
    """(path, bytes on one device) for every leaf, from its sharding's shard shape."""
    rows = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_tree)[0]:
        shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
        rows.append((jax.tree_util.keystr(path, simple=True, separator="/"),
                     int(np.prod(shape)) * np.dtype(leaf.dtype).itemsize))
    return rows


_SCANNED_NOTE = ("scanned layers: matmul FLOPs and bytes with each loop body counted as many "
                 "times as it runs (recomputation included); the roofline takes the larger of "
                 "those FLOPs and the model's (a fused attention kernel is a custom call no "
                 "count sees)")


def _pipeline(config, mesh_shape) -> dict:
    """Stages, microbatches, laps and the bubble of a pipelined plan ({} without stages)."""

    part = config.partitioning
    stages = mesh_shape["stage"] * (mesh_shape["dcn"] if part.pipeline_over_dcn else 1)
    if stages == 1:
        return {}
    settings = trainer_lib.pipeline_settings(config)
    microbatches = settings.num_microbatches(stages)
    repeats = settings.repeats(config.model.num_layers, stages)
    return {"schedule": part.pipeline_schedule, "stages": stages, "microbatches": microbatches,
            "repeats": repeats, "over_dcn": part.pipeline_over_dcn,
            "bubble": pipeline_parallel.bubble_fraction(stages, microbatches, repeats)}


def plan(config, topology: str, num_slices: int = 1) -> dict:
    """Compiles ``config``'s train step for ``topology`` (``num_slices`` of them joined
    over DCN); returns the report as a dict."""

    config = spec_of(config)
    devices = topology_devices(topology, num_slices)
    hardware.check_quantization(config.quantization.kind, devices[0].device_kind)
    mesh_shape, trainer = trainer_lib.build_on_devices(config, devices, process_count=1)
    structure = structures.for_config(config)
    batch = structure.abstract_batch(config.task_feature_lengths, config.batch_size,
                                     trainer.batch_sharding)
    state_rows = per_device_bytes(trainer.abstract_state) + _planned_frozen(
        config, trainer, structure)
    lowered = trainer.lower_train_step(trainer.abstract_state, batch)
    compiler_oom = None
    try:
        compiled = lowered.compile()
    except Exception as e:  # noqa: BLE001 - only the TPU compiler's out-of-memory is handled
        compiler_oom = _out_of_memory_temporaries(str(e))
        if compiler_oom is None:
            raise
    if compiler_oom is None:
        arguments, outputs, aliased, temporaries, code, host = _memory(compiled)
        # XLA's cost analysis counts a loop body once: the layers' scan and the
        # microbatches' run many times. Reading the HLO, the bytes and the matmuls'
        # FLOPs are weighted by trip counts (the rest of the FLOPs, elementwise work of
        # a few percent, stays as XLA counts it).
        hlo_text = compiled.as_text()
        xla_flops, xla_bytes, traffic, traffic_error = _costs(compiled, hlo_text)
        per_trip, once = hlo_matmuls.matmul_flops(hlo_text)
        compiled_flops = xla_flops + per_trip - once
        if traffic is not None and traffic.loop_bodies_once_bytes:
            bytes_accessed = xla_bytes * traffic.total_bytes / traffic.loop_bodies_once_bytes
        else:
            bytes_accessed = xla_bytes * (per_trip / once if once else 1.0)  # an estimate
    else:
        # libtpu refuses a program over HBM and says only how much its temporaries
        # need; the state and batch sizes follow from their shardings.
        temporaries, message = compiler_oom
        arguments = sum(b for _, b in state_rows + per_device_bytes(batch))
        outputs = aliased = sum(b for _, b in state_rows)  # the donated state
        code, compiled_flops, bytes_accessed, traffic, host = 0, None, None, None, 0
    # Donated state: outputs reuse the argument buffers they alias.
    total = arguments + outputs - aliased + temporaries + code

    kind = devices[0].device_kind
    chip = hardware.chip_for(kind)
    peak = hardware.peak_flops(kind, config.logging.peak_flops_per_device)
    model_flops = flops.train_flops_per_step(config.model, config.task_feature_lengths,
                                             config.batch_size)
    state_bytes = _state_bytes(state_rows)
    report = {
        "config_model": config.model.family, "topology": topology, "num_slices": num_slices,
        "device_kind": kind,
        "num_devices": len(devices), "mesh": mesh_shape, "rules": config.partitioning.rules,
        "batch_size": config.batch_size, "microbatches": config.optimizer.microbatches,
        "memory_per_device": {"arguments": arguments, "outputs": outputs, "aliased": aliased,
                              "temporaries": temporaries, "code": code, "total": total,
                              "host_temporaries": host, **state_bytes},
        "hbm_per_device": chip.hbm_bytes if chip else None,
        "fits": (total <= chip.hbm_bytes and compiler_oom is None) if chip else None,
        "compiler_out_of_memory": compiler_oom[1] if compiler_oom else None,
        "compiled_flops_per_device": compiled_flops,
        "bytes_accessed_per_device": bytes_accessed,
        "model_flops_per_step": model_flops,
        "peak_flops_per_device": peak,
    }
    roofline_flops, roofline_bytes = compiled_flops, bytes_accessed
    staged = _pipeline(config, mesh_shape)
    report.update({"pipeline": staged} if staged else {})
    if compiled_flops and config.model.numerics.scan_layers:
        # A fused attention kernel (splash, on TPU) is a custom call no FLOP count sees:
        # the roofline takes the larger of the compiled count (recomputation included)
        # and the model's FLOPs, whose pipeline stages also compute through the bubble.
        roofline_flops = max(compiled_flops,
                             model_flops / len(devices) / (1 - staged.get("bubble", 0.0)))
        report["note"] = _SCANNED_NOTE
    if compiler_oom is None and traffic is None:
        report["traffic_note"] = (f"the HLO traffic reader failed ({traffic_error}); bytes "
                                  "count each loop body once, so HBM time is underestimated")
    report.update(_traffic_by_source(traffic, bytes_accessed))
    communication_s = None
    if compiler_oom is None:
        communication = _collectives(hlo_text, mesh_shape, chip)
        report["collectives_per_device"] = communication
        if communication is not None and all(row["seconds"] is not None for row in communication):
            communication_s = sum(row["seconds"] for row in communication)
    if compiler_oom is None and config.quantization.kind:
        report["quantization"] = _quantized_rates(config, hlo_text, kind, peak)
    if peak and chip and roofline_flops is not None:
        roof = _roofline(roofline_flops, roofline_bytes, _roofline_peak(report), chip,
                         communication_s)
        report["roofline"] = dict(roof, mfu=model_flops / (len(devices) * peak * roof["step_s"]))
    if compiler_oom is None and chip is not None and chip.peak_flops:
        report.update(_predicted(hlo_text, mesh_shape, chip, model_flops, len(devices), peak))
    report.update(_largest(state_rows, state_bytes, temporaries))
    return report


def _memory(compiled) -> tuple[int, ...]:
    """Bytes per device of the compiled step's arguments, outputs, outputs aliasing
    arguments, temporaries, code, and of what it keeps in host memory
    (``remat_policy=offload``'s block inputs)."""
    memory = compiled.memory_analysis()
    return (memory.argument_size_in_bytes, memory.output_size_in_bytes,
            memory.alias_size_in_bytes, memory.temp_size_in_bytes,
            memory.generated_code_size_in_bytes,
            int(getattr(memory, "host_temp_size_in_bytes", 0) or 0))


def _predicted(hlo_text: str, mesh_shape: dict, chip, model_flops: float, devices: int,
               peak: float) -> dict:
    """``{"predicted": ...}``: the compiled schedule played on the chip
    (``step_time.predict``) and the MFU it gives; a note when the HLO is misread."""
    try:
        predicted = step_time.predict(hlo_text, _every_axis(mesh_shape), chip)
    except (ValueError, KeyError, StopIteration) as e:
        return {"prediction_note": f"the schedule reader failed ({e!r}); no prediction"}
    return {"predicted": dict(predicted.to_dict(),
                              mfu=step_time.mfu(predicted, model_flops, devices, peak))}


def _quantized_rates(config, hlo_text: str, device_kind: str, peak: float | None) -> dict:
    """What of a quantized step's matmuls runs on int8 or fp8 units (``hlo_matmuls``), the
    chip's rate for them, and the one rate the roofline's compute time takes: each FLOP
    at its own peak, ``1 / (share / quantized peak + (1 - share) / peak)``. MFU stays
    against the bfloat16 peak, as MaxText reports it, so runs compare."""
    kind = config.quantization.kind
    share = hlo_matmuls.low_precision_share(hlo_matmuls.matmul_flops_by_dtype(hlo_text))
    quantized_peak = hardware.peak_for(device_kind, kind, config.logging.peak_flops_per_device)
    effective = (1.0 / (share / quantized_peak + (1.0 - share) / peak)
                 if peak and quantized_peak else None)
    return {"kind": kind, "matmul_share": share, "peak_flops_per_device": quantized_peak,
            "effective_peak_flops_per_device": effective}


def _roofline_peak(report: dict) -> float:
    """The rate the roofline divides FLOPs by: a quantized step's effective peak, else the
    bfloat16 one."""
    quantized = report.get("quantization") or {}
    return quantized.get("effective_peak_flops_per_device") or report["peak_flops_per_device"]


def _largest(state_rows, state_bytes: dict, temporaries: int) -> dict:
    """What takes the most memory per device: by kind, and the four largest arrays."""
    consumers = [("temporaries (activations, gradients, collectives' buffers)", temporaries),
                 ("params (all)", state_bytes["params"]),
                 ("optimizer state (all)", state_bytes["optimizer_state"])]
    consumers.sort(key=lambda row: -row[1])
    largest_arrays = sorted(state_rows, key=lambda row: -row[1])[:4]
    return {"largest_consumers": [{"name": n, "bytes": b} for n, b in consumers],
            "largest_arrays": [{"name": n, "bytes": b} for n, b in largest_arrays]}


def _state_bytes(state_rows) -> dict[str, int]:
    """Bytes per device of the params, the optimizer state and a frozen reference."""
    return {name: sum(b for path, b in state_rows if path.startswith(prefix))
            for name, prefix in (("params", "params/"), ("optimizer_state", "opt_state/"),
                                 ("frozen_params", "frozen_params/"))}


def _planned_frozen(config, trainer, structure) -> list[tuple[str, int]]:
    """The run's modes' frozen models that plan (``modes.Frozen.planned``: DPO's reference
    or GRPO's KL reference, the policy's own model) in the planned step, frozen and
    abstract (``Trainer.attach_frozen`` with no params); their bytes per device as
    ``frozen_params/...`` rows (none when the run has none)."""
    planned = [frozen for frozen in modes.frozen_of(config) if frozen.planned is not None]
    for frozen in planned:
        frozen.planned(config, trainer, structure)
    return per_device_bytes({"frozen_params": trainer.frozen_params}) if planned else []


def _unscanned(model):
    """A model spec with its layers unrolled (XLA then counts every layer's FLOPs)."""
    return model.replace(numerics=model.numerics.replace(scan_layers=False))


def plan_decode(config, topology: str, num_slices: int = 1, page_size: int = 0,
                pages: int = 0) -> dict:
    """Compiles one generation step of ``config``'s model for ``topology``: a token for
    each of ``batch_size`` rows over a cache of ``task_feature_lengths``
    (``Structure.decode_step``; an encoder-decoder's cross-attention keys and values
    come from the cache). Layers are unrolled, so XLA counts every layer's FLOPs; params
    keep the training shardings, the cache and inputs are split over the batch axes.
    Reports memory per device, FLOPs, HBM bytes, and a roofline time per step and
    tokens/s (``batch_size / step time``).

    With ``page_size``, the step of the continuous-batching engine
    (``Structure.paged_decode_step``): ``batch_size`` slots, each up to the lengths' sum,
    over a pool of ``pages`` pages (0: every slot at that length, plus the scratch page).
    One engine serves one replica, so its slots and pool are not split over the batch
    axes (a mesh that splits them is refused; serve more replicas); the pool's key/value
    heads split over ``tensor`` where they divide, as the attention's do."""
    config = spec_of(config)
    config = config.replace(model=_unscanned(config.model))
    devices = topology_devices(topology, num_slices)
    mesh_shape, trainer = trainer_lib.build_on_devices(config, devices, process_count=1)
    weights = int8_weights.weights_for(config, structures.for_config(config), trainer)
    mesh = trainer.mesh
    batch_axes = tuple(a for a in partitioning.batch_axes(trainer.rules) if a in mesh.shape)
    split = math.prod(mesh.shape[a] for a in batch_axes)
    paged = _paged(config, page_size, pages, split) if page_size else None
    if paged:
        step, cache, inputs = weights.structure.paged_decode_step(
            paged["slots"], paged["max_length"], page_size, paged["pages"])
    else:
        step, cache, inputs = weights.structure.decode_step(
            config.batch_size, config.task_feature_lengths)

    def sharding(x):
        spec = (PartitionSpec(batch_axes) if x.ndim and x.shape[0] % split == 0
                else PartitionSpec())
        return NamedSharding(mesh, spec)

    def pool_sharding(x):  # [(layers,) key/value heads, pages, ...]: heads over tensor
        tensor, lead = mesh.shape.get("tensor", 1), x.ndim - 4
        heads = lead >= 0 and tensor > 1 and x.shape[lead] % tensor == 0
        return NamedSharding(mesh, PartitionSpec(*[None] * lead, "tensor") if heads
                             else PartitionSpec())
    cache_shardings = jax.tree.map(pool_sharding if paged else sharding, cache)
    jitted = jax.jit(step, in_shardings=(weights.shardings, cache_shardings,
                                         *map(sharding, inputs)),
                     out_shardings=(None, cache_shardings), donate_argnums=1)
    with trainer_lib._MeshAndRules(mesh, trainer.rules, trainer.context_settings,
                                   trainer.pipeline_settings):
        lowered = jitted.lower(weights.abstract_params, cache, *inputs)
    try:
        compiled, compiler_oom = lowered.compile(), None
    except Exception as e:  # noqa: BLE001 - only the TPU compiler's out-of-memory is handled
        compiled, compiler_oom = None, _out_of_memory_temporaries(str(e))
        if compiler_oom is None:
            raise
    state_rows = per_device_bytes({"params": weights.abstract_params})
    params_bytes = sum(b for p, b in state_rows if p.startswith("params/"))
    cache_bytes = sum(b for _, b in per_device_bytes(jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), cache, cache_shardings)))
    if compiled is not None:
        memory = compiled.memory_analysis()
        flops, xla_bytes, traffic, _ = _costs(compiled, compiled.as_text())
        hbm_bytes = (xla_bytes * traffic.total_bytes / traffic.loop_bodies_once_bytes
                     if traffic is not None and traffic.loop_bodies_once_bytes else xla_bytes)
        arguments, temporaries = memory.argument_size_in_bytes, memory.temp_size_in_bytes
        total = (arguments + memory.output_size_in_bytes - memory.alias_size_in_bytes
                 + temporaries + memory.generated_code_size_in_bytes)
    else:
        # libtpu refuses a program over HBM and says only what its temporaries need.
        flops = hbm_bytes = traffic = None
        arguments = params_bytes + cache_bytes
        temporaries = compiler_oom[0]
        total = arguments + temporaries
    kind = devices[0].device_kind
    chip = hardware.chip_for(kind)
    peak = hardware.peak_flops(kind, config.logging.peak_flops_per_device)
    report = {
        "config_model": config.model.family, "topology": topology, "num_slices": num_slices,
        "device_kind": kind, "num_devices": len(devices), "mesh": mesh_shape,
        "rules": config.partitioning.rules, "batch_size": config.batch_size,
        "lengths": dict(config.task_feature_lengths),
        "weights": config.quantization.weights or "float",
        "memory_per_device": {"params": params_bytes, "cache": cache_bytes,
                              "arguments": arguments, "temporaries": temporaries,
                              "total": total},
        "hbm_per_device": chip.hbm_bytes if chip else None,
        "fits": (total <= chip.hbm_bytes and compiler_oom is None) if chip else None,
        "compiler_out_of_memory": compiler_oom[1] if compiler_oom else None,
        "flops_per_device": flops, "bytes_accessed_per_device": hbm_bytes,
    }
    if paged:
        report["pages"] = paged
    report.update(_traffic_by_source(traffic, hbm_bytes))
    if peak and chip and flops is not None:
        roof = _roofline(flops, hbm_bytes, peak, chip)
        report["roofline"] = dict(roof, tokens_per_s=config.batch_size / roof["step_s"])
    return report


def _paged(config, page_size: int, pages: int, split: int) -> dict:
    """The engine's layout for ``plan --decode --page_size``: slots, the longest row,
    pages per row and the pool; its mistakes refused in one line."""
    slots, max_length = config.batch_size, sum(dict(config.task_feature_lengths).values())
    if page_size < 1:
        raise errors.UserError(f"--page_size={page_size}: give a positive number of positions.")
    if split > 1:
        raise errors.UserError(
            f"plan --decode --page_size: the mesh splits the batch over {split} devices; one "
            "engine serves one replica (its slots and page pool are not split), so put the "
            "chips on tensor (--config.mesh.data=1 --config.mesh.fsdp=1 "
            "--config.mesh.tensor=-1) and serve more replicas for more throughput.")
    per_row = -(-max_length // page_size)
    pool = pages or slots * per_row + 1
    if pool < per_row + 1:
        raise errors.UserError(f"--pages={pool}: a row of {max_length} positions needs "
                               f"{per_row} pages of {page_size}, plus the scratch page; give "
                               f"--pages={per_row + 1} or more (0: every slot full).")
    return {"slots": slots, "max_length": max_length, "page_size": page_size,
            "pages_per_row": per_row, "pages": pool, "full_pool": slots * per_row + 1}


def _costs(compiled, hlo_text: str):
    """``(FLOPs, bytes accessed, traffic, traffic_error)`` of a compiled program: XLA's
    counts (loop bodies once) and the HLO reader's traffic (None when it misreads)."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    try:
        traffic, error = hlo_traffic.analyze(hlo_text), None
    except (ValueError, KeyError, StopIteration) as e:  # HLO text this reader misreads
        traffic, error = None, f"{type(e).__name__}: {e}"
    return (float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)), traffic,
            error)


def _traffic_by_source(traffic, bytes_accessed) -> dict:
    """``{"hbm_traffic_by_source": rows}``: the sources moving the most bytes, each with
    its share of ``bytes_accessed``; empty without a traffic reading."""
    if traffic is None or not traffic.total_bytes:
        return {}
    return {"hbm_traffic_by_source": [
        {"source": source, "share": moved / traffic.total_bytes,
         "bytes": bytes_accessed * moved / traffic.total_bytes}
        for source, moved in hlo_traffic.by_source(traffic)[:TRAFFIC_ROWS]]}


def _roofline(flops: float, bytes_accessed: float, peak: float, chip,
              communication_s: float | None = None) -> dict:
    """The step time bound ``max(FLOPs / peak, bytes / HBM bandwidth, collectives' bytes /
    link bandwidth)`` and which bounds it. Taking the largest assumes each overlaps the
    others (XLA runs collectives asynchronously beside compute); their sum would be the
    pessimistic bound. Without the chip's links, communication is left out."""
    compute_s, memory_s = flops / peak, bytes_accessed / chip.hbm_bandwidth
    bound, step_s = _slowest(compute_s, memory_s, communication_s)
    return {"compute_s": compute_s, "memory_s": memory_s, "communication_s": communication_s,
            "step_s": step_s, "bound": bound}


def _slowest(compute_s: float, memory_s: float, communication_s: float | None
             ) -> tuple[str, float]:
    """``(bound, seconds)``: which of the roofline's times is largest (compute wins ties;
    communication counts only when known)."""
    times = {"compute": compute_s, "memory": memory_s}
    if communication_s is not None:
        times["communication"] = communication_s
    bound = max(times, key=times.get)
    return bound, times[bound]


def _every_axis(mesh_shape: dict) -> dict[str, int]:
    """The mesh's size along every axis, in the mesh's order: the device order the
    compiled program's collective groups index."""
    return {axis: int(mesh_shape.get(axis, 1)) for axis in partitioning.MESH_AXES}


def _collectives(hlo_text: str, mesh_shape: dict, chip) -> list[dict] | None:
    """The collectives' bytes, counts and seconds per device and step, by the mesh axes
    they cross (``hlo_collectives``), largest first; None when the HLO is misread."""
    shape = _every_axis(mesh_shape)
    try:
        found = hlo_collectives.analyze(hlo_text, shape)
    except (ValueError, KeyError, StopIteration):
        return None
    seconds = hlo_collectives.communication_seconds(found, chip, shape) or {}
    rows = [{"axes": axes, "bytes": moved, "count": found.count_by_axes[axes],
             "seconds": seconds.get(axes)} for axes, moved in found.bytes_by_axes.items()]
    return sorted(rows, key=lambda row: -row["bytes"])


def _out_of_memory_temporaries(message: str) -> tuple[int, str] | None:
    """(bytes, message) from libtpu's "HLO temporaries (144.01G) exceeds available HBM"."""
    found = re.search(r"temporaries \(([\d.]+)([KMGT])\)", message)
    if "RESOURCE_EXHAUSTED" not in message or not found:
        return None
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}[found.group(2)]
    line = next(text for text in message.splitlines() if "RESOURCE_EXHAUSTED" in text)
    return int(float(found.group(1)) * scale), line.strip()
