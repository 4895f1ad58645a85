"""Will this config fit, and how fast could it run? Ahead-of-time, without the chips.

    python -m t5x_like.plan --config=configs/t5_1_1_xl.py --topology=v5p:4x4x4
    python -m t5x_like.plan --config=configs/quickstart.py --topology=cpu:8 --json
    python -m t5x_like.plan --config=configs/t5_1_1_xl.py --topology=v5p:4x4x4 --decode

Compiles the real train step (same Trainer, shardings and donation as
``train.py``) for a TPU topology through libtpu's compiler via
``jax.experimental.topologies`` (``pip install -c constraints.txt -e ".[tpu]"``; no TPU
needed), or for N fake CPU devices with ``cpu:N``. Reports per-device memory
(arguments, outputs, temporaries), whether it fits the chip's HBM (naming the
largest consumers when it does not), the compiled FLOPs per step, and a
roofline step time and MFU: ``max(FLOPs / peak, bytes accessed / HBM bandwidth,
collective bytes / link bandwidth)`` per device, an optimistic bound (each overlapping
the others), with the sources (forward or backward, module path) that move the most
HBM bytes (``t5x_like.planner.hlo_traffic``) and the collectives' bytes by the mesh axes they
cross (``t5x_like.planner.hlo_collectives``). ``--decode`` plans one generation step instead: memory,
FLOPs and HBM bytes per token, and the roofline's tokens/s; with ``--page_size`` the
continuous-batching engine's step (``t5xl serve``): slots over a pool of key/value pages.
Beside the bound, a predicted step time and MFU: the compiled schedule played on the chip
(``t5x_like.planner.step_time``, docs/planning.md). ``--search`` compiles the meshes, remat
policies and microbatch counts the topology allows and ranks them by that prediction:

    python -m t5x_like.plan --config=configs/t5_1_1_xl.py --topology=v5p:4x4x4 --search \
        --config.batch_size=128
"""

from __future__ import annotations

import argparse
import json
import sys

from t5x_like import cli_flags, errors, resolving
from t5x_like.planner import search, topology
from t5x_like.planner.topology import GiB

# Imports inside functions: keep JAX out of the command's start-up: a mistake in the config or
# the flags is reported before JAX loads (and libtpu's environment is set before JAX starts).


def format_decode_report(r: dict) -> str:
    m = r["memory_per_device"]
    lines = [f"plan --decode: {r['config_model']} on {r['topology']} ({r['num_devices']} x "
             f"{r['device_kind']}), mesh {r['mesh']}, rules {r['rules']}, batch "
             f"{r['batch_size']}, cache of {r['lengths']}"
             + (", int8 attention and MLP weights" if r.get("weights") == "int8" else ""),
             f"memory per device: the step's arguments {_gib(m['arguments']).strip()} (the "
             f"params it reads, cache {_gib(m['cache']).strip()}, inputs; all params held: "
             f"{_gib(m['params']).strip()}), temporaries {_gib(m['temporaries']).strip()}, "
             f"total {_gib(m['total']).strip()}"]
    if "pages" in r:
        p = r["pages"]
        full = ("every slot at its longest" if p["pages"] == p["full_pool"] else
                f"{p['pages'] / p['full_pool']:.0%} of every slot at its longest")
        lines.insert(1, f"continuous batching: {p['slots']} slots of up to {p['max_length']} "
                        f"positions ({p['pages_per_row']} pages each) over a pool of "
                        f"{p['pages']} pages of {p['page_size']} ({full}, the scratch page "
                        f"included): cache {_gib(m['cache']).strip()} per device, "
                        f"{m['cache'] / m['total']:.0%} of the step's memory")
    if r["hbm_per_device"] is not None:
        lines.append(f"fits: {'FITS' if r['fits'] else 'DOES NOT FIT'} in "
                     f"{_gib(r['hbm_per_device']).strip()} HBM per device")
    if r.get("compiler_out_of_memory"):
        lines.append(f"  compiler: {r['compiler_out_of_memory']}")
        lines.append("  to fit: fewer rows (--config.batch_size), shorter ones "
                     "(task_feature_lengths), more chips on tensor, or with --page_size a "
                     "smaller pool (--pages)")
    if r["flops_per_device"] is not None:
        lines.append(f"per decode step and device: {r['flops_per_device']:.3e} FLOPs, "
                     f"{r['bytes_accessed_per_device'] / 1e9:.2f} GB of HBM traffic")
    if "roofline" in r:
        roof = r["roofline"]
        lines.append(f"roofline step time: {roof['step_s'] * 1e3:.2f} ms ({roof['bound']}-bound:"
                     f" compute {roof['compute_s'] * 1e3:.2f} ms, HBM "
                     f"{roof['memory_s'] * 1e3:.2f} ms), at best {roof['tokens_per_s']:,.0f} "
                     "tokens/s for the slice")
    lines += _traffic_lines(r)
    return "\n".join(lines)


