"""The planner's predicted step time (``planner/step_time.py``): a compiled schedule played
instruction by instruction, on hand-written programs whose times are known, and on a
small plan compiled through libtpu."""

import json
import math

import pytest
from test_plan import OPEN_DECODERS_TINY_ROW, run_plan

from t5x_like.planner import step_time
from t5x_like.system import hardware

# 1 TFLOP/s, 1 TB/s of HBM, 8 GB/s of links, 128-wide matrix units: a 256^3 matmul is
# 33.55 us, gathering 7 shards of 16 KiB is 14.3 us.
CHIP = hardware.Chip(1e12, 1e9, 1e12, 8e9, 0, mxu_width=128)
MESH = {"fsdp": 8}
DOT = 2 * 256**3 / 1e12
GATHER = 7 * 32 * 256 * 2 / 8e9


def _program(gather: str, k: int = 256, loop: int = 0) -> str:
    """p0 @ p1, then that @ the gathered weight; ``gather``: ``async`` (start before the
    first matmul, done after it), ``sync`` (an all-gather first). ``k``: the first
    matmul's contracted size. ``loop``: the whole body run that many times in a while."""
    collective = {
        "async": ("  %ags = (bf16[32,256]{1,0}, bf16[256,256]{1,0}) all-gather-start(%w), "
                  "channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, "
                  "use_global_device_ids=true\n",
                  "  %agd = bf16[256,256]{1,0} all-gather-done(%ags)\n", "%agd"),
        "sync": ("  %ag = bf16[256,256]{1,0} all-gather(%w), channel_id=1, "
                 "replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true\n",
                 "", "%ag"),
    }[gather]
    body = (f"  %p0 = bf16[256,{k}]{{1,0}} parameter(0)\n"
            f"  %p1 = bf16[{k},256]{{1,0}} parameter(1)\n"
            "  %w = bf16[32,256]{1,0} parameter(2)\n"
            + collective[0]
            + "  %dot.1 = bf16[256,256]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, "
              "rhs_contracting_dims={0}\n"
            + collective[1]
            + f"  ROOT %dot.2 = bf16[256,256]{{1,0}} dot(%dot.1, {collective[2]}), "
              "lhs_contracting_dims={1}, rhs_contracting_dims={0}\n")
    args = f"(p0: bf16[256,{k}], p1: bf16[{k},256], w: bf16[32,256])"
    if not loop:
        return f"HloModule m, is_scheduled=true\n\nENTRY %main {args} -> bf16[256,256] {{\n{body}}}\n"
    state = f"(s32[], bf16[256,{k}], bf16[{k},256], bf16[32,256])"
    return (f"HloModule m, is_scheduled=true\n\n"
            f"%inner {args} -> bf16[256,256] {{\n{body}}}\n\n"
            f"%cond (c: {state}) -> pred[] {{\n"
            f"  %c = {state} parameter(0)\n"
            "  %j = s32[] get-tuple-element(%c), index=0\n"
            f"  %n = s32[] constant({loop})\n"
            "  ROOT %lt = pred[] compare(%j, %n), direction=LT\n}\n\n"
            f"%body (b: {state}) -> {state} {{\n"
            f"  %b = {state} parameter(0)\n"
            "  %i = s32[] get-tuple-element(%b), index=0\n"
            f"  %x = bf16[256,{k}]{{1,0}} get-tuple-element(%b), index=1\n"
            f"  %y = bf16[{k},256]{{1,0}} get-tuple-element(%b), index=2\n"
            "  %v = bf16[32,256]{1,0} get-tuple-element(%b), index=3\n"
            "  %r = bf16[256,256]{1,0} call(%x, %y, %v), to_apply=%inner\n"
            f"  ROOT %t = {state} tuple(%i, %x, %y, %v)\n}}\n\n"
            f"ENTRY %main (s: {state}) -> {state} {{\n"
            f"  %s = {state} parameter(0)\n"
            f"  ROOT %loop = {state} while(%s), condition=%cond, body=%body\n}}\n")


def test_an_asynchronous_gather_hides_behind_the_matmul_scheduled_beside_it():
    hidden = step_time.predict(_program("async"), MESH, CHIP)
    waited = step_time.predict(_program("sync"), MESH, CHIP)
    assert hidden.collective_s == waited.collective_s == pytest.approx(GATHER)
    assert hidden.exposed_collective_s == 0.0
    assert hidden.step_s == pytest.approx(2 * DOT, rel=0.02)  # the HBM time is small
    assert waited.exposed_collective_s == pytest.approx(GATHER, rel=0.02)  # less its HBM time
    assert waited.step_s == pytest.approx(2 * DOT + GATHER, rel=0.02)


def test_a_gather_longer_than_what_runs_beside_it_is_waited_for_past_it():
    slow = hardware.Chip(1e12, 1e9, 1e12, 1e9, 0, mxu_width=128)  # the gather is 114.7 us
    gather = 7 * 32 * 256 * 2 / 1e9
    predicted = step_time.predict(_program("async"), MESH, slow)
    assert predicted.exposed_collective_s == pytest.approx(gather - DOT, rel=0.02)
    assert predicted.step_s == pytest.approx(gather + DOT, rel=0.02)


def test_a_matmul_that_underfills_the_matrix_unit_takes_its_padded_time():
    """A contracted size of 64 on 128-wide units keeps half of them busy: the first matmul
    does a quarter of the FLOPs at half the rate."""
    predicted = step_time.predict(_program("async", k=64), MESH, CHIP)
    first, second = DOT / 4, DOT
    assert predicted.step_s == pytest.approx(first / 0.5 + second, rel=0.03)
    assert predicted.fill == pytest.approx((first + second) / (first / 0.5 + second), rel=1e-6)
    wide = hardware.Chip(1e12, 1e9, 1e12, 8e9, 0, mxu_width=256)  # 256 wide: all at half
    assert step_time.predict(_program("async"), MESH, wide).fill == pytest.approx(1.0)
    assert step_time.predict(_program("async", k=64), MESH, wide).fill == pytest.approx(
        (first + second) / (first / 0.25 + second), rel=1e-6)


def test_a_loop_body_runs_as_many_times_as_its_trip_count():
    once = step_time.predict(_program("sync"), MESH, CHIP)
    looped = step_time.predict(_program("sync", loop=5), MESH, CHIP)
    assert looped.step_s == pytest.approx(5 * once.step_s, rel=0.01)
    assert looped.collective_s == pytest.approx(5 * once.collective_s)
    assert looped.matmul_flops == pytest.approx(5 * once.matmul_flops)


def test_a_small_row_is_planned_with_a_prediction_below_its_bound():
    """A tiny Llama-style decoder on v6e:2x2 through libtpu (MaxText's collective flags
    on: ``platforms.TPU_COMPILER_FLAGS``): the predicted step is no faster than the
    roofline's bound, its FLOPs include the splash kernels' (which no compiled count
    sees) and its FSDP gathers are asynchronous, so part of their time hides."""
    report = json.loads(run_plan(*OPEN_DECODERS_TINY_ROW, "--json").stdout)
    predicted, bound = report["predicted"], report["roofline"]
    assert predicted["step_s"] >= bound["step_s"]
    assert 0 < predicted["mfu"] <= bound["mfu"]
    assert predicted["attention_kernel_flops"] > 0
    assert predicted["matmul_flops"] > report["compiled_flops_per_device"]
    assert 0 < predicted["exposed_collective_s"] < predicted["collective_s"]
    assert math.isclose(predicted["mfu"], report["model_flops_per_step"] / (
        report["num_devices"] * report["peak_flops_per_device"] * predicted["step_s"]))
