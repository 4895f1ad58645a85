"""``plan --search``: the meshes, remat policies and microbatch counts a run could use on a
topology, compiled and ranked by their predicted step time (``step_time``).

Candidates:

- meshes: each of the topology's physical axes given whole to ``data``, ``fsdp``,
  ``tensor``, ``context`` or ``stage`` (and ``expert`` for a model with experts), since a
  mesh axis must be a product of whole physical axes to tile the torus; the slices of a
  multi-slice target stay on ``dcn``. A mesh the run's own checks refuse (the batch over
  the data-parallel axes, experts over ``expert``, what a context axis or pipeline stages
  need: ``config.check_devices``, the caller's ``runs``) is left out, as is a ``tensor``
  that does not divide the heads and a ``context`` axis that leaves a device fewer than
  ``MIN_CONTEXT_POSITIONS`` of a row. Meshes without context or stage axes come first.
  ``tensor`` > 1 takes the ``fsdp_tensor`` rules;
- remat: ``full``, ``dots_no_batch`` and ``offload``;
- microbatches: 1, then 2, 4, ... while they divide each device's rows.

A first round compiles every mesh at ``full`` remat and one microbatch; the meshes with
the best predictions (or, if none fits, the smallest memory) are then tried with the
other remat policies and microbatch counts, up to ``limit`` compiles in all. Each
compile is a fresh ``python -m t5x_like.plan --json`` process (libtpu reads its
environment when it loads), ``workers`` at a time.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import json
import math
import shlex
import subprocess
import sys

from t5x_like.config import check_devices
from t5x_like.errors import ConfigError
from t5x_like.planner.topology import PlanError, chip_grid

REMATS = ("full", "dots_no_batch", "offload")
MESH_AXES = ("data", "fsdp", "tensor", "expert", "context", "stage")
# A context axis splits every row's positions and adds a gather (or ring) of keys and
# values to every layer: below this many positions a device, the rows are short enough
# that the batch axes hold them (a bound on the search, not on the prediction).
MIN_CONTEXT_POSITIONS = 1024


@dataclasses.dataclass(frozen=True)
class Candidate:
    mesh: tuple[tuple[str, int], ...]  # (axis, size) of each of MESH_AXES
    remat: str
    microbatches: int

    def overrides(self) -> list[str]:
        mesh = dict(self.mesh)
        rules = "fsdp_tensor" if mesh.get("tensor", 1) > 1 else "fsdp"
        return ([f"--config.mesh.{axis}={size}" for axis, size in self.mesh]
                + [f"--config.partitioning.rules={rules}",
                   f"--config.model.numerics.remat_policy={self.remat}",
                   f"--config.optimizer.microbatches={self.microbatches}"])

    @property
    def label(self) -> str:
        mesh = " x ".join(f"{axis} {size}" for axis, size in self.mesh if size > 1) or "1 chip"
        return f"{mesh}, remat {self.remat}, {self.microbatches} microbatch(es)"


def meshes(topology: str, runs, experts: int = 0, heads: int = 0, length: int = 0
           ) -> list[tuple]:
    """Every distinct (axis, size) mesh that gives each physical axis whole to one of
    ``MESH_AXES`` (``expert`` only with ``experts`` > 1) and that ``runs(sizes)`` accepts
    (the run's own device checks), whose ``tensor`` divides ``heads`` (the attention
    heads' and key/value heads' common divisor; 0: any) and whose ``context`` leaves each
    device at least ``MIN_CONTEXT_POSITIONS`` of the ``length`` positions of a row.
    Meshes with neither context nor stage axes first, then with context, then stages."""
    axes = tuple(a for a in MESH_AXES if a != "expert" or experts > 1)
    found, grid = [], chip_grid(topology)
    for choice in itertools.product(axes, repeat=len(grid)):
        sizes = dict.fromkeys(axes, 1)
        for axis, size in zip(choice, grid, strict=True):
            sizes[axis] *= size
        mesh = tuple(sizes.items())
        if (mesh in found or (heads and heads % sizes["tensor"])
                or length < MIN_CONTEXT_POSITIONS * sizes["context"] and sizes["context"] > 1
                or not runs(sizes)):
            continue
        found.append(mesh)
    return sorted(found, key=lambda mesh: (dict(mesh)["stage"] > 1, dict(mesh)["context"] > 1))


def accepted_by(spec, topology: str, num_slices: int = 1):
    """``runs(sizes) -> bool`` for ``meshes``: whether the run ``spec``'s own device checks
    (``config.check_devices``, what its plan runs first) accept it on the topology."""
    chips = math.prod(chip_grid(topology)) * num_slices

    def runs(sizes: dict) -> bool:
        meshed = spec.replace(mesh=spec.mesh.replace(**sizes, dcn=num_slices))
        try:
            check_devices(meshed, chips, 1, num_slices)
        except ConfigError:
            return False
        return True
    return runs


def candidates(mesh, batch_size: int) -> list[Candidate]:
    """``mesh`` with each remat policy at each microbatch count that divides its rows,
    fewer microbatches first (each costs a pass over the weights)."""
    sizes = dict(mesh)
    rows = batch_size // (sizes["data"] * sizes["fsdp"] * sizes.get("expert", 1))
    counts = [k for k in (1, 2, 4, 8, 16) if rows % k == 0]
    return [Candidate(mesh, remat, k) for k in counts for remat in REMATS]


def run(config_path: str, topology: str, overrides: list[str], spec, num_slices: int = 1,
        limit: int = 12, workers: int = 1, cwd=None) -> list[dict]:
    """The compiled candidates for the run ``spec`` (the resolved ``config_path`` with
    ``overrides``), best first: each a dict of its ``candidate``, its plan ``report`` (or
    ``error``) and the ``command`` that plans it."""
    model, batch_size = spec.model, spec.batch_size
    attention = getattr(model, "attention", None)
    # Heads and key/value heads (0: as many as heads) both split over ``tensor``.
    heads = math.gcd(int(getattr(model, "num_heads", 0) or 0),
                     int(getattr(attention, "num_kv_heads", 0) or 0))
    grid = meshes(topology, accepted_by(spec, topology, num_slices), model.expert_count,
                  heads, max(spec.task_feature_lengths.values()))
    if not grid:
        raise PlanError(f"No mesh of {topology} passes the run's checks (the batch over the "
                        f"data-parallel axes first: batch_size={batch_size}); choose a batch "
                        "that is a multiple of the chips.")
    base = [sys.executable, "-m", "t5x_like.plan", f"--config={config_path}",
            f"--topology={topology}", f"--num_slices={num_slices}", "--json", *overrides]
    first = [Candidate(mesh, "full", 1) for mesh in grid][:limit]
    results = _compile(base, first, workers, cwd)
    ranked = _ranked(results)
    tried = {r["candidate"] for r in results}
    best_meshes = [r["candidate"].mesh for r in ranked][:2]
    more = [c for mesh in best_meshes for c in candidates(mesh, batch_size) if c not in tried]
    results += _compile(base, more[:max(limit - len(results), 0)], workers, cwd)
    return _ranked(results)


def _compile(base: list[str], chosen: list[Candidate], workers: int, cwd) -> list[dict]:
    def one(candidate: Candidate) -> dict:
        command = base + candidate.overrides()
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
        shown = "python -m t5x_like.plan " + shlex.join(
            a for a in command[3:] if a != "--json")
        if done.returncode:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            return {"candidate": candidate, "command": shown,
                    "error": lines[-1] if lines else f"exit {done.returncode}"}
        return {"candidate": candidate, "command": shown, "report": json.loads(done.stdout)}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(workers, 1)) as pool:
        return list(pool.map(one, chosen))


def _ranked(results: list[dict]) -> list[dict]:
    """Fitting plans by predicted step time, then plans that do not fit by memory, then
    the ones that failed to compile."""
    def key(result):
        report = result.get("report")
        if report is None:
            return (2, 0.0)
        predicted = report.get("predicted")
        if report.get("fits") and predicted:
            return (0, predicted["step_s"])
        return (1, report["memory_per_device"]["total"])
    return sorted(results, key=key)


def table(results: list[dict]) -> str:
    """The ranked candidates as a Markdown table, each with the flags that plan it alone
    (added to the command that searched)."""
    lines = ["| rank | candidate | fits | memory / chip | predicted step | predicted MFU | "
             "its flags |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for rank, result in enumerate(results, 1):
        candidate, report = result["candidate"], result.get("report")
        if report is None:
            lines.append(f"| {rank} | {candidate.label} | error | - | - | - | "
                         f"{result['error'][:120]} |")
            continue
        memory = report["memory_per_device"]["total"] / 2**30
        predicted = report.get("predicted")
        step = f"{predicted['step_s']:.3g} s" if predicted else "-"
        mfu = f"{100 * predicted['mfu']:.1f}%" if predicted and not math.isnan(
            predicted["mfu"]) else "-"
        fits = "yes" if report.get("fits") else "no"
        lines.append(f"| {rank} | {candidate.label} | {fits} | {memory:.2f} GiB | {step} | "
                     f"{mfu} | `{' '.join(candidate.overrides())}` |")
    return "\n".join(lines)
