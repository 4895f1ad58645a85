"""``python -m t5x_like.plan``: AOT compile reports. TPU topologies need libtpu
(the ``tpu`` extra); those tests skip without it. Each test runs the planner in a
fresh process, since it chooses the device count before JAX starts."""

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from t5x_like import errors, resolving
from t5x_like import plan as plan_command
from t5x_like.engine import partitioning
from t5x_like.planner import aot_planner, search

REPO = pathlib.Path(__file__).resolve().parents[1]
QUICKSTART = str(REPO / "configs" / "quickstart.py")
TINY = ["--config.model.d_model=32", "--config.model.d_ff=64", "--config.model.num_heads=2",
        "--config.model.head_dim=16", "--config.model.num_encoder_layers=1",
        "--config.model.num_decoder_layers=1", "--config.task_feature_lengths.inputs=32",
        "--config.task_feature_lengths.targets=8", "--config.batch_size=16"]
# A small row of the MaxText record's kind (``benchmarks/maxtext_record.py --smoke``): a
# two-layer Qwen3-style decoder (grouped queries, splash attention) under FSDP on v6e:2x2.
OPEN_DECODERS_TINY_ROW = [
    "--config=configs/open_decoders.py:qwen3-0.6b", "--topology=v6e:2x2",
    "--config.model.num_layers=2", "--config.model.d_model=256", "--config.model.num_heads=2",
    "--config.model.head_dim=128", "--config.model.attention.num_kv_heads=1",
    "--config.model.d_ff=512", "--config.model.vocab_size=1024", "--config.batch_size=8",
    "--config.task_feature_lengths.targets=256", "--config.model.numerics.remat_policy=full",
    "--config.mesh.data=1", "--config.mesh.fsdp=-1"]
# The dev extra installs libtpu (jax[tpu]): without it these tests fail, never skip.
assert importlib.util.find_spec("libtpu"), 'libtpu is missing: pip install -c constraints.txt -e ".[tpu]"'


