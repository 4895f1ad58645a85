"""``t5x_like.planner.hlo_traffic``: HBM bytes read from compiled HLO, loops counted per trip.

On CPU, XLA's own cost analysis is the reference for the per-instruction rule:
an unrolled program must count the same bytes, and a scanned one the same bytes
with each loop body counted once, which is all XLA does with loops."""

import jax
import jax.numpy as jnp
import pytest

from t5x_like.planner import hlo_traffic


def _layer(x, w):
    return jnp.tanh(x @ w), None


def _compiled(layers: int, scan: bool):
    def loss(x, ws):
        if scan:
            return jax.lax.scan(_layer, x, ws)[0].sum()
        for i in range(layers):
            x = _layer(x, ws[i])[0]
        return x.sum()
    x, ws = jnp.ones((64, 128)), jnp.ones((layers, 128, 128))
    compiled = jax.jit(jax.grad(loss, argnums=1)).lower(x, ws).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return hlo_traffic.analyze(compiled.as_text()), cost["bytes accessed"]


def test_an_unrolled_program_counts_what_xla_counts():
    traffic, xla_bytes = _compiled(4, scan=False)
    assert traffic.loop_trip_counts == []
    assert traffic.total_bytes == pytest.approx(xla_bytes, rel=1e-3)
    assert traffic.total_bytes == traffic.loop_bodies_once_bytes


def test_a_scanned_program_counts_each_body_once_per_trip():
    traffic, xla_bytes = _compiled(6, scan=True)
    assert traffic.loop_trip_counts == [6, 6]  # the forward and the backward scan
    assert traffic.loop_bodies_once_bytes == pytest.approx(xla_bytes, rel=1e-3)
    shorter, _ = _compiled(3, scan=True)
    # Each extra trip adds one body's bytes: the per-trip cost is the same at 3 and 6.
    per_trip_6 = (traffic.total_bytes - traffic.loop_bodies_once_bytes) / 5
    per_trip_3 = (shorter.total_bytes - shorter.loop_bodies_once_bytes) / 2
    assert per_trip_6 == pytest.approx(per_trip_3, rel=0.05) and per_trip_6 > 0


HLO = """HloModule m

%fused_slice (param_0: f32[8,256,128], param_1: s32[]) -> f32[256,128] {
  %param_0 = f32[8,256,128]{2,1,0} parameter(0)
  %param_1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %ds = f32[1,256,128]{2,1,0} dynamic-slice(%param_0, %param_1, %zero, %zero), dynamic_slice_sizes={1,256,128}
  ROOT %b = f32[256,128]{1,0} bitcast(%ds)
}

%fused_update (param_0.1: f32[8,256,128], param_1.1: f32[1,256,128], param_2.1: s32[]) -> f32[8,256,128] {
  %param_0.1 = f32[8,256,128]{2,1,0} parameter(0)
  %param_1.1 = f32[1,256,128]{2,1,0} parameter(1)
  %param_2.1 = s32[] parameter(2)
  %zero.1 = s32[] constant(0)
  ROOT %dus = f32[8,256,128]{2,1,0} dynamic-update-slice(%param_0.1, %param_1.1, %param_2.1, %zero.1, %zero.1)
}

%body (p: (s32[], f32[8,256,128], f32[8,256,128])) -> (s32[], f32[8,256,128], f32[8,256,128]) {
  %p = (s32[], f32[8,256,128]{2,1,0}, f32[8,256,128]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %stack = f32[8,256,128]{2,1,0} get-tuple-element(%p), index=1
  %out = f32[8,256,128]{2,1,0} get-tuple-element(%p), index=2
  %layer = f32[256,128]{1,0} fusion(%stack, %i), kind=kLoop, calls=%fused_slice, metadata={op_name="jit(f)/while/body/Model/layers/mlp/wi/dynamic_slice"}
  %row = f32[1,256,128]{2,1,0} bitcast(%layer)
  %saved = f32[8,256,128]{2,1,0} fusion(%out, %row, %i), kind=kLoop, calls=%fused_update, metadata={op_name="jit(f)/transpose(jvp(Model))/while/body/layers/mlp/dynamic_update_slice"}
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[8,256,128]{2,1,0}, f32[8,256,128]{2,1,0}) tuple(%next, %stack, %saved)
}

%cond (c: (s32[], f32[8,256,128], f32[8,256,128])) -> pred[] {
  %c = (s32[], f32[8,256,128]{2,1,0}, f32[8,256,128]{2,1,0}) parameter(0)
  %n = s32[] constant(8)
  %j = s32[] get-tuple-element(%c), index=0
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main (a: f32[8,256,128], b: f32[8,256,128]) -> f32[8,256,128] {
  %a = f32[8,256,128]{2,1,0} parameter(0)
  %b = f32[8,256,128]{2,1,0} parameter(1)
  %zero.2 = s32[] constant(0)
  %init = (s32[], f32[8,256,128]{2,1,0}, f32[8,256,128]{2,1,0}) tuple(%zero.2, %a, %b)
  %loop = (s32[], f32[8,256,128]{2,1,0}, f32[8,256,128]{2,1,0}) while(%init), condition=%cond, body=%body
  ROOT %res = f32[8,256,128]{2,1,0} get-tuple-element(%loop), index=2
}
"""


