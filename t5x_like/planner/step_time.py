"""A predicted step time: the compiled program's schedule, played op by op on the chip.

The roofline (``aot_planner``) divides the step's FLOPs, HBM bytes and collective bytes
by the chip's peaks and takes the largest, as if everything else hid behind it: a
bound, often far from what runs. This module reads the optimized program instead. Its
text lists each computation's instructions in the order the compiler scheduled them,
and they are played in that order:

- an instruction takes ``max(matmul time, bytes / HBM bandwidth)``: its matmuls' FLOPs
  (fused ones too, ``hlo_matmuls``) at the chip's peak times their *fill*, the share of
  the ``mxu_width`` x ``mxu_width`` matrix unit their contracted size and output
  features keep busy (a size padded to the next multiple), and the bytes it reads and
  writes (``hlo_traffic``). Elementwise work thus runs at HBM speed;
- a Pallas attention kernel (splash: ``splash_mha_fwd``/``_dkv``/``_dq`` custom calls)
  has FLOPs no count sees. They follow from its operands (``[batch, heads, length,
  head_dim]``) and its block mask (``s8[.., n, n]``; a decoder's is causal, so
  ``(n + 1) / 2n`` of the blocks run): 2 matmuls forward, 4 for dK/dV, 3 for dQ, each
  ``2 B H S_q S_k D``, filled as ``head_dim`` fills the unit (both of attention's
  matmuls have it as a contracted or an output size);
- a collective takes its bytes sent over the bandwidth of the links it crosses
  (``hlo_collectives``). An asynchronous one (``*-start`` / ``*-done``, or libtpu's
  ``AsyncCollectiveStart`` / ``Done`` fusions, with its continuations fused into the
  compute between) runs beside whatever is scheduled between its start and its done,
  one collective at a time on the links, and the done waits for it. A synchronous one
  stops the program for its whole time;
- a loop runs its body's time as many times as its trip count says (a scanned stack's
  layers, a pipeline's steps with their bubble, microbatches); a conditional its
  costliest branch.

Nothing is fitted: the chip's numbers are its published peak, HBM and link bandwidths and
matrix-unit width (``system/hardware.py``), and every other number is the compiler's.
What the model leaves out (so the prediction is still optimistic): vector-unit-bound
elementwise work, DMA and launch latencies, pipeline fill of small matmuls, and the
compiler's freedom to overlap HBM-bound instructions with matmul-bound ones.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from t5x_like.planner import hlo_collectives, hlo_matmuls, hlo_traffic

# Instructions that name buffers without running anything.
_FREE = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "after-all",
         "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain"}
# Splash attention's kernels: matmuls of 2 B H Sq Sk D FLOPs each.
_SPLASH_MATMULS = {"splash_mha_fwd": 2, "splash_mha_dkv": 4, "splash_mha_dq": 3}


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One step, per device: the predicted time and where it goes. ``compute_s``: time
    in instructions bound by their matmuls, ``memory_s``: by their HBM bytes,
    ``exposed_collective_s``: waiting on collectives (synchronous ones whole,
    asynchronous ones past what ran beside them), ``collective_s``: every collective's
    time on the links, hidden or not. ``matmul_flops`` (attention kernels' included)
    and their FLOP-weighted ``fill``."""

    step_s: float
    compute_s: float
    memory_s: float
    exposed_collective_s: float
    collective_s: float
    matmul_flops: float
    attention_kernel_flops: float
    fill: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def predict(hlo_text: str, mesh_shape: Mapping[str, int], chip) -> Prediction:
    """The predicted step of ``compiled.as_text()`` on ``chip`` (``hardware.Chip``) for a
    mesh of ``mesh_shape`` (axis -> size, in the mesh's order)."""
    computations = hlo_traffic.parse(hlo_text)
    entry = next((c for c in computations.values() if c.is_entry), None)
    if entry is None:
        raise ValueError("HLO text without an ENTRY computation")
    schedule = _Schedule(computations, mesh_shape, chip)
    step = schedule.run(entry, 1)
    t = schedule.totals
    filled = t["matmul_flops"] / t["filled_time"] / chip.peak_flops if t["filled_time"] else 1.0
    return Prediction(step, t["compute_s"], t["memory_s"], t["exposed_s"], t["collective_s"],
                      t["matmul_flops"], t["kernel_flops"], filled)