def planner_env() -> dict:
    """The environment of a fresh planner process: this checkout first, no fake devices."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + sys.path[1:])
    return env


def run_plan(*args, check=True):
    result = subprocess.run([sys.executable, "-m", "t5x_like.plan", *args], cwd=REPO,
                            env=planner_env(), capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stderr[-2000:]
    return result


# A small vocabulary keeps the once-per-step optimizer update negligible (the microbatch
# test compares the step's FLOPs at 1 and 4 microbatches).
CPU_PLAN = [f"--config={QUICKSTART}", "--topology=cpu:8", "--json", *TINY,
            "--config.model.vocab_size=256", "--config.batch_size=64"]


@pytest.fixture(scope="module")
def cpu_report() -> dict:
    """One CPU plan (a compile in a fresh process) that three tests read: its JSON, the
    text ``plan`` prints for it (``plan.format_report``, what ``main`` prints without
    ``--json``) and its FLOPs at one microbatch."""
    return json.loads(run_plan(*CPU_PLAN).stdout)


def test_cpu_plan_reports_memory_and_flops_as_json(cpu_report):
    report = cpu_report
    memory = report["memory_per_device"]
    assert report["num_devices"] == 8 and report["mesh"]["data"] == 8
    assert memory["arguments"] > memory["params"] > 0 and memory["temporaries"] > 0
    assert memory["total"] >= memory["arguments"]
    assert report["fits"] is None  # no HBM figure for CPU
    # XLA's per-device count times 8 devices is close to the documented model FLOPs.
    assert 0.8 < report["compiled_flops_per_device"] * 8 / report["model_flops_per_step"] < 1.5


def test_cpu_plan_prints_a_readable_report_in_mib(cpu_report):
    out = plan_command.format_report(cpu_report)
    assert "fits: unknown" in out and "memory per device:" in out and "MiB" in out


@pytest.mark.parametrize("topology, message", [
    ("v5p", "expected NAME:SHAPE"), ("cpu:x", "cpu needs a device count"),
    ("v5e:4by4", "2 or 3 positive sizes"),
])
def test_bad_topologies_are_named(topology, message):
    with pytest.raises(aot_planner.PlanError, match=message):
        aot_planner.parse_topology(topology)


def test_batch_that_does_not_divide_the_topology_is_a_config_error():
    result = run_plan(f"--config={QUICKSTART}", "--topology=cpu:3", check=False)
    assert result.returncode == 2 and "batch_size=32 does not divide" in result.stderr


def test_tpu_plan_fits_a_small_model_and_gives_a_roofline():
    result = run_plan(f"--config={QUICKSTART}", "--topology=v5e:2x2", *TINY)
    out = result.stdout
    assert "4 x TPU v5 lite" in out and "fits: FITS in 16.00 GiB" in out
    assert "roofline step time" in out and "MFU at best" in out
    assert re.search(r"^predicted step time: [0-9.]+ ms, MFU [0-9.]+% \(the compiled schedule",
                     out, flags=re.M), out
    # v5e's links are in the table: the collectives' time enters the roofline, and the
    # gradient's all-reduce over the 4 data-parallel chips is listed by its axis.
    assert ", collectives " in out
    assert "collectives per device and step, by the mesh axes they cross:" in out
    assert re.search(r"^ .* ops +[0-9.]+ ms  data$", out, flags=re.M), out
    # libtpu's notice that it found no chip reads like an error on a machine without one.
    assert "could not determine TPU accelerator type" not in result.stderr, result.stderr


def test_multi_slice_plan_puts_the_dcn_axis_across_slices():
    out = json.loads(run_plan(f"--config={QUICKSTART}", "--topology=v5e:2x2", "--num_slices=2",
                              "--json", *TINY).stdout)
    assert out["num_devices"] == 8 and out["num_slices"] == 2 and out["fits"]
    assert out["mesh"] == {"dcn": 2, "stage": 1, "data": 4, "fsdp": 1, "expert": 1, "context": 1,
                           "tensor": 1}
    refused = run_plan(f"--config={QUICKSTART}", "--topology=v5e:2x2", "--num_slices=2",
                       "--config.mesh.dcn=1", *TINY, check=False)
    assert refused.returncode == 2 and "set --config.mesh.dcn=2" in refused.stderr


def test_tpu_plan_says_what_does_not_fit_and_why():
    # A 4M-row vocabulary: the f32 embedding alone is 16 GiB, Adam state twice that.
    result = run_plan(f"--config={QUICKSTART}", "--topology=v5e:2x2", *TINY,
                      "--config.model.vocab_size=4194304", "--config.model.d_model=1024",
                      "--config.optimizer.name=adamw", "--config.partitioning.rules=data_parallel",
                      check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "DOES NOT FIT in 16.00 GiB" in result.stdout
    assert "compiler: RESOURCE_EXHAUSTED" in result.stdout
    consumers = result.stdout.split("largest consumers per device:")[1].splitlines()[1:4]
    assert "temporaries" in consumers[0]
    # Adam's two f32 moments of every parameter, in closed form (T5 v1.1 as in
    # tests/test_cli.py): untied embeddings 2 V d, an encoder layer's attention 4 d inner,
    # gated MLP 3 d d_ff and 2 norms, a decoder layer's two attentions and 3 norms, 2 final
    # norms, 32 buckets x 2 heads of relative bias per stack: 64.01 GiB, replicated.
    vocab, d, inner, d_ff = 4194304, 1024, 2 * 16, 64
    params = (2 * vocab * d + (4 * d * inner + 3 * d * d_ff + 2 * d)
              + (8 * d * inner + 3 * d * d_ff + 3 * d) + 2 * d + 2 * 32 * 2)
    assert "optimizer state (all)" in consumers[1]
    assert f"{2 * 4 * params / 2**30:.2f} GiB" in consumers[1], consumers[1]
    arrays = result.stdout.split("largest arrays per device:")[1].splitlines()[1:5]
    assert any("token_embedder/embedding" in line and "16.00 GiB" in line for line in arrays)


def test_microbatch_loop_flops_are_counted_k_times(cpu_report):
    four = json.loads(run_plan(*CPU_PLAN, "--config.optimizer.microbatches=4").stdout)
    assert four["compiled_flops_per_device"] == pytest.approx(
        cpu_report["compiled_flops_per_device"], rel=0.1)


def test_scanned_layers_count_matmul_flops_and_loop_bytes_per_trip():
    args = [f"--config={QUICKSTART}", "--topology=v5e:2x2", "--json", *TINY,
            "--config.model.num_encoder_layers=4", "--config.model.num_decoder_layers=4"]
    loop = json.loads(run_plan(*args).stdout)
    scanned = json.loads(run_plan(*args, "--config.model.scan_layers=true").stdout)
    # XLA counts the scanned body once (its count alone is under 75% of the loop's); the
    # planner counts each matmul per trip, within a few percent of the unrolled program
    # (elementwise work stays counted once, a larger share at this tiny width)...
    ratio = scanned["compiled_flops_per_device"] / loop["compiled_flops_per_device"]
    assert 0.93 < ratio <= 1.0, ratio
    assert "scanned layers" in scanned["note"] and "note" not in loop
    # ...and the roofline's compute time takes the larger of that and the model FLOPs.
    per_device = max(scanned["compiled_flops_per_device"],
                     scanned["model_flops_per_step"] / scanned["num_devices"])
    assert scanned["roofline"]["compute_s"] == pytest.approx(
        per_device / scanned["peak_flops_per_device"])
    # The bytes count each loop body once per trip, close to the unrolled program's
    # (the scan adds its own slicing and stacking, so a little above it).
    ratio = scanned["bytes_accessed_per_device"] / loop["bytes_accessed_per_device"]
    assert 0.9 < ratio < 1.35, ratio
    sources = scanned["hbm_traffic_by_source"]
    assert 0 < sum(row["share"] for row in sources) <= 1
    assert any(row["source"].startswith("backward EncoderDecoder/encoder/layers")
               for row in sources)


EINSUM_DRIVER = """
import json
from t5x_like.planner import aot_planner, hlo_matmuls
aot_planner.prepare_compiler_environment()
import jax, jax.numpy as jnp
device = aot_planner.topology_devices("v5e:2x2")[0]
sharding = jax.sharding.SingleDeviceSharding(device)
rows = []
for equation, a, b in [("bsd,df->bsf", (4, 128, 256), (256, 512)),
                       ("bqhd,bkhd->bhqk", (2, 128, 4, 64), (2, 256, 4, 64)),
                       ("bhqk,bkhd->bqhd", (2, 4, 128, 256), (2, 256, 4, 64)),
                       ("bqgrd,bkgd->bgrqk", (2, 128, 2, 4, 64), (2, 256, 2, 64)),
                       ("bsd,bsf->df", (4, 128, 256), (4, 128, 512))]:
    for dtype in (jnp.float32, jnp.bfloat16):
        step = jax.jit(lambda x, y, equation=equation: jnp.einsum(equation, x, y))
        compiled = step.lower(jax.ShapeDtypeStruct(a, dtype, sharding=sharding),
                              jax.ShapeDtypeStruct(b, dtype, sharding=sharding)).compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        text = compiled.as_text()
        rows.append([equation, " convolution(" in text, cost["flops"],
                     hlo_matmuls.matmul_flops(text)[0]])