def _traffic_lines(r: dict) -> list[str]:
    if not r.get("hbm_traffic_by_source"):
        return []
    return (["HBM traffic per device by source (forward/backward, module path):"]
            + [f"  {row['bytes'] / 1e9:9.1f} GB  {100 * row['share']:5.1f}%  {row['source']}"
               for row in r["hbm_traffic_by_source"]])


def _gib(n) -> str:
    """Bytes in GiB, or MiB below 1 GiB so small plans (cpu:8) do not read 0.00."""
    return f"{n / GiB:8.2f} GiB" if n >= GiB else f"{n / 1024**2:8.2f} MiB"


def _pipeline_lines(r: dict) -> list[str]:
    p = r.get("pipeline")
    if not p:
        return []
    laps = f", {p['repeats']} laps" if p["schedule"] == "circular" else ""
    where = ", stages across slices (DCN)" if p["over_dcn"] else ""
    return [f"pipeline: {p['schedule']}, {p['stages']} stages, {p['microbatches']} microbatches"
            f"{laps}{where}; bubble {100 * p['bubble']:.1f}% of the stages' time (in the "
            "roofline)"]


def _quantization_lines(r: dict) -> list[str]:
    q = r.get("quantization")
    if not q:
        return []
    peak = ("" if not q["peak_flops_per_device"] else
            f" at {q['peak_flops_per_device'] / 1e12:,.0f} TFLOP/s, the rest at "
            f"{r['peak_flops_per_device'] / 1e12:,.0f} (bf16); MFU is against the bf16 peak")
    return [f"quantization: {q['kind']}: {100 * q['matmul_share']:.1f}% of the matmul FLOPs "
            f"run in {q['kind']}{peak}"]


