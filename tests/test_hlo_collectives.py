"""The planner's count of collective bytes by mesh axis, against closed forms: programs
whose collectives are known by construction, each on the 8 fake CPU devices."""

import functools

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from t5x_like.engine import partitioning
from t5x_like.planner import hlo_collectives
from t5x_like.system import hardware

MESH = {"data": 2, "context": 4}
SHAPE = {axis: MESH.get(axis, 1) for axis in partitioning.MESH_AXES}


def _collectives(function, x, in_spec):
    mesh = partitioning.make_mesh(MESH)
    x = jax.device_put(x, NamedSharding(mesh, in_spec))
    with jax.set_mesh(mesh):
        text = jax.jit(function).lower(x).compile().as_text()
    return hlo_collectives.analyze(text, SHAPE)


def _on_mesh(body, in_spec, out_spec):
    return functools.partial(jax.shard_map, mesh=partitioning.make_mesh(MESH),
                             in_specs=in_spec, out_specs=out_spec, check_vma=False)(body)


def test_gathering_a_split_array_sends_n_minus_1_shards_over_its_axis():
    x = np.ones((8, 256), np.float32)  # split over context: [2, 256] a device, 2 KiB
    found = _collectives(lambda v: jax.lax.with_sharding_constraint(v * 2, PartitionSpec()),
                         x, PartitionSpec("context"))
    assert found.bytes_by_axes == {"context": 3 * 2 * 256 * 4}


def test_an_all_reduce_sends_twice_n_minus_1_over_n_of_its_operand():
    x = np.ones((2, 1000), np.float32)
    spec = PartitionSpec("data")
    found = _collectives(_on_mesh(lambda v: jax.lax.psum(v, "data"), spec, spec), x, spec)
    assert found.bytes_by_axes == {"data": pytest.approx(2 * (1 / 2) * 4000)}
    spec2 = PartitionSpec(("data", "context"))
    x2 = np.ones((8, 1000), np.float32)
    both = _collectives(_on_mesh(lambda v: jax.lax.psum(v, ("data", "context")), spec2, spec2),
                        x2, spec2)
    assert both.bytes_by_axes == {"data+context": pytest.approx(2 * (7 / 8) * 4000)}


def test_a_ring_in_a_loop_counts_every_hop():
    """Five passes around the context axis inside a scan: five permutes of 400 bytes."""
    def ring(v):
        def hop(carry, _):
            shifted = jax.lax.ppermute(carry, "context", [(i, (i + 1) % 4) for i in range(4)])
            return shifted * 1.5, None
        return jax.lax.scan(hop, v, None, length=5)[0]

    spec = PartitionSpec("context")
    found = _collectives(_on_mesh(ring, spec, spec), np.ones((4, 100), np.float32), spec)
    assert found.bytes_by_axes == {"context": 5 * 400}
    assert found.count_by_axes == {"context": 5}


def test_groups_printed_in_every_form_name_the_same_axes():
    coords = np.stack(np.unravel_index(np.arange(8), (2, 4)), axis=1)
    axes = ("data", "context")
    forms = {
        "replica_groups={{0,1,2,3},{4,5,6,7}}": "context",
        "replica_groups={{0,4},{1,5},{2,6},{3,7}}": "data",
        "replica_groups=[2,4]<=[8]": "context",
        "replica_groups=[4,2]<=[2,4]T(1,0)": "data",
        "replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}": "context",
        "replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_1'}":
            "data",
        "source_target_pairs={{0,1},{1,2},{2,3},{3,0}}": "context",
        "replica_groups={}": "data+context",
    }
    for attributes, expected in forms.items():
        groups = hlo_collectives._groups(attributes, 8)
        assert hlo_collectives._axes_crossed(groups, coords, axes) == expected, attributes


def test_seconds_follow_the_chips_links():
    v5p = hardware.CHIPS["TPU v5p"]
    found = hlo_collectives.Collectives({"fsdp": 4e9, "dcn": 1e9, "fsdp+tensor": 2e9},
                                        {"fsdp": 1, "dcn": 1, "fsdp+tensor": 1})
    seconds = hlo_collectives.communication_seconds(
        found, v5p, {"dcn": 2, "data": 1, "fsdp": 16, "tensor": 4})
    # One torus dimension of six ports: a third of 1,200 GB/s; two dimensions: two thirds.
    assert seconds["fsdp"] == pytest.approx(4e9 / 400e9)
    assert seconds["fsdp+tensor"] == pytest.approx(2e9 / 800e9)
    assert seconds["dcn"] == pytest.approx(1e9 / (50e9 / 8))
    assert hlo_collectives.communication_seconds(found, None, {}) is None