class _Schedule:
    def __init__(self, computations, mesh_shape, chip):
        self.computations = computations
        self.instructions = {i.name: i for c in computations.values() for i in c.instructions}
        self.bytes = hlo_traffic.Module(computations)
        self.collectives = hlo_collectives.Reader(computations, mesh_shape)
        self.mesh_shape, self.chip = mesh_shape, chip
        self.totals = dict.fromkeys(("compute_s", "memory_s", "exposed_s", "collective_s",
                                     "matmul_flops", "kernel_flops", "filled_time"), 0.0)

    def run(self, computation, times: int) -> float:
        """The time one execution of ``computation`` takes (``times``: how often the
        step runs it, for the totals)."""
        now, links_free = 0.0, 0.0
        pending: dict[str, float] = {}  # values an asynchronous collective still fills
        for instruction in computation.instructions:
            op = instruction.opcode
            if op in ("while", "conditional", "call"):
                now += self._called(instruction, times)
                continue
            inflight = [pending[o] for o in instruction.operands if o in pending]
            if op in _FREE:
                if inflight:
                    pending[instruction.name] = max(inflight)
                continue
            if inflight and self._waits(instruction):
                waited = max(inflight) - now
                if waited > 0:
                    self.totals["exposed_s"] += waited * times
                    now += waited
            elif inflight:  # a continuation: the value flows on to the done
                pending[instruction.name] = max(inflight)
            work = self._work(instruction, times)
            moving = self._collective_seconds(instruction)
            if not moving:
                now += work
                continue
            self.totals["collective_s"] += moving * times
            begin = max(now, links_free)
            links_free = begin + moving
            if self._starts(instruction):
                pending[instruction.name] = links_free
                now += work
            else:  # synchronous: the program waits for it
                finished = max(links_free, begin + work)
                self.totals["exposed_s"] += (finished - now - work) * times
                now = finished
        return now

    def _called(self, instruction, times: int) -> float:
        called = hlo_traffic.called_by(instruction)
        if instruction.opcode == "while":
            body = self.computations[called["body"]]
            condition = self.computations[called["condition"]]
            trips = hlo_traffic.trip_count_of(instruction, self.computations)
            return (trips * self.run(body, times * trips)
                    + (trips + 1) * self.run(condition, times * (trips + 1)))
        if instruction.opcode == "call":
            return self.run(self.computations[called["to_apply"]], times)
        return max((self.run(self.computations[name], times)
                    for name in hlo_traffic.branch_names(instruction)), default=0.0)

    def _work(self, instruction, times: int) -> float:
        """``max(matmul time, HBM time)`` of one execution, added to the totals."""
        chip = self.chip
        work = hlo_matmuls.matmul_work(instruction, self.instructions, self.computations,
                                       chip.mxu_width)
        kernel = _attention_kernel(instruction, self.instructions, chip.mxu_width)
        if kernel:
            work.append(kernel)
            self.totals["kernel_flops"] += kernel[0] * times
        matmul_s = sum(flops / (chip.peak_flops * fill) for flops, fill in work)
        memory_s = self.bytes.instruction_bytes(instruction) / chip.hbm_bandwidth
        self.totals["matmul_flops"] += sum(flops for flops, _ in work) * times
        self.totals["filled_time"] += matmul_s * times
        self.totals["compute_s" if matmul_s >= memory_s else "memory_s"] += max(
            matmul_s, memory_s) * times
        return max(matmul_s, memory_s)

    def _collective_seconds(self, instruction) -> float:
        seconds = 0.0
        for found in self.collectives.found_in(instruction):
            rate = hlo_collectives.bandwidth(found.axes, self.chip, self.mesh_shape)
            seconds += found.bytes_sent / rate if rate else 0.0
        return seconds

    def _starts(self, instruction) -> bool:
        return (instruction.opcode.endswith("-start")
                or self._fused_marker(instruction, hlo_collectives.ASYNC_START))

    def _waits(self, instruction) -> bool:
        return (instruction.opcode.endswith("-done")
                or self._fused_marker(instruction, hlo_collectives.ASYNC_DONE))

    def _fused_marker(self, instruction, target: str) -> bool:
        if instruction.opcode == "custom-call":
            return f'custom_call_target="{target}"' in instruction.attributes
        if instruction.opcode != "fusion":
            return False
        name = hlo_traffic.called_by(instruction).get("calls")
        return name in self.computations and hlo_collectives.async_part(
            self.computations[name], target)


def _attention_kernel(instruction, instructions: dict, width: int) -> tuple[float, float] | None:
    """``(FLOPs, fill)`` of a splash attention kernel, from its query/key operands and
    block mask (a causal one: ``(n + 1) / 2n`` of an ``n`` x ``n`` grid of blocks)."""
    if instruction.opcode != "custom-call" or "tpu_custom_call" not in instruction.attributes:
        return None
    matmuls = next((count for name, count in _SPLASH_MATMULS.items()
                    if instruction.name.startswith(name)), 0)
    if not matmuls:
        return None
    shapes = [array[1] for o in instruction.operands if o in instructions
              if (array := hlo_matmuls.array_shape(instructions[o].type_text))]
    qkv = [s for s in shapes if s and len(s) == 4]
    masks = [s for s in shapes if s and len(s) == 3 and s[-1] == s[-2]]
    if len(qkv) < 2:
        return None
    (batch, heads, queries, head_dim), keys = qkv[0], qkv[1][2]
    blocks = masks[0][-1] if masks else 1
    causal = (blocks + 1) / (2 * blocks)
    flops = matmuls * 2.0 * batch * heads * queries * keys * head_dim * causal
    fill = head_dim / (-(-head_dim // width) * width) if width else 1.0
    return flops, fill


def mfu(prediction: Prediction, model_flops: float, devices: int, peak: float) -> float:
    """The model FLOPs utilisation the predicted step gives."""
    return model_flops / (devices * peak * prediction.step_s) if prediction.step_s else math.nan
