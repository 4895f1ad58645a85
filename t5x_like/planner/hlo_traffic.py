"""Where a compiled step's HBM bytes go, loops counted as many times as they run.

XLA's cost analysis counts a ``while`` body once. With scanned layers the body
is one layer of 24, so the planner used to scale the whole step's bytes by
model FLOPs over compiled FLOPs, which multiplies the embedding, logits and
optimizer traffic (run once) by the layer count as well. This module reads the
optimized HLO text instead: every instruction that touches memory is counted
with the trip count of the loops around it, and attributed to the source
operation named in its metadata so a plan can say which part of the model
moves the bytes.

The per-instruction rule follows XLA's ``HloCostAnalysis``: operands read plus
results written. A fusion reads only the slices it takes of an operand whose
uses inside it are all (dynamic-)slices, and writes only the update of a
dynamic-update-slice done in place; both matter in scanned loops, whose
stacked weights and saved activations are sliced one layer at a time.
Tuple plumbing, bitcasts, parameters and constants move nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Iterator

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1,
          "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
          "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\](\{[^}]*\})?")
_TILE = re.compile(r"T\(([0-9,]+)\)")
_HEADER = re.compile(r"^(ENTRY )?%(\S+) \(.*\) -> .* \{$")
_OPERAND = re.compile(r"%([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CALLS = re.compile(r"\b(calls|body|condition|to_apply|true_computation|false_computation)"
                    r"=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
# Instructions that name or regroup buffers without moving them.
_FREE = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "after-all",
         "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain"}
_SLICING = {"dynamic-slice", "slice", "gather"}


def shape_bytes(type_text: str) -> int:
    """Bytes of every array in an HLO type (a tuple's are summed), with the padding of
    its memory tiles: TPU layouts like ``{2,1,0:T(8,128)}`` round the two most minor
    dimensions up to 8 and 128, so a [.., 114, 64] array occupies [.., 120, 128]."""
    total = 0
    for dtype, dims_text, layout in _ARRAY.findall(type_text):
        if dtype not in _BYTES:
            continue
        dims = [int(d) for d in dims_text.split(",") if d]
        tile = _TILE.search(layout or "")
        if tile and dims:
            order, _, _ = layout.strip("{}").partition(":")
            minor_to_major = [int(d) for d in order.split(",") if d]
            tile_dims = [int(t) for t in tile.group(1).split(",")]
            if len(minor_to_major) == len(dims):
                for size, dim in zip(reversed(tile_dims), minor_to_major, strict=False):
                    dims[dim] = -(-dims[dim] // size) * size
        count = 1
        for d in dims:
            count *= d
        total += count * _BYTES[dtype]
    return total


@dataclasses.dataclass
class Instruction:
    name: str
    type_text: str
    opcode: str
    operands: list[str]
    operand_text: str
    attributes: str
    is_root: bool

    @property
    def op_name(self) -> str:
        found = _OP_NAME.search(self.attributes)
        return found.group(1) if found else ""


@dataclasses.dataclass
class Computation:
    name: str
    is_entry: bool
    instructions: list[Instruction]

    @property
    def root(self) -> Instruction:
        return next(i for i in self.instructions if i.is_root)


def _balanced(text: str, start: int) -> int:
    """Index just past the bracket group opening at ``text[start]``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError(f"unbalanced HLO text: {text[start:start + 80]}")


def _parse_instruction(line: str) -> Instruction | None:
    body = line.strip()
    is_root = body.startswith("ROOT ")
    if is_root:
        body = body[5:]
    if not body.startswith("%") or " = " not in body:
        return None
    name, _, rest = body.partition(" = ")
    if rest.startswith("("):
        end = _balanced(rest, 0)
    else:
        end = rest.index(" ")
    type_text, rest = rest[:end], rest[end:].lstrip()
    paren = rest.find("(")
    if paren < 0:
        return None
    opcode = rest[:paren]
    close = _balanced(rest, paren)
    operands = _OPERAND.findall(rest[paren:close])
    return Instruction(name[1:], type_text, opcode, operands, rest[paren + 1:close - 1],
                       rest[close:], is_root)


def parse(hlo_text: str) -> dict[str, Computation]:
    computations, current = {}, None
    for line in hlo_text.splitlines():
        header = _HEADER.match(line)
        if header:
            current = Computation(header.group(2), bool(header.group(1)), [])
            computations[current.name] = current
        elif line.rstrip() == "}":  # not "}}, metadata=...": a multi-line instruction's tail
            current = None
        elif current is not None:
            instruction = _parse_instruction(line)
            if instruction is not None:
                current.instructions.append(instruction)
    return computations


_KNOWN_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def _trip_count(loop: Instruction, condition: Computation,
                computations: dict[str, Computation]) -> int:
    """The compiler's ``known_trip_count`` when it says it; else N from the ``i < N``
    condition scans lower to (its compare possibly wrapped in a fusion)."""
    known = _KNOWN_TRIPS.search(loop.attributes)
    if known:
        return max(int(known.group(1)), 1)
    constants = {i.name: i for i in condition.instructions if i.opcode == "constant"}
    root = condition.root
    compare = root
    if root.opcode == "fusion":
        called = _CALLS.search(root.attributes)
        compare = computations[called.group(2)].root if called else root
    if compare.opcode == "compare" and "direction=LT" in compare.attributes:
        for operand in root.operands:
            if operand in constants and constants[operand].operand_text.lstrip("-").isdigit():
                return max(int(constants[operand].operand_text), 1)
    return 1


@dataclasses.dataclass(frozen=True)
class Traffic:
    """Bytes one execution of the program moves, and by which source operations."""
    total_bytes: float
    loop_bodies_once_bytes: float  # each loop body counted once, as XLA's cost analysis does
    by_source: dict[str, float]  # source_of's "pass module/path" -> bytes
    loop_trip_counts: list[int]


class Module:
    """Reads the HBM bytes of a parsed program's instructions (``instruction_bytes``)."""

    def __init__(self, computations: dict[str, Computation]):
        self.computations = computations
        self.types = {i.name: i.type_text for c in computations.values() for i in c.instructions}

    def fusion_bytes(self, instruction: Instruction, fused: Computation) -> float:
        read = sum(self._operand_read(fused, position, operand)
                   for position, operand in enumerate(instruction.operands))
        by_name = {i.name: i for i in fused.instructions}
        root = fused.root
        outputs = ([by_name[o] for o in root.operands if o in by_name]
                   if root.opcode == "tuple" else [root])
        written = 0.0
        for out in outputs:
            if out.opcode == "dynamic-update-slice":
                written += shape_bytes(self.types.get(out.operands[1], by_name.get(
                    out.operands[1], out).type_text))
            else:
                written += shape_bytes(out.type_text)
        return read + written

    def _operand_read(self, fused: Computation, position: int, operand: str) -> float:
        """Bytes a fusion reads of its ``position``-th operand: all of it, unless every
        use inside (through bitcasts and nested fusions) only slices it."""
        full = float(shape_bytes(self.types.get(operand, "")))
        param = next((i.name for i in fused.instructions
                      if i.opcode == "parameter" and i.operand_text == str(position)), None)
        sliced = self._sliced_read(fused, param, depth=0)
        return full if sliced is None else min(full, sliced)

    def _sliced_read(self, computation: Computation, name: str | None, depth: int) -> float | None:
        """Bytes read of ``name`` inside ``computation`` if only slices of it are read
        (or it is only updated in place); None when some use reads it whole."""
        if name is None or depth > 8:
            return None
        total = 0.0
        uses = [(i, k) for i in computation.instructions for k, o in enumerate(i.operands)
                if o == name]
        if not uses:
            return None
        for user, index in uses:
            if user.opcode in _SLICING and index == 0:
                total += shape_bytes(user.type_text)
            elif user.opcode == "dynamic-update-slice" and index == 0:
                continue  # the buffer updated in place is not read
            elif user.opcode == "bitcast":
                inner = self._sliced_read(computation, user.name, depth + 1)
                if inner is None:
                    return None
                total += inner
            elif user.opcode == "fusion":
                called = _CALLS.search(user.attributes)
                nested = self.computations.get(called.group(2)) if called else None
                param = nested and next((i.name for i in nested.instructions
                                         if i.opcode == "parameter"
                                         and i.operand_text == str(index)), None)
                inner = self._sliced_read(nested, param, depth + 1) if nested else None
                if inner is None:
                    return None
                total += inner
            else:
                return None
        return total

    def instruction_bytes(self, instruction: Instruction) -> float:
        """Bytes one execution of a top-level ``instruction`` reads and writes; loops,
        conditionals and calls count nothing themselves (their bodies are walked). An
        async pair counts its operands at ``-start`` and its result at ``-done``."""
        op = instruction.opcode
        if op.endswith("-done"):
            return float(shape_bytes(instruction.type_text))
        if op in _FREE or op in ("while", "conditional", "call"):
            return 0.0
        if op == "fusion":
            called = _CALLS.search(instruction.attributes)
            if called and called.group(2) in self.computations:
                return self.fusion_bytes(instruction, self.computations[called.group(2)])
        if op == "custom-call" and 'custom_call_target="AllocateBuffer"' in instruction.attributes:
            return 0.0  # reserves memory, moves none
        operands = sum(shape_bytes(self.types.get(o, "")) for o in instruction.operands)
        if op.endswith("-start"):
            return float(operands)
        if op == "dynamic-update-slice":
            return 2.0 * shape_bytes(self.types.get(instruction.operands[1], ""))
        if op in _SLICING:
            return 2.0 * shape_bytes(instruction.type_text)
        return float(operands + shape_bytes(instruction.type_text))


def weighted_instructions(computations: dict[str, Computation], branch_cost
                          ) -> Iterator[tuple[Instruction, int]]:
    """Every instruction reachable from the entry computation, with how many times one
    execution runs it: a ``while`` body's by its trip count, its condition's one more
    time; of a ``conditional``'s branches the one ``branch_cost`` (a computation ->
    number) rates highest (an upper bound); ``call``s as they are. Fusions are not
    entered (a caller reads what it needs of them)."""
    entry = next((c for c in computations.values() if c.is_entry), None)
    if entry is None:
        raise ValueError("HLO text without an ENTRY computation")

    def walk(computation: Computation, times: int, depth: int):
        if depth > 64:
            raise ValueError("HLO call nesting deeper than 64")
        for instruction in computation.instructions:
            yield instruction, times
            if instruction.opcode == "while":
                called = called_by(instruction)
                n = _trip_count(instruction, computations[called["condition"]], computations)
                yield from walk(computations[called["body"]], times * n, depth + 1)
                yield from walk(computations[called["condition"]], times * (n + 1), depth + 1)
            elif instruction.opcode == "conditional":
                costs = [(branch_cost(computations[n]), n) for n in branch_names(instruction)]
                if costs:
                    yield from walk(computations[max(costs)[1]], times, depth + 1)
            elif instruction.opcode == "call":
                for kind, name in _CALLS.findall(instruction.attributes):
                    if kind == "to_apply":
                        yield from walk(computations[name], times, depth + 1)

    yield from walk(entry, 1, 0)


def called_by(instruction: Instruction) -> dict[str, str]:
    """The computations an instruction names, by role: ``body`` and ``condition`` of a
    ``while``, ``to_apply`` of a ``call``, ``calls`` of a fusion."""
    return dict(_CALLS.findall(instruction.attributes))


def branch_names(conditional: Instruction) -> list[str]:
    """The branch computations of a ``conditional``, in either form XLA prints."""
    branches = _BRANCHES.search(conditional.attributes)
    if branches:
        return [b.strip().lstrip("%") for b in branches.group(1).split(",")]
    return [v for k, v in _CALLS.findall(conditional.attributes) if k.endswith("_computation")]


def trip_count_of(loop: Instruction, computations: dict[str, Computation]) -> int:
    """How many times a ``while`` instruction runs its body."""
    return _trip_count(loop, computations[called_by(loop)["condition"]], computations)


def analyze(hlo_text: str) -> Traffic:
    """Counts the traffic of ``compiled.as_text()`` from the entry computation down."""
    computations = parse(hlo_text)
    module = Module(computations)
    by_source_path: dict[str, float] = collections.defaultdict(float)
    trips: list[int] = []
    once = 0.0
    for instruction, times in weighted_instructions(
            computations, lambda c: _computation_bytes(module, c)):
        moved = module.instruction_bytes(instruction)
        if moved:
            once += moved
            by_source_path[source_of(instruction.op_name, instruction.opcode)] += moved * times
        if instruction.opcode == "while":
            trips.append(trip_count_of(instruction, computations))
    return Traffic(sum(by_source_path.values()), once, dict(by_source_path), trips)


def _computation_bytes(module: Module, computation: Computation) -> float:
    return sum(module.instruction_bytes(i) for i in computation.instructions)


_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*$")
_PLUMBING = {"while", "body", "cond", "closed_call", "pjit", "checkpoint",
             "rematted_computation", "remat", "jvp", "transpose"}


def source_of(op_name: str, opcode: str = "") -> str:
    """``jit(step)/transpose(jvp(EncoderDecoder))/encoder/while/body/.../attention/
    bqkgd,bskd->bkgqs`` -> ``backward EncoderDecoder/encoder/layers/attention``: the pass
    and the module path, without loop plumbing, einsum specs or the primitive. Ops the
    compiler made (copies, collectives of the sharding) are named by their opcode."""
    backward = "transpose(" in op_name
    parts = [re.sub(r"^(?:\w+\()+|\)+$", "", p) for p in op_name.split("/")[1:]]
    path = [p for p in parts[:-1] if _MODULE_NAME.match(p) and p not in _PLUMBING]
    if not path and "(" not in op_name:
        return f"compiler {opcode or 'op'}"
    if not path:
        return "step outside-the-model (loss, optimizer, casts)"
    return f"{'backward' if backward else 'forward'} {'/'.join(path)}"


def by_source(traffic: Traffic, depth: int = 4) -> list[tuple[str, float]]:
    """Bytes per source path cut to ``depth`` components, largest first."""
    grouped: dict[str, float] = collections.defaultdict(float)
    for source, moved in traffic.by_source.items():
        direction, _, where = source.partition(" ")
        grouped[f"{direction} {'/'.join(where.split('/')[:depth])}"] += moved
    return sorted(grouped.items(), key=lambda row: -row[1])