def test_slices_and_in_place_updates_move_one_layer_per_trip():
    traffic = hlo_traffic.analyze(HLO)
    layer = 256 * 128 * 4
    assert traffic.loop_trip_counts == [8]  # from the i < 8 condition
    # Per trip: the slice reads one layer (and the 4-byte index) and writes it; the
    # update reads that row and writes it in place: the stack it updates is not read.
    assert traffic.by_source == pytest.approx({
        "forward Model/layers/mlp/wi": 8 * (2 * layer + 4),
        "backward Model/layers/mlp": 8 * (2 * layer + 4),
        "compiler add": 8 * 12,
        "compiler compare": 9 * 9,  # the condition runs once more than the body
    })
    assert traffic.total_bytes == pytest.approx(sum(traffic.by_source.values()))


def test_tpu_tiles_pad_the_minor_dimensions():
    # T5's decoder length 114 rounds up to 120 rows, a 64-wide head to 128 lanes.
    assert hlo_traffic.shape_bytes("bf16[2,114,64]{2,1,0:T(8,128)(2,1)}") == 2 * 120 * 128 * 2
    assert hlo_traffic.shape_bytes("f32[3,5]{1,0}") == 60  # CPU layouts have no tiles
    assert hlo_traffic.shape_bytes("(s32[], f32[4]{0}, pred[2])") == 4 + 16 + 2


@pytest.mark.parametrize("op_name, source", [
    ("jit(step)/transpose(jvp(EncoderDecoder))/encoder/while/body/closed_call/checkpoint/"
     "layers/attention/bqkgd,bskd->bkgqs", "backward EncoderDecoder/encoder/layers/attention"),
    ("jit(step)/jvp(Decoder)/layers/mlp/wi_0/dot_general", "forward Decoder/layers/mlp/wi_0"),
])
def test_sources_are_the_pass_and_the_module_path(op_name, source):
    assert hlo_traffic.source_of(op_name) == source
    assert hlo_traffic.source_of("", "all-reduce") == "compiler all-reduce"


def test_an_instruction_printed_over_several_lines_does_not_end_its_computation():
    """TPU kernels' configs print over lines, one of which may start with ``}}``; the
    instructions after it belong to the same computation (seen: a 405B plan's gradient
    sums over the data-center network were all after a splash kernel, and went uncounted)."""
    text = "\n".join([
        "HloModule m, entry_computation_layout={()->f32[4]}",
        "",
        "ENTRY %main (p: f32[4]) -> f32[4] {",
        "  %p = f32[4]{0} parameter(0)",
        '  %k = f32[4]{0} custom-call(%p), custom_call_target="tpu_custom_call", '
        'backend_config={"a": {',
        '"b": 1',
        '}}, metadata={op_name="kernel"}',
        "  ROOT %n = f32[4]{0} negate(%k)",
        "}", ""])
    names = [i.name for i in hlo_traffic.parse(text)["main"].instructions]
    assert names[-1] == "n" and "k" in names
