"""A compiled step's matmul FLOPs by the dtype of their operands, loops counted as many
times as they run: what share of the work runs on int8 or fp8 units.

XLA's cost analysis counts an int8 matmul's FLOPs as it counts a bfloat16 one's, and a
quantized step still has matmuls in the compute dtype (attention's scores, a router,
the logits). The planner's roofline needs the split: the quantized matmuls run at the
chip's int8 or fp8 rate, the rest at bfloat16's. This reads ``compiled.as_text()``:
every ``dot`` and ``convolution`` (fused ones too), the dtype of its operands (both
int8, both fp8, or other; an operand widened just before the dot, as XLA:CPU widens
int8 to int32 to emulate it, counts as what it was), and its FLOPs. A dot's are
``2 x output elements x contracted size`` (it names its contracting dimensions). A
convolution's are counted as XLA's cost analysis counts them: TPUs lower most dots,
batched ones too, to convolutions whose batch dimensions become spatial ones with
dilation, stride and padding, so the multiply-adds are ``batch x input features per
group x output features x`` the valid (output, window) position pairs of each spatial
dimension (those landing on an input element, not on padding or a dilation hole).
"""

from __future__ import annotations

import collections
import math
import re

import numpy as np

from t5x_like.planner import hlo_traffic

_DIMS = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([0-9,]*)\}")
_FUSION_CALLS = re.compile(r"\bcalls=%([\w.\-]+)")
_WINDOW = re.compile(r"\bwindow=\{([^}]*)\}")
_DIM_LABELS = re.compile(r"\bdim_labels=(\w+)_(\w+)->(\w+)")
_GROUPS = re.compile(r"\b(feature|batch)_group_count=([0-9]+)")
LOW_PRECISION = ("s8", "u8", "f8e4m3fn", "f8e5m2", "f8e4m3", "s4", "u4")


def array_shape(type_text: str) -> tuple[str, list[int]] | None:
    """``(dtype, dims)`` of the first array in an HLO type (None: no array)."""
    found = _DIMS.search(type_text)
    if not found:
        return None
    return found.group(1), [int(d) for d in found.group(2).split(",") if d]


def _widened_from(name: str, instructions: dict, computations: dict) -> str:
    """The type text of ``name``, or of what it converts when it is a ``convert`` (or a
    fusion that only converts its one operand)."""
    instruction = instructions.get(name)
    if instruction is None:
        return ""
    if instruction.opcode == "convert" and instruction.operands:
        source = instructions.get(instruction.operands[0])
        return source.type_text if source else instruction.type_text
    called = _FUSION_CALLS.findall(instruction.attributes)
    if (instruction.opcode == "fusion" and len(instruction.operands) == 1 and called
            and called[0] in computations):
        root = computations[called[0]].root
        source = instructions.get(instruction.operands[0])
        if root.opcode == "convert" and source is not None:
            return source.type_text
    return instruction.type_text


def _flops(instruction, instructions: dict, computations: dict) -> tuple[str, float] | None:
    """``(operand dtype, FLOPs)`` of a dot or convolution; the dtype is the operands'
    shared one, or ``mixed``."""
    out = array_shape(instruction.type_text)
    operands = [array_shape(instructions[name].type_text) if name in instructions else None
                for name in instruction.operands[:2]]
    sources = [array_shape(_widened_from(name, instructions, computations))
               for name in instruction.operands[:2]]
    if out is None or len(operands) < 2 or None in operands:
        return None
    (_, lhs), (_, rhs) = operands
    lhs_dtype, rhs_dtype = (source[0] if source else "" for source in sources)
    out_elements = math.prod(out[1])
    contracting = _CONTRACTING.search(instruction.attributes)
    dtype = lhs_dtype if lhs_dtype == rhs_dtype else "mixed"
    if instruction.opcode == "dot" and contracting:
        contracted = math.prod(lhs[int(d)] for d in contracting.group(1).split(",") if d)
        return dtype, 2.0 * out_elements * contracted
    multiply_adds = convolution_multiply_adds(instruction.attributes, lhs, rhs, out[1])
    return (dtype, 2.0 * multiply_adds) if multiply_adds is not None else None