def format_report(r: dict) -> str:
    m = r["memory_per_device"]
    lines = [
        f"plan: {r['config_model']} on {r['topology']}"
        f"{' x ' + str(r['num_slices']) + ' slices' if r['num_slices'] > 1 else ''} "
        f"({r['num_devices']} x {r['device_kind']}), "
        f"mesh {r['mesh']}, rules {r['rules']}, batch {r['batch_size']}"
        f" in {r['microbatches']} microbatch(es)",
        *_pipeline_lines(r),
        "memory per device:",
        f"  arguments     {_gib(m['arguments'])}   (params {_gib(m['params']).strip()}, "
        f"optimizer state {_gib(m['optimizer_state']).strip()}, batch)",
        f"  outputs       {_gib(m['outputs'])}   ({_gib(m['aliased']).strip()} reuse donated "
        "arguments)",
        f"  temporaries   {_gib(m['temporaries'])}",
        f"  code          {_gib(m['code'])}",
        f"  total         {_gib(m['total'])}",
    ]
    if m.get("host_temporaries"):
        lines.append(f"  host memory   {_gib(m['host_temporaries'])}   (activations offloaded "
                     "by remat_policy=offload; not in the total)")
    if r["hbm_per_device"] is None:
        lines.append(f"fits: unknown (no HBM figure for {r['device_kind']!r})")
    else:
        verdict = "FITS" if r["fits"] else "DOES NOT FIT"
        lines.append(f"fits: {verdict} in {_gib(r['hbm_per_device']).strip()} HBM per device "
                     f"({100 * m['total'] / r['hbm_per_device']:.0f}% used)")
    if r.get("compiler_out_of_memory"):
        lines.append(f"  compiler: {r['compiler_out_of_memory']}")
    if r["fits"] is False:
        lines.append("largest consumers per device:")
        lines += [f"  {_gib(c['bytes'])}  {c['name']}" for c in r["largest_consumers"]]
        lines.append("largest arrays per device:")
        lines += [f"  {_gib(c['bytes'])}  {c['name']}" for c in r["largest_arrays"]]
        lines.append("  to fit: more chips, --config.mesh.fsdp=-1 (shard params and "
                     "optimizer state), --config.optimizer.microbatches=K (smaller "
                     "activations), or --config.optimizer.name=adafactor")
    if r["compiled_flops_per_device"] is None:
        lines.append(f"compiled FLOPs: none (the compiler stopped at the memory check); model "
                     f"FLOPs per step: {r['model_flops_per_step']:.3e}")
    else:
        lines.append(f"compiled FLOPs per device per step: {r['compiled_flops_per_device']:.3e}; "
                     f"model FLOPs per step: {r['model_flops_per_step']:.3e}")
    if "note" in r:
        lines.append(f"note: {r['note']}")
    lines += _quantization_lines(r)
    if "traffic_note" in r:
        lines.append(f"note: {r['traffic_note']}")
    if "roofline" in r:
        roof = r["roofline"]
        links = ("" if roof.get("communication_s") is None
                 else f", collectives {roof['communication_s'] * 1e3:.1f} ms")
        lines.append(f"roofline step time: {roof['step_s'] * 1e3:.1f} ms ({roof['bound']}-bound: "
                     f"compute {roof['compute_s'] * 1e3:.1f} ms, HBM {roof['memory_s'] * 1e3:.1f}"
                     f" ms{links}), MFU at best {100 * roof['mfu']:.1f}%")
    elif r["compiled_flops_per_device"] is not None:
        lines.append("roofline: no peak FLOP/s or bandwidth for this device kind (see "
                     "t5x_like.system.hardware.CHIPS)")
    lines += _predicted_lines(r)
    lines += _traffic_lines(r)
    lines += _collective_lines(r)
    return "\n".join(lines)


def _predicted_lines(r: dict) -> list[str]:
    if "prediction_note" in r:
        return [f"predicted: none ({r['prediction_note']})"]
    p = r.get("predicted")
    if not p:
        return []
    return [f"predicted step time: {p['step_s'] * 1e3:.1f} ms, MFU {100 * p['mfu']:.1f}% "
            f"(the compiled schedule played on the chip: matmul-bound "
            f"{p['compute_s'] * 1e3:.1f} ms at {100 * p['fill']:.0f}% matrix-unit fill, "
            f"HBM-bound {p['memory_s'] * 1e3:.1f} ms, waiting on collectives "
            f"{p['exposed_collective_s'] * 1e3:.1f} of {p['collective_s'] * 1e3:.1f} ms)"]


def _collective_lines(r: dict) -> list[str]:
    rows = r.get("collectives_per_device")
    if not rows:
        return []
    lines = ["collectives per device and step, by the mesh axes they cross:"]
    for row in rows:
        time = "" if row["seconds"] is None else f"  {row['seconds'] * 1e3:9.2f} ms"
        lines.append(f"  {row['bytes'] / 1e9:9.3f} GB  {row['count']:6d} ops{time}  {row['axes']}")
    return lines