def test_a_context_parallel_train_step_moves_keys_over_the_context_axis():
    """gpt2_tiny's step on (data 2, context 4): the ring's permutes and the parameters'
    gathers cross the context axis, the gradient's reduction the data axis too; on
    (data 8) only the data axis carries anything."""
    from t5x_like import config_lib
    from t5x_like.planner import aot_planner

    def plan(**mesh):
        config = config_lib.load_config_file("configs/pretrain/gpt2_tiny.py")
        config.task_feature_lengths = {"targets": 64}
        config.batch_size = 8
        config.mesh.update(mesh)
        config.partitioning.context_attention = "ring"
        config_lib.validate(config)
        return {row["axes"]: row for row in aot_planner.plan(config, "cpu:8")[
            "collectives_per_device"]}

    plain, split = plan(data=8), plan(data=2, context=4)
    assert set(plain) == {"data"}
    assert {"context", "data"} <= set(split) and split["context"]["count"] > 4 * 4
    assert all(row["seconds"] is None for row in split.values())  # no links for CPUs


_MEGASCALE = ('is_host_transfer=true, frontend_attributes={{_xla_host_transfer_handler_name='
              '"xla_megascale_runtime",{}_xla_megascale_transfer_type="{}"}}')
MULTI_SLICE_SENDS = "\n".join([
    "HloModule pipelined, entry_computation_layout={()->token[]}",
    "",
    "ENTRY %main (p: f32[1,2,160,128], q: f32[20,8,128]) -> token[] {",
    "  %p = f32[1,2,160,128]{3,2,1,0} parameter(0)",
    "  %q = f32[20,8,128]{2,1,0} parameter(1)",
    "  %after-all.1 = token[] after-all()",
    "  %send.1 = (f32[1,2,160,128]{3,2,1,0}, u32[], token[]) send(%p, %after-all.1), "
    "channel_id=2, " + _MEGASCALE.format("_xla_megascale_target={{100002->200000}},",
                                         "ONE_TO_ONE"),
    "  %after-all.2 = token[] after-all()",
    "  %send.2 = (f32[20,8,128]{2,1,0}, u32[], token[]) send(%q, %after-all.2), channel_id=6, "
    + _MEGASCALE.format('_xla_megascale_reduce_operation="SUM",', "ALL_REDUCE"),
    "  %send-done.1 = token[] send-done(%send.1), channel_id=2, is_host_transfer=true",
    "  ROOT %send-done.2 = token[] send-done(%send.2), channel_id=6, is_host_transfer=true",
    "}", ""])


def test_sends_over_the_data_center_network_count_as_crossing_dcn():
    """A multi-slice program is compiled per slice; what crosses slices is a MegaScale
    host transfer: a pipeline's hand-over (one to one: its operand) and a sum over the
    slices (all-reduce over 4 slices: 2 x 3/4 of its operand)."""
    shape = dict(SHAPE, dcn=4, data=1, context=1)
    found = hlo_collectives.analyze(MULTI_SLICE_SENDS, shape)
    assert found.bytes_by_axes == {"dcn": pytest.approx(2 * 160 * 128 * 4
                                                        + 2 * 0.75 * 20 * 8 * 128 * 4)}
    assert found.count_by_axes == {"dcn": 2}


RAGGED = "\n".join([
    "HloModule ragged, entry_computation_layout={()->f32[64,128]{1,0}}",
    "",
    "ENTRY %main (p: f32[16,128], out: f32[64,128], sizes: s32[4]) -> f32[64,128] {",
    "  %p = f32[16,128]{1,0} parameter(0)",
    "  %out = f32[64,128]{1,0} parameter(1)",
    "  %sizes = s32[4]{0} parameter(2)",
    "  ROOT %ragged-all-to-all.1 = f32[64,128]{1,0} ragged-all-to-all(f32[16,128]{1,0} %p, "
    "f32[64,128]{1,0} %out, s32[4]{0} %sizes, s32[4]{0} %sizes, s32[4]{0} %sizes, "
    "s32[4]{0} %sizes), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}",
    "}", ""])


