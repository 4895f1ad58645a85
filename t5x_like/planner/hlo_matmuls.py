"""A compiled step's matmul FLOPs by the dtype of their operands, loops counted as many
times as they run: what share of the work runs on int8 or fp8 units.

XLA's cost analysis counts an int8 matmul's FLOPs as it counts a bfloat16 one's, and a
quantized step still has matmuls in the compute dtype (attention's scores, a router,
the logits). The planner's roofline needs the split: the quantized matmuls run at the
chip's int8 or fp8 rate, the rest at bfloat16's. This reads ``compiled.as_text()``:
every ``dot`` and ``convolution`` (fused ones too), the dtype of its operands (both
int8, both fp8, or other; an operand widened just before the dot, as XLA:CPU widens
int8 to int32 to emulate it, counts as what it was), and ``2 x output elements x contracted size`` FLOPs. A dot
names its contracting dimensions; for a convolution (how TPUs lower most dots) the
contracted size is ``sqrt(lhs x rhs / output elements)``, exact for a dense layer's
matmul (no batch dimensions), which is what Qwix quantizes.
"""

from __future__ import annotations

import collections
import math
import re

from t5x_like.planner import hlo_traffic

_DIMS = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([0-9,]*)\}")
_FUSION_CALLS = re.compile(r"\bcalls=%([\w.\-]+)")
LOW_PRECISION = ("s8", "u8", "f8e4m3fn", "f8e5m2", "f8e4m3", "s4", "u4")


def _array(type_text: str) -> tuple[str, list[int]] | None:
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
    out = _array(instruction.type_text)
    operands = [_array(instructions[name].type_text) if name in instructions else None
                for name in instruction.operands[:2]]
    sources = [_array(_widened_from(name, instructions, computations))
               for name in instruction.operands[:2]]
    if out is None or len(operands) < 2 or None in operands:
        return None
    (_, lhs), (_, rhs) = operands
    lhs_dtype, rhs_dtype = (source[0] if source else "" for source in sources)
    out_elements = math.prod(out[1])
    contracting = _CONTRACTING.search(instruction.attributes)
    if instruction.opcode == "dot" and contracting:
        contracted = math.prod(lhs[int(d)] for d in contracting.group(1).split(",") if d)
    else:
        contracted = math.sqrt(math.prod(lhs) * math.prod(rhs) / max(out_elements, 1))
    dtype = lhs_dtype if lhs_dtype == rhs_dtype else "mixed"
    return dtype, 2.0 * out_elements * contracted


def matmul_flops_by_dtype(hlo_text: str) -> dict[str, float]:
    """``{operand dtype: FLOPs}`` of every matmul a step runs (``mixed`` where the two
    operands differ), each multiplied by the trip counts of the loops around it."""
    computations = hlo_traffic.parse(hlo_text)
    instructions = {i.name: i for c in computations.values() for i in c.instructions}
    times: dict[str, int] = collections.Counter()
    for instruction, count in hlo_traffic.weighted_instructions(computations, lambda c: 0):
        times[instruction.name] = count
        for called in _FUSION_CALLS.findall(instruction.attributes):
            if instruction.opcode == "fusion" and called in computations:
                for inner in _fused(computations, called):
                    times[inner.name] += count
    totals: dict[str, float] = collections.defaultdict(float)
    for computation in computations.values():
        for instruction in computation.instructions:
            if instruction.opcode not in ("dot", "convolution") or not times.get(instruction.name):
                continue
            counted = _flops(instruction, instructions, computations)
            if counted:
                totals[counted[0]] += counted[1] * times[instruction.name]
    return dict(totals)


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