print(json.dumps(rows))
"""


def test_tpu_convolutions_count_the_flops_xla_counts():
    """libtpu lowers dots, batched ones too (attention's scores, grouped-query heads, a
    weight gradient), to convolutions whose batch dimensions become dilated, strided
    spatial ones: the HLO reader counts their FLOPs as XLA's cost analysis does, to the
    FLOP (a convolution counted by its operand sizes alone is off for every batched one)."""
    result = subprocess.run([sys.executable, "-c", EINSUM_DRIVER], cwd=REPO, env=planner_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(result.stdout.splitlines()[-1])
    assert len(rows) == 10 and all(convolution for _, convolution, _, _ in rows)
    for equation, _, xla_flops, read in rows:
        assert read == xla_flops, equation


@pytest.mark.parametrize("topology, slices", [("cpu:8", 2), ("v5e:2x2", 0)])
def test_bad_slice_counts_are_named(topology, slices):
    with pytest.raises(aot_planner.PlanError, match=rf"--num_slices={slices}: give a positive number "
                                             r"of TPU slices"):
        aot_planner.topology_devices(topology, slices)


def test_decode_plan_counts_one_token_with_the_cross_attention_cache():
    """``--decode``: one token per row over the cache; the encoder output's keys and
    values come from the cache, so the step's FLOPs are the decoder's per token (the
    formula below), not the encoder length times the projections."""
    report = json.loads(run_plan(f"--config={QUICKSTART}", "--topology=cpu:8", "--decode",
                                 "--json", *TINY).stdout)
    from t5x_like import config_lib
    v = config_lib.load_config_file(QUICKSTART).model.vocab_size
    b, d, h, dh, f = 16, 32, 2, 16, 64  # TINY
    si, st, layers = 32, 8, 1
    # T5 v1.1's gated-GELU MLP has three d x f matrices; self-attention four and the
    # cross-attention two (query, output) d x h*dh matrices per layer.
    per_token = layers * (6 * d * h * dh + 3 * d * f) + d * v
    attention = 2 * layers * (st + si) * h * dh
    expected = 2 * b * (per_token + attention)
    assert 0.8 < report["flops_per_device"] * 8 / expected < 1.3, report["flops_per_device"]
    memory = report["memory_per_device"]
    assert memory["cache"] > 0 and memory["total"] >= memory["arguments"] > memory["cache"]


def test_decode_plan_of_a_decoder_on_tpu_gives_tokens_per_second():
    out = run_plan(f"--config={REPO / 'configs' / 'pretrain' / 'gpt2_tiny.py'}",
                   "--topology=v5e:2x2", "--decode", "--config.batch_size=8").stdout
    assert "plan --decode: decoder on v5e:2x2" in out and "FITS" in out
    assert "memory-bound" in out and "tokens/s for the slice" in out


def test_decode_plan_of_an_encoder_is_refused():
    result = run_plan(f"--config={REPO / 'configs' / 'pretrain' / 'bert_tiny.py'}",
                      "--topology=cpu:8", "--decode", check=False)
    assert result.returncode == 2 and "does not generate text" in result.stderr
    assert "Traceback" not in result.stderr


GPT2_TINY = f"--config={REPO / 'configs' / 'pretrain' / 'gpt2_tiny.py'}"
ONE_REPLICA = ["--config.mesh.data=1", "--config.mesh.fsdp=1", "--config.mesh.tensor=-1"]


def test_the_engines_decode_step_is_planned_over_its_page_pool():
    """``--decode --page_size``: the continuous-batching engine's step, 8 slots of up to
    160 positions (10 pages of 16) over a pool of every slot at its longest plus the
    scratch page (81), or a pool of 41 given: the cache is the pool's, so it scales with
    the pages; on a TPU, the roofline's tokens/s."""
    def paged(*extra):
        return json.loads(run_plan(GPT2_TINY, "--topology=cpu:8", "--decode", "--json",
                                   "--page_size=16", "--config.batch_size=8", *ONE_REPLICA,
                                   *extra).stdout)
    full, half = paged(), paged("--pages=41")
    assert full["pages"] == {"slots": 8, "max_length": 160, "page_size": 16,
                             "pages_per_row": 10, "pages": 81, "full_pool": 81}
    assert half["pages"]["pages"] == 41
    assert half["memory_per_device"]["cache"] / full["memory_per_device"]["cache"] == (
        pytest.approx(41 / 81, rel=0.01))
    text = run_plan(GPT2_TINY, "--topology=v5e:2x2", "--decode", "--page_size=16",
                    "--config.batch_size=8", *ONE_REPLICA).stdout
    assert ("continuous batching: 8 slots of up to 160 positions (10 pages each) over a pool "
            "of 81 pages of 16 (every slot at its longest, the scratch page included)") in text
    assert "FITS" in text and "tokens/s for the slice" in text


