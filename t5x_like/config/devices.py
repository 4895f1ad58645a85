"""The checks of a spec that need the device, process and slice counts (and, for the
input streams, the checkpoint being resumed): arithmetic only, so the planner and the
launcher can run them for devices they do not have."""

from __future__ import annotations

import math

from t5x_like.config.run import RunSpec
from t5x_like.errors import ConfigError

DEFAULT_DATA_STREAMS = 8


def resolve_mesh_shape(mesh: dict[str, int], num_devices: int, num_slices: int = 1
                       ) -> dict[str, int]:
    """Fills ``-1`` (and ``dcn=0``: the ``num_slices`` found) and checks that the mesh uses
    exactly ``num_devices``."""
    mesh = {"dcn": mesh.get("dcn") or num_slices, **{k: v for k, v in mesh.items() if k != "dcn"}}
    fixed = math.prod(size for size in mesh.values() if size != -1)
    shape = dict(mesh)
    if -1 in mesh.values():
        if num_devices % fixed:
            raise ConfigError(
                f"mesh={dict(mesh)}: the fixed axes use {fixed} devices, which does not divide the "
                f"{num_devices} available; pick axis sizes whose product divides {num_devices}.")
        shape[next(k for k, v in mesh.items() if v == -1)] = num_devices // fixed
    elif fixed != num_devices:
        raise ConfigError(
            f"mesh={dict(mesh)} needs {fixed} devices but {num_devices} are available; set one "
            f"axis to -1 (e.g. --config.mesh.data=-1) or make the product {num_devices}.")
    return shape