def matmul_work(instruction, instructions: dict, computations: dict,
                width: int) -> list[tuple[float, float]]:
    """``(FLOPs, fill)`` of each matmul one execution of a top-level ``instruction`` runs
    (itself, or those of the fusions it calls). ``fill`` is the share of a ``width`` x
    ``width`` matrix unit its shapes keep busy: the contracted size and the output
    features each padded up to a multiple of ``width`` (1 when ``width`` is 0)."""
    inner = [instruction]
    if instruction.opcode == "fusion":
        inner = [i for called in _FUSION_CALLS.findall(instruction.attributes)
                 if called in computations for i in _fused(computations, called)]
    work = []
    for matmul in inner:
        if matmul.opcode not in ("dot", "convolution"):
            continue
        counted = _flops(matmul, instructions, computations)
        if counted:
            work.append((counted[1], _fill(matmul, instructions, width)))
    return work


def _fill(matmul, instructions: dict, width: int) -> float:
    """The matrix unit's share a matmul's contracted size K and output features N keep
    busy: ``K / pad(K) x N / pad(N)``, padding to multiples of ``width``."""
    if not width:
        return 1.0
    lhs = array_shape(instructions[matmul.operands[0]].type_text)
    rhs = array_shape(instructions[matmul.operands[1]].type_text)
    out = array_shape(matmul.type_text)
    if lhs is None or rhs is None or out is None:
        return 1.0
    if matmul.opcode == "dot":
        dims = {key: [int(d) for d in found.group(1).split(",") if d]
                for key in ("lhs_contracting", "rhs_contracting", "rhs_batch")
                if (found := re.search(key + r"_dims=\{([0-9,]*)\}", matmul.attributes))}
        contracted = math.prod(lhs[1][d] for d in dims.get("lhs_contracting", []))
        kept = [d for d in range(len(rhs[1]))
                if d not in dims.get("rhs_contracting", []) + dims.get("rhs_batch", [])]
        features = math.prod(rhs[1][d] for d in kept)
    else:
        labels = _DIM_LABELS.search(matmul.attributes)
        if not labels:
            return 1.0
        groups = {kind: int(count) for kind, count in _GROUPS.findall(matmul.attributes)}
        contracted = lhs[1][labels.group(1).index("f")] // groups.get("feature", 1)
        features = out[1][labels.group(3).index("f")]

    def share(size: int) -> float:
        return size / (-(-size // width) * width) if size else 1.0
    return share(contracted) * share(features)


def _window(attributes: str) -> dict[str, list[int]]:
    """``window={size=4x2 stride=3x1 pad=0_0x1_1 lhs_dilate=4x2 ...}`` as lists per key
    (``pad`` as ``[low, high, low, high, ...]``); ``{}`` for a window-less convolution."""
    found = _WINDOW.search(attributes)
    if not found:
        return {}
    window = {}
    for item in found.group(1).split():
        key, _, value = item.partition("=")
        window[key] = [int(v) for part in value.split("x") for v in part.split("_")]
    return window


def convolution_multiply_adds(attributes: str, lhs: list[int], rhs: list[int],
                              out: list[int]) -> int | None:
    """A convolution's multiply-adds, as XLA's ``HloCostAnalysis`` counts them: for each
    spatial dimension, the (output, window) position pairs that read an input element
    (inside the input, not padding, not a hole of ``lhs_dilate``), times the batch over
    its groups, the input features over theirs and the output features. None when the
    attributes do not read as a convolution's."""
    labels = _DIM_LABELS.search(attributes)
    if not labels:
        return None
    lhs_labels, rhs_labels, out_labels = labels.groups()
    if not (len(lhs_labels) == len(lhs) and len(rhs_labels) == len(rhs)
            and len(out_labels) == len(out)):
        return None
    groups = {kind: int(count) for kind, count in _GROUPS.findall(attributes)}
    window = _window(attributes)
    spatial = sorted(c for c in lhs_labels if c.isdigit())
    count = 1
    for i, dim in enumerate(spatial):
        size_in = lhs[lhs_labels.index(dim)]
        size_window = rhs[rhs_labels.index(dim)]
        size_out = out[out_labels.index(dim)]
        stride = window.get("stride", [1] * len(spatial))[i]
        low, high = window.get("pad", [0, 0] * len(spatial))[2 * i:2 * i + 2]
        base = window.get("lhs_dilate", [1] * len(spatial))[i]
        dilation = window.get("rhs_dilate", [1] * len(spatial))[i]
        count *= _valid_positions(size_in, size_window, size_out, stride, (low, high), base,
                                  dilation)
    batch = lhs[lhs_labels.index("b")] // groups.get("batch", 1)
    features_in = lhs[lhs_labels.index("f")] // groups.get("feature", 1)
    return batch * features_in * out[out_labels.index("f")] * count


def _valid_positions(size_in: int, size_window: int, size_out: int, stride: int,
                     pad: tuple[int, int], base: int, dilation: int) -> int:
    """How many (output index, window index) pairs of one spatial dimension read an input
    element. A dot's batch dimension lowered to a spatial one (input, window and output
    all ``n``, ``lhs_dilate = n``, ``stride = n - 1``) pairs each output with one window
    position: ``n``, counted without the ``n x n`` loop."""
    low = pad[0]
    if (size_in == size_out == size_window == base and dilation == 1 and pad == (0, 0)
            and stride == max(1, size_in - 1)):
        return size_in
    undilated = (np.arange(size_out)[None, :] * stride - low
                 + np.arange(size_window)[:, None] * dilation)
    return int(np.count_nonzero((undilated % base == 0) & (undilated >= 0)
                                & (undilated // base < size_in)))


def matmul_flops_by_dtype(hlo_text: str) -> dict[str, float]:
    """``{operand dtype: FLOPs}`` of every matmul a step runs (``mixed`` where the two
    operands differ), each multiplied by the trip counts of the loops around it."""
    totals: dict[str, float] = collections.defaultdict(float)
    for dtype, flops, times in _matmuls(hlo_text):
        totals[dtype] += flops * times
    return dict(totals)


def matmul_flops(hlo_text: str) -> tuple[float, float]:
    """``(per trip, once)``: the step's matmul FLOPs with each loop body's counted as
    many times as it runs, and with each counted once, as XLA's cost analysis counts a
    loop body. Their difference is what that analysis misses of a scanned model's (or a
    microbatch loop's) matmuls."""
    counted = list(_matmuls(hlo_text))
    return (sum(flops * times for _, flops, times in counted),
            sum(flops for _, flops, _ in counted))


def _matmuls(hlo_text: str):
    """``(operand dtype, FLOPs, times run)`` of every dot and convolution that runs."""
    computations = hlo_traffic.parse(hlo_text)
    instructions = {i.name: i for c in computations.values() for i in c.instructions}
    times: dict[str, int] = collections.Counter()
    for instruction, count in hlo_traffic.weighted_instructions(computations, lambda c: 0):
        times[instruction.name] = count
        for called in _FUSION_CALLS.findall(instruction.attributes):
            if instruction.opcode == "fusion" and called in computations:
                for inner in _fused(computations, called):
                    times[inner.name] += count
    for computation in computations.values():
        for instruction in computation.instructions:
            if instruction.opcode not in ("dot", "convolution") or not times.get(instruction.name):
                continue
            counted = _flops(instruction, instructions, computations)
            if counted:
                yield counted[0], counted[1], times[instruction.name]


def _fused(computations, name: str, depth: int = 0):
    """The instructions of a fused computation and of the fusions nested in it."""
    if depth > 8:
        return
    for instruction in computations[name].instructions:
        yield instruction
        if instruction.opcode == "fusion":
            for called in _FUSION_CALLS.findall(instruction.attributes):
                if called in computations:
                    yield from _fused(computations, called, depth + 1)


def low_precision_share(flops_by_dtype: dict[str, float]) -> float:
    """The share of matmul FLOPs whose operands are both int8 or both fp8."""
    total = sum(flops_by_dtype.values())
    low = sum(v for k, v in flops_by_dtype.items() if k in LOW_PRECISION)
    return low / total if total else 0.0