def test_a_tpu_plan_of_the_engines_step_attends_with_the_paged_attention_kernel():
    """Heads of 128 on a TPU: each layer's step is the Pallas paged-attention kernel,
    run per device under ``shard_map`` (the step that gathers pages has none), and it
    compiles through libtpu with the pools' heads over ``tensor``."""
    def sources(*extra):
        report = json.loads(run_plan(GPT2_TINY, "--topology=v5e:2x2", "--decode", "--json",
                                     "--page_size=16", "--config.batch_size=8", *ONE_REPLICA,
                                     *extra).stdout)
        return [row["source"] for row in report["hbm_traffic_by_source"]]
    assert any(s.endswith("attention/shard_map") for s in sources("--config.model.head_dim=128"))
    assert not any("shard_map" in s for s in sources())  # heads of 32: the pages gathered


@pytest.mark.parametrize("config, extra, message", [
    (GPT2_TINY, ["--page_size=16"], "add --decode"),
    (GPT2_TINY, ["--decode", "--pages=40"], "give --page_size too"),
    (GPT2_TINY, ["--decode", "--page_size=16"], "one engine serves one replica"),
    (GPT2_TINY, ["--decode", "--page_size=16", "--pages=5", *ONE_REPLICA],
     "needs 10 pages of 16, plus the scratch page; give --pages=11"),
    (f"--config={REPO / 'configs' / 'pretrain' / 't5_tiny.py'}",
     ["--decode", "--page_size=16", *ONE_REPLICA], "not served by the continuous-batching"),
])
def test_paged_decode_plans_that_cannot_work_are_refused(config, extra, message):
    result = run_plan(config, "--topology=cpu:8", *extra, check=False)
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_an_int8_plan_runs_its_int8_matmuls_at_the_int8_peak():
    result = run_plan(f"--config={QUICKSTART}", "--topology=v5p:2x2x1", *TINY, "--json",
                      "--config.quantization.kind=int8", "--config.model.numerics.dtype=bfloat16")
    report = json.loads(result.stdout)
    q, roof = report["quantization"], report["roofline"]
    # projections in int8; attention scores and the (here large: 8k x 32) logits in bf16
    assert 0.1 < q["matmul_share"] < 0.5
    bf16, int8 = report["peak_flops_per_device"], q["peak_flops_per_device"]
    assert (bf16, int8) == (459e12, 918e12)
    assert roof["compute_s"] == pytest.approx(
        report["compiled_flops_per_device"] * (q["matmul_share"] / int8
                                               + (1 - q["matmul_share"]) / bf16))
    text = plan_command.format_report(report)  # what plan prints without --json
    assert re.search(r"quantization: int8: [0-9.]+% of the matmul FLOPs run in int8 at 918 "
                     r"TFLOP/s, the rest at 459 \(bf16\)", text), text