def test_a_ragged_all_to_all_counts_the_rows_it_sends_not_its_receive_buffer():
    """Dropless experts send 16 rows into a buffer of 64 (room for the worst case):
    spread evenly over 4 devices, 3/4 of the 16 rows leave the device."""
    found = hlo_collectives.analyze(RAGGED, SHAPE)
    assert found.bytes_by_axes == {"context": pytest.approx(0.75 * 16 * 128 * 4)}


# libtpu's asynchronous collective fusion (``TPU_COMPILER_FLAGS``), as it prints it: a
# fusion starts an all-gather, a matmul's fusion continues it, a third waits for it; each
# holds the all-gather (one channel_id).
ASYNC_FUSIONS = "\n".join([
    "HloModule async_gather, is_scheduled=true",
    "",
    "%start_body (w: bf16[16,128]) -> (bf16[16,128], bf16[64,128]) {",
    "  %w = bf16[16,128]{1,0} parameter(0)",
    "  %all-gather.1 = bf16[64,128]{1,0} all-gather(%w), channel_id=7, "
    "replica_groups=[2,4]<=[8], dimensions={0}, use_global_device_ids=true",
    "  ROOT %custom-call.1 = (bf16[16,128]{1,0}, bf16[64,128]{1,0}) custom-call(%all-gather.1), "
    'custom_call_target="AsyncCollectiveStart"',
    "}",
    "",
    "%continue_body (s: (bf16[16,128], bf16[64,128]), x: bf16[128,128]) -> bf16[128,128] {",
    "  %s = (bf16[16,128]{1,0}, bf16[64,128]{1,0}) parameter(0)",
    "  %x = bf16[128,128]{1,0} parameter(1)",
    "  %shard = bf16[16,128]{1,0} get-tuple-element(%s), index=0",
    "  %all-gather.2 = bf16[64,128]{1,0} all-gather(%shard), channel_id=7, "
    "replica_groups=[2,4]<=[8], dimensions={0}, use_global_device_ids=true",
    "  ROOT %dot.1 = bf16[128,128]{1,0} dot(%x, %x), lhs_contracting_dims={1}, "
    "rhs_contracting_dims={0}",
    "}",
    "",
    "%done_body (s: (bf16[16,128], bf16[64,128])) -> bf16[64,128] {",
    "  %s.1 = (bf16[16,128]{1,0}, bf16[64,128]{1,0}) parameter(0)",
    "  %shard.1 = bf16[16,128]{1,0} get-tuple-element(%s.1), index=0",
    "  %all-gather.3 = bf16[64,128]{1,0} all-gather(%shard.1), channel_id=7, "
    "replica_groups=[2,4]<=[8], dimensions={0}, use_global_device_ids=true",
    "  ROOT %custom-call.2 = bf16[64,128]{1,0} custom-call(%all-gather.3), "
    'custom_call_target="AsyncCollectiveDone"',
    "}",
    "",
    "ENTRY %main (p: bf16[16,128], q: bf16[128,128]) -> bf16[64,128] {",
    "  %p = bf16[16,128]{1,0} parameter(0)",
    "  %q = bf16[128,128]{1,0} parameter(1)",
    "  %start = (bf16[16,128]{1,0}, bf16[64,128]{1,0}) fusion(%p), kind=kCustom, "
    "calls=%start_body",
    "  %mm = bf16[128,128]{1,0} fusion(%start, %q), kind=kOutput, calls=%continue_body",
    "  ROOT %done = bf16[64,128]{1,0} fusion(%start), kind=kCustom, calls=%done_body",
    "}", ""])


def test_an_asynchronous_collective_fusion_is_counted_once():
    """Its start, its continuation inside a matmul and its done each hold the all-gather:
    it sends 3 shards of 4 KiB over ``context`` once, not three times."""
    found = hlo_collectives.analyze(ASYNC_FUSIONS, SHAPE)
    assert found.bytes_by_axes == {"context": 3 * 16 * 128 * 2}
    assert found.count_by_axes == {"context": 1}
