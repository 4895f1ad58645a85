"""The bytes a compiled step's collectives move per device, by the mesh axes they cross.

A roofline of FLOPs and HBM bytes alone says nothing of FSDP's gathers, a ring's
passes or the gradient all-reduce over the data-center network. This module reads
the optimized HLO: every collective (all-reduce, all-gather, reduce-scatter,
all-to-all, collective-permute; synchronous or ``-start``), weighted by the trip
counts of the loops around it (``hlo_traffic.weighted_instructions``). Its device
groups, in any of the forms XLA prints (explicit ``{{0,1},{2,3}}``, iota
``[2,4]<=[4,2]T(1,0)``, ``mesh[...] {axes}``, or ``source_target_pairs``), give the
mesh axes it crosses: those along which the devices of a group differ, read from the
mesh's device order (the compiled program's device ids index ``mesh.devices.flat``).

The bytes each device sends follow the ring algorithms' counts for an operand of S
bytes on a group of n devices: all-gather (n - 1) S, all-reduce 2 (n - 1) / n S,
reduce-scatter and all-to-all (n - 1) / n S, collective-permute S; a ragged all-to-all
(whose rows per peer are known only when it runs) (n - 1) / n of the smaller of its
send and receive buffers, what it sends when the rows are spread evenly. Collectives
inside fusions (TPU's collective matmuls) are found too.

A multi-slice TPU program is compiled per slice: what crosses the data-center network
is not a collective over the slice's devices but a host-transfer ``send`` to the
MegaScale runtime (``_xla_megascale_transfer_type``: ``ONE_TO_ONE`` for a collective
permute, a pipeline's hand-over between slices; ``ALL_REDUCE`` for a sum over the
slices). Those are counted as crossing ``dcn``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from collections.abc import Mapping

import numpy as np

from t5x_like.planner import hlo_traffic

_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
          "collective-permute", "collective-broadcast")
_EXPLICIT = re.compile(r"replica_groups=\{((?:\{[0-9,]*\},?)*)\}")
_IOTA = re.compile(r"replica_groups=\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?")
_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=(\S+?))?\s*\{([^}]*)\}")
_IOTA_IDS = re.compile(r"^\(?\[([0-9,]+)\](?:T\(([0-9,]+)\))?\)?$")
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{[0-9]+,[0-9]+\},?)*)\}")
_CHANNEL = re.compile(r"\bchannel_id=([0-9]+)")
_MEGASCALE = re.compile(r'_xla_megascale_transfer_type="?(\w+)')


@dataclasses.dataclass(frozen=True)
class Collectives:
    """Per device, one execution of the program: bytes sent and collectives run, keyed
    by the mesh axes crossed (``"fsdp"``, ``"context"``, ``"data+fsdp"``; ``"?"`` when
    the groups could not be read)."""

    bytes_by_axes: dict[str, float]
    count_by_axes: dict[str, int]

    @property
    def total_bytes(self) -> float:
        return sum(self.bytes_by_axes.values())


@dataclasses.dataclass(frozen=True)
class Found:
    """One collective of a compiled program: its kind (``all-gather``, ``collective-permute``,
    ...; ``dcn-send`` for a MegaScale transfer), the mesh axes it crosses (``"?"`` unread),
    its operands' HLO types, the bytes each device sends per execution, and how many
    times one execution of the program runs it (loop trip counts)."""

    kind: str
    axes: str
    operand_types: tuple[str, ...]
    bytes_sent: float
    times: int


def listed(hlo_text: str, mesh_shape: Mapping[str, int]) -> list[Found]:
    """Every collective of ``compiled.as_text()`` on a mesh of ``mesh_shape`` (axis ->
    size, in the mesh's order) that moves something: groups of one device are left out.
    What a test asks of a program (the ring's permutes carry key blocks over
    ``context``) reads this; ``analyze`` sums it."""
    computations = hlo_traffic.parse(hlo_text)
    reader = Reader(computations, mesh_shape)
    found = []
    for instruction, times in hlo_traffic.weighted_instructions(computations,
                                                                 lambda c: len(c.instructions)):
        found += reader.found_in(instruction, times)
    return found


class Reader:
    """Reads the collectives of one instruction of a parsed program on a mesh of
    ``mesh_shape`` (``listed`` for every instruction; ``step_time`` one at a time, in
    the schedule's order)."""

    def __init__(self, computations: dict, mesh_shape: Mapping[str, int]):
        self.computations = computations
        self.types = {i.name: i.type_text for c in computations.values() for i in c.instructions}
        self.mesh_shape = mesh_shape
        self.axes = tuple(mesh_shape)
        self.coords = np.stack(np.unravel_index(np.arange(math.prod(mesh_shape.values())),
                                                tuple(mesh_shape.values())), axis=1)
        self._channels: set[str] = set()  # collectives read already (``ASYNC_START``)

    def found_in(self, instruction, times: int = 1) -> list[Found]:
        """The collectives ``instruction`` runs (itself, the ones its fusion holds, or a
        MegaScale send), each as a ``Found`` run ``times`` times."""
        dcn = _megascale_kind(instruction)
        if dcn:
            operand_types = tuple(self.types.get(o, "") for o in instruction.operands)
            operand = sum(hlo_traffic.shape_bytes(t) for t in operand_types)
            slices = self.mesh_shape.get("dcn", 1)
            return [Found("dcn-send", "dcn", operand_types,
                          _bytes_sent("all-reduce", operand, slices)
                          if dcn == "ALL_REDUCE" else operand, times)]
        found = []
        for collective in _collectives_in(instruction, self.computations):
            channel = _CHANNEL.search(collective.attributes)
            if channel and instruction.opcode == "fusion":
                if channel.group(1) in self._channels:
                    continue  # an asynchronous collective's continuation or done
                self._channels.add(channel.group(1))
            kind = _kind(collective.opcode)
            groups = _groups(collective.attributes, len(self.coords))
            crossed = (_axes_crossed(groups, self.coords, self.axes) if groups is not None
                       else "?")
            if crossed == "":
                continue  # groups of one device: nothing moves
            size = max((len(g) for g in groups), default=1) if groups is not None else 2
            operand_types = tuple(self.types.get(o, "") for o in collective.operands)
            sizes = [hlo_traffic.shape_bytes(t) for t in operand_types]
            # A ragged all-to-all's operands are its send buffer, the receive buffer it
            # writes into, and offsets: evenly spread, it sends the smaller buffer.
            operand = min(sizes[:2]) if kind == "ragged-all-to-all" else sum(sizes)
            found.append(Found(kind, crossed, operand_types, _bytes_sent(kind, operand, size),
                               times))
        return found


def analyze(hlo_text: str, mesh_shape: Mapping[str, int]) -> Collectives:
    """The collectives of ``compiled.as_text()`` on a mesh of ``mesh_shape`` (axis ->
    size, in the mesh's order), summed by the axes they cross."""
    sent: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.defaultdict(int)
    for collective in listed(hlo_text, mesh_shape):
        sent[collective.axes] += collective.times * collective.bytes_sent
        counts[collective.axes] += collective.times
    return Collectives(dict(sent), dict(counts))


def _megascale_kind(instruction) -> str:
    """``ONE_TO_ONE`` or ``ALL_REDUCE`` for a send over the data-center network, else ""."""
    if instruction.opcode != "send":
        return ""
    found = _MEGASCALE.search(instruction.attributes)
    return found.group(1) if found else ""


def _collectives_in(instruction, computations) -> list:
    """``instruction`` if it is a collective (its ``-start``; a ``-done`` moves nothing
    more), or the collectives inside the fusion or async computation it calls."""
    if _kind(instruction.opcode):
        return [instruction]
    if instruction.opcode not in ("fusion", "async-start"):
        return []
    found = []
    for _, name in re.findall(r"\b(calls|to_apply)=%([\w.\-]+)", instruction.attributes):
        called = computations.get(name)
        if called is not None:
            found += [i for i in called.instructions if _kind(i.opcode)]
    return found


# libtpu's asynchronous collective fusions (``--xla_tpu_enable_async_collective_fusion``):
# one fusion starts the collective, later ones continue it beside their own work (a
# matmul's fusion holding the next weight's all-gather) and one waits for it. Each holds
# the collective's instruction, with one ``channel_id``: it moves once.
ASYNC_START, ASYNC_DONE = "AsyncCollectiveStart", "AsyncCollectiveDone"


def async_part(computation, target: str) -> bool:
    """Whether a fused ``computation`` starts (``ASYNC_START``) or waits for
    (``ASYNC_DONE``) an asynchronous collective."""
    return any(i.opcode == "custom-call" and f'custom_call_target="{target}"' in i.attributes
               for i in computation.instructions)


def _kind(opcode: str) -> str:
    base = opcode[:-len("-start")] if opcode.endswith("-start") else opcode
    return base if base in _KINDS else ""


def _bytes_sent(kind: str, operand: float, n: int) -> float:
    if n <= 1:
        return 0.0
    if kind == "all-gather":
        return (n - 1) * operand
    if kind == "all-reduce":
        return 2 * (n - 1) / n * operand
    if kind in ("reduce-scatter", "all-to-all", "ragged-all-to-all"):
        return (n - 1) / n * operand
    return operand  # collective-permute, collective-broadcast: each device sends its block


def _groups(attributes: str, num_devices: int) -> list[list[int]] | None:
    """The device groups of a collective (None when printed in a form not read here)."""
    pairs = _PAIRS.search(attributes)
    if pairs:
        return [[int(a), int(b)] for a, b in re.findall(r"\{([0-9]+),([0-9]+)\}",
                                                         pairs.group(1))]
    mesh = _MESH.search(attributes)
    if mesh:
        sizes = [int(size) for size in re.findall(r"=([0-9]+)", mesh.group(1))]
        names = re.findall(r"'([^']+)'=", mesh.group(1))
        chosen = {name.strip().strip("'") for name in mesh.group(3).split(",") if name.strip()}
        ids = _device_ids(mesh.group(2), math.prod(sizes))
        if ids is None:
            return None
        ids = ids.reshape(sizes)
        inside = [i for i, name in enumerate(names) if name in chosen]
        outside = [i for i in range(len(names)) if i not in inside]
        grouped = np.transpose(ids, outside + inside).reshape(-1, math.prod(
            sizes[i] for i in inside) if inside else 1)
        return grouped.tolist()
    iota = _IOTA.search(attributes)
    if iota:
        return _iota(iota.group(2), iota.group(3)).reshape(_ints(iota.group(1))).tolist()
    explicit = _EXPLICIT.search(attributes)
    if explicit:
        groups = [[int(x) for x in g.split(",") if x]
                  for g in re.findall(r"\{([0-9,]*)\}", explicit.group(1))]
        return groups or [list(range(num_devices))]
    return None


def _device_ids(text: str | None, count: int) -> np.ndarray | None:
    """The device at each position of a printed mesh: ``device_ids=([2,4]T(1,0))`` is
    an iota reshaped and transposed, ``{3,1,...}`` a list; none given, in order."""
    if text is None:
        return np.arange(count)
    if text.startswith("{"):
        return np.array([int(x) for x in text.strip("{}").split(",") if x])
    iota = _IOTA_IDS.match(text)
    return None if not iota else _iota(iota.group(1), iota.group(2)).reshape(-1)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _iota(dims: str, permutation: str | None) -> np.ndarray:
    """XLA's iota tile ``[dims]T(permutation)``: device ids in order, reshaped to
    ``dims`` and transposed by ``permutation``."""
    dims_list = _ints(dims)
    ids = np.arange(math.prod(dims_list)).reshape(dims_list)
    return np.transpose(ids, _ints(permutation)) if permutation else ids


def _axes_crossed(groups: list[list[int]], coords: np.ndarray, axes: tuple[str, ...]) -> str:
    """``"a+b"``: the mesh axes along which some group's devices differ, in mesh order."""
    crossed = set()
    for group in groups:
        if len(group) < 2 or max(group) >= len(coords):
            continue
        points = coords[group]
        crossed |= {axis for axis, varies in zip(axes, (points != points[0]).any(axis=0),
                                                 strict=True) if varies}
    return "+".join(axis for axis in axes if axis in crossed)


def communication_seconds(collectives: Collectives, chip, mesh_shape: Mapping[str, int]
                          ) -> dict[str, float] | None:
    """Seconds per step each group of axes needs at the chip's link bandwidth
    (``hardware.Chip.axis_bandwidth``); None when the chip's links are not in the table."""
    if chip is None or not chip.ici_bandwidth:
        return None
    seconds = {}
    for crossed, moved in collectives.bytes_by_axes.items():
        rate = bandwidth(crossed, chip, mesh_shape)
        seconds[crossed] = moved / rate if rate else math.inf
    return seconds


def bandwidth(crossed: str, chip, mesh_shape: Mapping[str, int]) -> float | None:
    """Bytes/s a device's collective over the mesh axes ``crossed`` (``"fsdp+tensor"``)
    gets (``hardware.Chip.axis_bandwidth``)."""
    names = [] if crossed == "?" else crossed.split("+")
    return chip.axis_bandwidth(
        over_dcn="dcn" in names,
        ici_axes=sum(1 for name in names if name != "dcn" and mesh_shape.get(name, 1) > 1))