def test_fp8_on_a_tpu_without_fp8_units_is_refused_before_compiling():
    result = run_plan(f"--config={QUICKSTART}", "--topology=v6e:2x2", *TINY,
                      "--config.quantization.kind=fp8", check=False)
    assert result.returncode == 2
    assert ("quantization.kind='fp8' needs fp8 matmul units, which TPU v6 lite does not have; "
            "use --config.quantization.kind=int8.") in result.stderr


def test_a_decode_step_with_int8_weights_reads_fewer_hbm_bytes():
    def decode_plan(*extra):
        return json.loads(run_plan(f"--config={REPO / 'configs' / 'gpt2_small.py'}",
                                   "--topology=v5e:2x2", "--decode", "--json",
                                   "--config.batch_size=8", *extra).stdout)
    floats, int8 = decode_plan(), decode_plan("--config.quantization.weights=int8")
    assert (floats["weights"], int8["weights"]) == ("float", "int8")
    # GPT-2 small: 85M of its 124M parameters are attention and MLP kernels; the float
    # checkpoint's are float32, the token table stays float (measured 474.7 -> 232.0 MiB).
    ratio = int8["memory_per_device"]["params"] / floats["memory_per_device"]["params"]
    assert 0.4 < ratio < 0.6, ratio
    # ... and the step reads them once: 2.87 -> 1.84 GB a step and device, measured.
    assert int8["bytes_accessed_per_device"] < 0.8 * floats["bytes_accessed_per_device"]
    assert int8["roofline"]["tokens_per_s"] > floats["roofline"]["tokens_per_s"]


def test_offloaded_remat_keeps_every_layers_input_in_host_memory():
    """``remat_policy=offload`` on a 4-layer decoder (v6e:2x2, FSDP over 4): the compiled
    program holds each layer's input, 2 rows of 2,048 x 256 in bfloat16 a chip, in host
    memory; ``full`` holds nothing there."""
    row = [a for a in OPEN_DECODERS_TINY_ROW if "num_layers" not in a and "targets" not in a
           and "remat_policy" not in a]
    host = {}
    for policy in ("full", "offload"):
        result = run_plan(*row, "--config.model.num_layers=4",
                          "--config.task_feature_lengths.targets=2048",
                          f"--config.model.numerics.remat_policy={policy}", "--json")
        host[policy] = json.loads(result.stdout)["memory_per_device"]["host_temporaries"]
    assert host == {"full": 0, "offload": 4 * 2 * 2048 * 256 * 2}