def check_devices(spec: RunSpec, num_devices: int, process_count: int = 1,
                  num_slices: int = 1) -> dict[str, int]:
    """Mesh and batch checks that need the device count; returns the resolved mesh shape."""
    shape = resolve_mesh_shape(spec.mesh.to_dict(), num_devices, num_slices)
    if num_slices > 1 and shape["dcn"] != num_slices:
        raise ConfigError(f"The devices span {num_slices} slices but mesh.dcn={shape['dcn']}; "
                          f"set --config.mesh.dcn={num_slices} (or 0 to follow the slices).")
    expert = shape.get("expert", 1)
    over_dcn = spec.partitioning.pipeline_over_dcn
    row_slices = 1 if over_dcn else shape["dcn"]
    batch_parallel = batch_shards(spec, shape)
    batch = spec.batch_size
    if batch % batch_parallel:
        fixed = (batch // batch_parallel + 1) * batch_parallel
        raise ConfigError(
            f"batch_size={batch} does not divide over the data-parallel mesh size "
            f"{batch_parallel} (mesh.dcn={row_slices} x mesh.data={shape['data']} x "
            f"mesh.fsdp={shape['fsdp']} x mesh.expert={expert}); use a multiple of "
            f"{batch_parallel}, e.g. --config.batch_size={fixed}.")
    num_experts = spec.model.expert_count
    if expert > 1 and num_experts % expert:
        raise ConfigError(
            f"mesh.expert={expert} does not divide model.experts.num_experts={num_experts}; each "
            "device along the expert axis holds an equal share of the experts: make "
            f"mesh.expert a divisor of {num_experts}.")
    microbatches = spec.optimizer.microbatches
    if batch % (batch_parallel * microbatches):
        raise ConfigError(
            f"batch_size={batch} does not split into optimizer.microbatches={microbatches} "
            f"microbatches that each divide over the data-parallel mesh size {batch_parallel}; "
            f"use a batch_size that is a multiple of {batch_parallel * microbatches}.")
    if batch % process_count:
        raise ConfigError(f"batch_size={batch} does not divide over {process_count} "
                          f"processes; use a multiple of {process_count}.")
    check_context(spec, shape["context"])
    check_pipeline(spec, shape["stage"] * (shape["dcn"] if over_dcn else 1), shape,
                   batch // (batch_parallel * microbatches), process_count)
    resolve_data_streams(spec, process_count)
    return shape


def batch_shards(spec: RunSpec, shape: dict[str, int]) -> int:
    """How many parts a resolved mesh ``shape`` splits each batch's rows into: the data,
    FSDP and expert axes (rows cross the expert axis outside the experts) and the slices,
    unless a pipeline's stages use them."""
    row_slices = 1 if spec.partitioning.pipeline_over_dcn else shape["dcn"]
    return row_slices * shape["data"] * shape["fsdp"] * shape.get("expert", 1)


def rows_per_device(spec: RunSpec, shape: dict[str, int]) -> int:
    """The rows each device holds at a time: a batch shard's rows in one microbatch."""
    return spec.batch_size // (batch_shards(spec, shape) * spec.optimizer.microbatches)


def microbatches_holding(spec: RunSpec, shape: dict[str, int], held: int) -> int:
    """The fewest optimizer microbatches that split each batch shard's rows into parts of
    at most ``held`` rows (a divisor of the rows, so every part is equal)."""
    rows = spec.batch_size // batch_shards(spec, shape)
    return next(m for m in range(1, rows + 1) if rows % m == 0 and rows // m <= held)


def check_context(spec: RunSpec, context: int) -> None:
    """What a ``mesh.context`` axis needs: a family that splits its rows, every feature
    length in equal parts (two per device when a causal model is load-balanced), and
    no attention dropout or peft prefix (neither is built across the axis)."""
    if context == 1:
        return
    model = spec.model
    kind = type(model).CONTEXT_PARALLEL
    if not kind:
        raise ConfigError(
            f"mesh.context={context}: model.family={model.family!r} does not split its rows "
            "over a context axis (decoders and BERT-style encoders do); set "
            "--config.mesh.context=1 and shard it with mesh.fsdp or mesh.tensor.")
    refusal = model.context_refusal()
    if refusal:
        raise ConfigError(f"mesh.context={context}: {refusal}.")
    if model.dropout_rate > 0:
        raise ConfigError(
            f"mesh.context={context} with model.dropout_rate={model.dropout_rate}: attention "
            "dropout is not built across a context axis; set --config.model.dropout_rate=0 "
            "(long-context pretraining runs without it).")
    if spec.peft.prefix.length:
        raise ConfigError(f"mesh.context={context}: prefix tuning's keys sit outside the split "
                          "rows; set --config.mesh.context=1 for peft.prefix.")
    balanced = kind == "causal" and spec.partitioning.context_load_balance
    parts = 2 * context if balanced else context
    for name, length in spec.task_feature_lengths.items():
        if length % parts:
            why = " (load-balanced: two parts a device)" if balanced else ""
            raise ConfigError(
                f"task_feature_lengths.{name}={length} does not split into {parts} equal parts "
                f"over mesh.context={context}{why}; use a multiple of {parts}, e.g. "
                f"--config.task_feature_lengths.{name}={-(-length // parts) * parts}.")


def check_pipeline(spec: RunSpec, stages: int, shape: dict[str, int], rows: int,
                   process_count: int) -> None:
    """What pipeline stages need (``models/pipeline_parallel.py``): a family with one scanned stack
    whose layers the stages (and a circular schedule's visits) divide, microbatches that
    split each device's rows, and nothing the pipeline does not carry between stages.
    ``rows``: each device's rows of one optimizer microbatch."""
    if stages == 1:
        return
    model, part = spec.model, spec.partitioning
    where = (f"mesh.stage={shape['stage']} x mesh.dcn={shape['dcn']} (pipeline_over_dcn)"
             if part.pipeline_over_dcn else f"mesh.stage={stages}")
    if not type(model).PIPELINE:
        raise ConfigError(
            f"{where}: model.family={model.family!r} is not built as a pipeline (decoders and "
            "BERT-style encoders are; an encoder-decoder's two stacks are not); set "
            "--config.mesh.stage=1 and shard it with mesh.fsdp or mesh.tensor.")
    refusal = model.pipeline_refusal()
    if refusal:
        raise ConfigError(f"{where}: {refusal}.")
    why = ("model.numerics.scan_layers=False: stages split a scanned stack; set "
           "--config.model.numerics.scan_layers=True" if not model.numerics.scan_layers else
           f"model.dropout_rate={model.dropout_rate}: dropout is not carried through the "
           "stages; set --config.model.dropout_rate=0" if model.dropout_rate > 0 else
           "a mixture of experts' router statistics are not carried through the stages; set "
           "--config.mesh.stage=1 and use mesh.expert" if model.expert_count else
           f"mesh.context={shape['context']}: context and pipeline axes are not combined; set "
           "--config.mesh.context=1" if shape["context"] > 1 else
           "parameter-efficient tuning is not built over stages; set --config.mesh.stage=1"
           if spec.peft.enabled else
           f"{process_count} processes: every process of a stage would need the same rows, "
           "which the input streams do not give yet; run pipelines in one process per slice"
           if process_count > 1 else "")
    if why:
        raise ConfigError(f"{where} with {why}.")
    layers = model.num_layers
    per_visit = stages * (part.pipeline_layers_per_stage if part.pipeline_schedule == "circular"
                          else 1)
    if layers % per_visit:
        what = (f"{stages} stages x pipeline_layers_per_stage="
                f"{part.pipeline_layers_per_stage}" if part.pipeline_schedule == "circular"
                else f"{stages} stages")
        raise ConfigError(f"model.num_layers={layers} does not split over {what}; use a mesh.stage "
                          f"(or pipeline_layers_per_stage) whose product divides {layers}.")
    microbatches = part.pipeline_microbatches or stages
    if rows % microbatches:
        raise ConfigError(
            f"Each device's {rows} rows a step do not split into partitioning.pipeline_microbatches"
            f"={microbatches}; use a batch_size giving a multiple of {microbatches} rows a "
            "device, or fewer microbatches.")
    if part.pipeline_schedule == "circular" and microbatches < stages:
        raise ConfigError(
            f"partitioning.pipeline_microbatches={microbatches} is fewer than the {stages} "
            "stages: a circular schedule starts a microbatch's next visit as its last one "
            f"ends; use at least {stages} (or 0: one a stage).")


def default_data_streams(batch_size: int, process_count: int) -> int:
    """A new run's stream count: one that does not depend on the process count (the
    largest divisor of the batch up to 8) whenever the processes divide it, so a run
    on 1, 2, 4 or 8 processes sees the same batches; else one stream per process."""
    streams = math.gcd(batch_size, DEFAULT_DATA_STREAMS)
    return streams if streams % process_count == 0 else process_count


def resolve_data_streams(spec: RunSpec, process_count: int, saved_config: dict | None = None
                         ) -> int:
    """The number of input streams V, checked against the batch and the processes.

    ``saved_config``: the config of the checkpoint being resumed (old or new layout),
    whose resolved stream count a resumed run must keep; checkpoints from before
    streams existed hold one stream.
    """
    asked = spec.data.streams
    saved = None if saved_config is None else saved_streams(saved_config)
    if asked and saved is not None and asked != saved:
        raise ConfigError(
            f"data.streams={asked}, but the checkpoint being resumed was saved with {saved} "
            "input streams, which fix the order of the data. Set "
            f"--config.data.streams={saved} (or 0: take the checkpoint's) to resume, or use a "
            "new --workdir.")
    streams = asked or saved or default_data_streams(spec.prompts_per_step(), process_count)
    origin = (f"data.streams={asked}" if asked else
              f"data.streams=0 resumes with the checkpoint's {saved} streams" if saved else
              f"data.streams=0 gives {streams} streams here")
    rows = spec.prompts_per_step()
    if rows % streams:
        what = (f"batch_size={spec.batch_size}" if rows == spec.batch_size else
                f"The {rows} prompts a step samples (batch_size / rl.num_generations)")
        raise ConfigError(
            f"{what} does not split over the input streams ({origin}); use a batch_size that "
            f"is a multiple of {streams}, or set --config.data.streams to a divisor of {rows} "
            "that the process count divides.")
    if streams % process_count:
        hint = (f"run on a process count that divides {saved}" if saved else
                f"set --config.data.streams to a multiple of {process_count}")
        raise ConfigError(f"The input streams ({origin}) do not divide over {process_count} "
                          f"processes; {hint}.")
    return streams


def saved_streams(saved_config: dict) -> int:
    """The stream count a checkpoint's config recorded (either layout; 1 before streams)."""
    data = saved_config.get("data")
    found = data.get("streams") if isinstance(data, dict) else saved_config.get("data_streams")
    return found or 1