def _search(args, config, overrides: list[str]) -> int:
    """``--search``: the candidates compiled and ranked (``planner.search``)."""
    if args.decode or topology.parse_topology(args.topology)[0] != "tpu":
        raise errors.UserError("--search ranks train-step plans on a TPU topology (its "
                               "physical axes make the meshes); leave out --decode, give "
                               "e.g. --topology=v5p:4x4x4.")
    if args.search_limit < 1 or args.search_workers < 1:
        raise errors.UserError("--search_limit and --search_workers must be at least 1.")
    results = search.run(args.config, args.topology, overrides, config,
                         num_slices=args.num_slices, limit=args.search_limit,
                         workers=args.search_workers)
    if args.json:
        print(json.dumps([{"candidate": r["candidate"].label, "command": r["command"],
                           **({"report": r["report"]} if "report" in r else
                              {"error": r["error"]})} for r in results], indent=2))
    else:
        print(f"plan --search: {len(results)} candidates for {args.topology}, best first "
              "(predicted step time: docs/planning.md); each plans alone with this command "
              "and its flags, without --search")
        print(search.table(results))
    return 0


@errors.command_line("plan")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    overrides = [a[len("--config."):] for a in argv if a.startswith("--config.")]
    rest = [a for a in argv if not a.startswith("--config.")]
    parser = argparse.ArgumentParser(prog="python -m t5x_like.plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="Python config file with get_config().")
    parser.add_argument("--topology", required=True,
                        help="TPU NAME:GRID (v5p:4x4x4, v5e:4x4, v4:2x2x1, ...) or cpu:N.")
    parser.add_argument("--num_slices", type=int, default=1,
                        help="Slices of --topology joined over the data-center network "
                             "(multi-slice); the mesh's dcn axis spans them.")
    parser.add_argument("--decode", action="store_true",
                        help="Plan one generation step (a token per row over the cache of "
                             "task_feature_lengths) instead of the train step.")
    parser.add_argument("--page_size", type=int, default=0,
                        help="With --decode: plan the continuous-batching engine's step "
                             "(t5xl serve): batch_size slots over a pool of pages of this "
                             "many positions.")
    parser.add_argument("--pages", type=int, default=0,
                        help="With --page_size: the pool's pages (0: every slot at the "
                             "longest row, plus the scratch page).")
    parser.add_argument("--json", action="store_true", help="Print the report as JSON.")
    parser.add_argument("--search", action="store_true",
                        help="Compile the meshes (whole physical axes to data, fsdp, tensor, "
                             "expert, context, stage), remat policies and microbatch counts the "
                             "topology "
                             "allows and rank them by predicted step time, each with its "
                             "command line.")
    parser.add_argument("--search_limit", type=int, default=12,
                        help="With --search: compiles at most.")
    parser.add_argument("--search_workers", type=int, default=1,
                        help="With --search: compiles at once (each a process of a few GiB).")
    cli_flags.add_module_flag(parser)
    args = parser.parse_args(rest)
    if (args.page_size or args.pages) and not args.decode:
        raise errors.UserError("--page_size and --pages plan the engine's decode step; add "
                               "--decode.")
    if args.pages and not args.page_size:
        raise errors.UserError("--pages sizes the engine's page pool; give --page_size too.")
    cli_flags.import_modules(args.module)
    topology.prepare_compiler_environment()
    topology.parse_topology(args.topology)
    config = resolving.resolve_spec(resolving.load_config(args.config, overrides))
    if args.search:
        return _search(args, config, [f"--config.{o}" for o in overrides])
    # JAX loads here, after the config is read and libtpu's environment is set.
    from t5x_like.planner import aot_planner
    compile_plan, formatter = ((aot_planner.plan_decode, format_decode_report) if args.decode
                               else (aot_planner.plan, format_report))
    paging = {"page_size": args.page_size, "pages": args.pages} if args.page_size else {}
    report = compile_plan(config, args.topology, args.num_slices, **paging)
    print(json.dumps(report, indent=2) if args.json else formatter(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