def test_search_ranks_compiled_candidates_by_predicted_step_time():
    """``plan --search`` on the small row: whole physical axes to data and fsdp (tensor
    only where it divides the heads), compiled (two at a time) and ranked, fitting plans by their predicted step; each
    row's command plans that candidate again, to the same prediction."""
    row = [a for a in OPEN_DECODERS_TINY_ROW if not a.startswith("--config.mesh.")
           and "remat_policy" not in a]
    found = json.loads(run_plan(*row, "--search", "--search_limit=4", "--search_workers=2",
                                "--json").stdout)
    assert len(found) == 4
    # One key/value head: no mesh splits heads over tensor (it could not compile).
    assert not any("tensor" in c["candidate"] for c in found)
    steps = [c["report"]["predicted"]["step_s"] for c in found
             if "report" in c and c["report"]["fits"]]
    assert len(steps) >= 2 and steps == sorted(steps)
    best = found[0]
    assert best["candidate"].endswith("remat full, 1 microbatch(es)")
    command = best["command"].split()
    assert command[:3] == ["python", "-m", "t5x_like.plan"]
    again = json.loads(run_plan(*command[3:], "--json").stdout)
    assert again["predicted"]["step_s"] == best["report"]["predicted"]["step_s"]
    assert again["mesh"] == best["report"]["mesh"]
    text = run_plan(*row, "--search", "--search_limit=1").stdout
    assert text.startswith("plan --search: 1 candidates for v6e:2x2, best first")
    assert re.search(r"^\| 1 \| data 4, remat full, 1 microbatch\(es\) \| yes \| .* \| "
                     r"`--config.mesh.data=4 .*--config.optimizer.microbatches=1` \|$", text,
                     flags=re.M), text


@pytest.mark.parametrize("extra, message", [
    (["--topology=cpu:8"], "--search ranks train-step plans on a TPU topology"),
    (["--topology=v5e:2x2", "--search_limit=0"],
     "--search_limit and --search_workers must be at least 1."),
])
def test_search_needs_a_tpu_topology_and_positive_limits(extra, message):
    result = run_plan(f"--config={QUICKSTART}", *extra, "--search", check=False)
    assert result.returncode == 2
    assert message in result.stderr


def test_a_mesh_axis_splits_a_torus_dimension_only_when_asked():
    """fsdp 8 x tensor 2 on a 4x4 v6e: 8 is no product of whole torus dimensions (4 and
    4), so the mesh is refused, naming the switch; with it the axis takes 4 x half a 4."""
    devices = aot_planner.topology_devices("v6e:4x4")
    shape = {"fsdp": 8, "tensor": 2}
    with pytest.raises(errors.UserError, match="split_physical_axes=true"):
        partitioning.make_mesh(shape, devices)
    mesh = partitioning.make_mesh(shape, devices, split_physical_axes=True)
    assert (mesh.shape["fsdp"], mesh.shape["tensor"]) == (8, 2)
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)


@pytest.mark.parametrize("targets, with_context", [(8192, True), (1024, False)])
def test_search_meshes_add_context_and_stage_axes_the_run_accepts(targets, with_context):
    """The 8B at 16 rows on v5p:4x4x2: meshes over data, fsdp and tensor first, then
    context axes (only where each device keeps at least 1,024 of a row's positions), then
    pipeline stages; every one is a mesh the run's own device checks accept."""
    spec = resolving.resolve_spec(resolving.load_config(
        str(REPO / "configs" / "open_decoders.py") + ":llama-3.1-8b",
        ["batch_size=16", f"task_feature_lengths.targets={targets}"]))
    runs = search.accepted_by(spec, "v5p:4x4x2")
    found = [dict(mesh) for mesh in search.meshes("v5p:4x4x2", runs, heads=8, length=targets)]
    kinds = [(m["stage"] > 1, m["context"] > 1) for m in found]
    assert kinds == sorted(kinds) and (False, False) in kinds and (True, False) in kinds
    assert ((False, True) in kinds) is with_context
    assert all(runs(m) and 8 % m["tensor"] == 0 for m in found)
    assert all(targets // m["context"] >= search.MIN_CONTEXT_POSITIONS for m in found)
    assert not runs({**dict.fromkeys(found[0], 1), "data": 32})  # 16 rows over 32 replicas
