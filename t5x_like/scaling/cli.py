"""``python -m t5x_like.scaling <subcommand>`` (also ``t5xl scaling``): scaling laws.

    sweep --config=BASE --output_dir=DIR --budgets=1e14,3e14,1e15,3e15 [--sizes=5]
          [--dry_run] [--config.key=value ...]
          An IsoFLOP grid: per budget, --sizes models of the shape ladder, each trained
          on the tokens the budget buys it as a normal `train` run in DIR/points/NAME
          (cosine to 10% at its own end, held-out loss at its last step); finished
          points are skipped, unfinished ones resume; DIR/results.jsonl feeds `fit`.
    fit   --results=FILE --output_dir=DIR [--bootstrap=200] [--at_flops=C]
          Hoffmann et al.'s approaches 2 (IsoFLOP parabolas) and 3 (the parametric law)
          on runs with params, tokens, loss (CSV or JSONL); prints the coefficients with
          95% bootstrap intervals and writes fit.json, isoflop.png, frontier.png and
          residuals.png into DIR.
    plan  --law=besiroglu2024|hoffmann2022|E,A,B,alpha,beta|DIR/fit.json --flops=C
          The compute-optimal parameters and tokens for a budget by a law, tokens per
          parameter and the predicted loss, beside every published preset.
    plan  --law=... --chip_hours=H --topology=v5p:4x4x4 --config=BASE [--mfu=0.4]
          (or --flops=C --topology=... --config=BASE) and then the nearest model of
          BASE's family, its batch and peak learning rate, compiled for the topology by
          the AOT planner: fits or not, roofline step time and MFU bound, and the tokens
          and steps the budget buys it by flops.py's count.

Method and measured numbers: docs/scaling.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import pathlib
import sys

from t5x_like import cli_flags, config, errors, resolving
from t5x_like.errors import UserError
from t5x_like.planner import topology
from t5x_like.scaling import fit as fitting
from t5x_like.scaling import laws, plots, run_sizing, sweep

CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al.'s rule of thumb (approaches 1 and 2)


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m t5x_like.scaling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sweep", help="train an IsoFLOP grid of runs")
    p.add_argument("--config", required=True, help="base training config (task, lengths, "
                   "batch, optimizer); the sweep sets the model shape and the steps")
    p.add_argument("--output_dir", required=True)
    p.add_argument("--budgets", required=True,
                   help="comma-separated training FLOPs, e.g. 1e14,3e14,1e15,3e15")
    p.add_argument("--sizes", type=int, default=5, help="model sizes per budget")
    p.add_argument("--tokens_per_param", type=float, default=sweep.TARGET_TOKENS_PER_PARAM,
                   help="centre each budget's sizes on this many tokens per parameter")
    p.add_argument("--dry_run", action="store_true", help="print the grid, train nothing")
    cli_flags.add_module_flag(p)
    p = sub.add_parser("fit", help="fit approaches 2 and 3 to runs' results")
    p.add_argument("--results", required=True, help="CSV or JSONL: params, tokens, loss "
                   "[, flops, budget] per run")
    p.add_argument("--output_dir", required=True, help="where fit.json and the PNGs go")
    p.add_argument("--bootstrap", type=int, default=200, help="resamples for the intervals")
    p.add_argument("--at_flops", type=float, default=0.0,
                   help="budget whose optimum is reported with intervals (default: the "
                        "largest budget in the results)")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("plan", help="compute-optimal N and D for a budget")
    p.add_argument("--law", default="besiroglu2024",
                   help=f"one of {sorted(laws.PRESETS)}, E,A,B,alpha,beta, or a fit.json")
    p.add_argument("--flops", type=float, help="training compute budget")
    p.add_argument("--chip_hours", type=float,
                   help="the budget as chip-hours of --topology's chips (at --mfu)")
    p.add_argument("--topology", help="plan the nearest model for this TPU topology "
                   "(v5p:4x4x4, v5e:4x4, ...): needs --config")
    p.add_argument("--config", help="base config of the family to plan: task lengths, "
                   "vocabulary, layer recipe, optimizer, mesh")
    p.add_argument("--mfu", type=float, default=run_sizing.ASSUMED_MFU,
                   help="model FLOPs utilisation assumed for --chip_hours (the planner's "
                        "roofline bound is used where it is lower)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    cli_flags.add_module_flag(p)
    argv = sys.argv[1:] if argv is None else list(argv)
    rest, overrides = config.split_overrides(argv)
    args = parser.parse_args(rest)
    args.overrides = overrides
    return args


def _budgets(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"--budgets={text!r}: give comma-separated FLOPs, e.g. "
                        "1e14,3e14,1e15,3e15.") from None
    if len(values) < 2 or not all(math.isfinite(v) and v > 0 for v in values):
        raise UserError(f"--budgets={text!r}: give two or more positive FLOP budgets (approach "
                        "2 fits a line through their optima).")
    return values


def run_sweep(args) -> int:
    budgets = _budgets(args.budgets)
    cli_flags.import_modules(args.module)
    try:
        rows = sweep.run_sweep(args.config, args.overrides, args.output_dir, budgets,
                               args.sizes, dry_run=args.dry_run, modules=args.module,
                               tokens_per_param=args.tokens_per_param)
    except sweep.PointFailed as e:
        print(f"scaling sweep: {e}", file=sys.stderr)
        return 1
    if not args.dry_run:
        results = pathlib.Path(args.output_dir) / "results.jsonl"
        print(f"\n{len(rows)} runs in {results}; fit them with:\n  python -m t5x_like.scaling "
              f"fit --results={results} --output_dir={pathlib.Path(args.output_dir) / 'fit'}")
    return 0


def _count(x: float) -> str:
    """1.23e10 -> '12.3B' (parameters, tokens)."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if x >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


def _amount(x: float) -> str:
    """Hours and chip-hours: whole numbers from 100 up, 3 significant digits below."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _span(values) -> str:
    return f"[{values[0]:.4g}, {values[1]:.4g}]"


def run_fit(args) -> dict:
    if args.bootstrap < 0:
        raise UserError(f"--bootstrap={args.bootstrap}: give 0 (no intervals) or more.")
    runs = fitting.read_runs(args.results)
    output_dir = pathlib.Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    at_flops = args.at_flops or float(runs.budget.max())
    report: dict = {"results": str(args.results), "runs": len(runs), "at_flops": at_flops}

    print(f"{len(runs)} runs in {len(set(runs.budget.tolist()))} budgets from {args.results}\n")
    try:
        isoflop = fitting.fit_isoflop(runs)
    except UserError as e:
        isoflop = None
        report["approach2"] = {"not_fitted": str(e)}
        print(f"approach 2: not fitted: {e}\n")
    if isoflop is not None:
        print("approach 2 (IsoFLOP parabolas in ln N):")
        print(f"  {'budget FLOPs':>12} {'runs':>4} {'N_opt':>8} {'D_opt':>8} {'D/N':>7} "
              f"{'min loss':>8}")
        for p in isoflop.budgets:
            if "N_opt" in p:
                note = "" if p["inside"] else "  (minimum outside the sizes run)"
                print(f"  {p['flops']:>12.3g} {p['runs']:>4} {_count(p['N_opt']):>8} "
                      f"{_count(p['D_opt']):>8} {p['D_opt'] / p['N_opt']:>7.1f} "
                      f"{p['loss']:>8.4f}{note}")
            else:
                print(f"  {p['flops']:>12.3g} {p['runs']:>4} left out: {p['left_out']}")
        entry = {"a": isoflop.a, "b": isoflop.b, "log_kn": isoflop.log_kn,
                 "log_kd": isoflop.log_kd, "budgets": isoflop.budgets}
        n, d = isoflop.optimum(at_flops)
        entry["optimum"] = {"N": n, "D": d, "tokens_per_param": d / n}
        if args.bootstrap:
            try:
                entry["intervals"] = fitting.bootstrap_isoflop(
                    runs, at_flops, samples=args.bootstrap, seed=args.seed)
            except UserError as e:  # the point estimate stands; say why there is no interval
                print(f"approach 2 intervals: none ({e})")
        report["approach2"] = entry
        spans = entry.get("intervals", {})
        print(f"  a = {isoflop.a:.3f} {_span(spans['a']) if spans else ''}   "
              f"b = {isoflop.b:.3f} {_span(spans['b']) if spans else ''}\n")

    law, objective = fitting.fit_parametric(runs)
    entry = {"law": law.to_dict(), "huber_objective": objective, "a": law.a, "b": law.b}
    n, d = law.optimum(at_flops)
    entry["optimum"] = {"N": n, "D": d, "tokens_per_param": d / n,
                        "loss": law.loss(n, d)}
    if args.bootstrap:
        try:
            entry["intervals"] = fitting.bootstrap_parametric(
                runs, law, at_flops, samples=args.bootstrap, seed=args.seed)
        except UserError as e:
            print(f"approach 3 intervals: none ({e})")
    report["approach3"] = entry
    spans = entry.get("intervals", {})
    print(f"approach 3 (L = E + A/N^alpha + B/D^beta, Huber {fitting.HUBER_DELTA:g} on ln L, "
          f"L-BFGS):")
    for name in ("E", "A", "B", "alpha", "beta", "a", "b"):
        value = getattr(law, name)
        print(f"  {name:<5} = {value:<10.4g} {_span(spans[name]) if spans else ''}")

    print(f"\nthe optimum at {at_flops:.3g} FLOPs:")
    for name, key in (("approach 2", "approach2"), ("approach 3", "approach3")):
        optimum = report[key].get("optimum")
        if optimum:
            spans = report[key].get("intervals", {})
            detail = (f"  (N {_span(spans['N_opt'])}, D {_span(spans['D_opt'])})"
                      if spans else "")
            print(f"  {name}: N {_count(optimum['N'])}, D {_count(optimum['D'])}, "
                  f"{optimum['tokens_per_param']:.1f} tokens per parameter{detail}")
    print(f"  Chinchilla: about {CHINCHILLA_TOKENS_PER_PARAM} tokens per parameter")

    written = plots.write_plots(runs, isoflop, law, output_dir)
    (output_dir / "fit.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {output_dir / 'fit.json'}, " + ", ".join(p.name for p in written))
    return report


def run_plan(args) -> dict:
    law = laws.parse_law(args.law)
    if (args.flops is None) == (args.chip_hours is None):
        raise UserError("scaling plan: give the budget as --flops=C or as --chip_hours=H with "
                        "--topology.")
    if args.chip_hours is not None and not args.topology:
        raise UserError(f"--chip_hours={args.chip_hours:g}: give --topology (e.g. v5p:4x4x4), "
                        "whose chips the hours are of.")
    if args.topology and not args.config:
        raise UserError(f"--topology={args.topology}: give --config, the base config of the "
                        "family to plan (e.g. configs/decoder_modern_1b.py).")
    if not 0 < args.mfu <= 1:
        raise UserError(f"--mfu={args.mfu}: give the model FLOPs utilisation as a fraction in "
                        "(0, 1].")
    if args.flops is not None and not (math.isfinite(args.flops) and args.flops > 0):
        raise UserError(f"--flops={args.flops}: give a positive compute budget, e.g. 5.76e23.")
    base = None
    if args.topology:
        topology.parse_topology(args.topology)
        cli_flags.import_modules(args.module)
        base = resolving.load_and_validate(args.config, args.overrides)
        sweep.depth_keys(base)  # refuses a family without a ladder
    if args.chip_hours is not None:
        budget = run_sizing.chip_hours_budget(args.chip_hours, args.topology, args.mfu)
    else:
        budget = run_sizing.Budget(args.flops, mfu=args.mfu)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        report = _print_optimum(law, args.law, budget)
    if base is not None:
        # The planner's progress goes to stderr: stdout is the report.
        run = run_sizing.plan_run(base, law, budget, args.topology,
                                log=lambda line: print(line, file=sys.stderr, flush=True))
        with contextlib.redirect_stdout(out):
            _print_run(run, law, args.topology)
        report["run"] = run
    print(json.dumps(report, indent=1) if args.json else out.getvalue(), end="")
    return report


def _print_optimum(law, name: str, budget) -> dict:
    n, d = law.optimum(budget.flops)
    print(f"law: {law.source or name}  (E {law.E:.4g}, A {law.A:.4g}, B {law.B:.4g}, "
          f"alpha {law.alpha:.4g}, beta {law.beta:.4g}; N ∝ C^{law.a:.3f}, D ∝ C^{law.b:.3f})")
    if budget.chip_hours is None:
        print(f"budget: {budget.flops:.3g} FLOPs (C = 6 N D)\n")
    else:
        print(f"budget: {_amount(budget.chip_hours)} chip-hours x {budget.peak_flops:.3g} FLOP/s "
              f"peak x {100 * budget.mfu:.0f}% MFU (--mfu) = {budget.flops:.3g} FLOPs "
              "(C = 6 N D)\n")
    print(f"compute-optimal parameters N: {_count(n)} ({n:.4g})")
    print(f"compute-optimal tokens D:     {_count(d)} ({d:.4g})")
    print(f"tokens per parameter:         {d / n:.1f}")
    print(f"predicted loss:               {law.loss(n, d):.4f} nats per token\n")
    print("every preset at this budget:")
    for preset_name, preset in laws.PRESETS.items():
        pn, pd = preset.optimum(budget.flops)
        print(f"  {preset_name:<14} N {_count(pn):>7}  D {_count(pd):>7}  {pd / pn:>6.1f} "
              f"tokens/param  loss {preset.loss(pn, pd):.4f}")
    kaplan = laws.KAPLAN_2020
    print(f"  Kaplan et al. 2020 (separate laws, exponents only compare): L(N) = (N_c/N)^"
          f"{kaplan.alpha_N}, L(D) = (D_c/D)^{kaplan.alpha_D}; at this N and D: "
          f"{kaplan.loss_of_params(n):.3f}, {kaplan.loss_of_tokens(d):.3f}")
    return {"law": law.to_dict(), "flops": budget.flops, "N": n, "D": d,
            "tokens_per_param": d / n, "loss": law.loss(n, d)}


def _print_run(run: dict, law, topology: str) -> None:
    shape, plan, budget = run["shape"], run["plan"], run["budget"]
    print(f"\nthe nearest {plan['config_model']} (d_model/layers near {run_sizing.ASPECT}, "
          "the base config's recipe):")
    print(f"  {run_sizing.Shape(**shape).describe()}: N {_count(shape['params'])} "
          f"({shape['params']:,}; the law's {_count(run['N_opt'])})")
    print(f"  batch {run['batch_size']:,} sequences x {run['sequence_tokens']} = "
          f"{_count(run['batch_size'] * run['sequence_tokens'])} tokens, peak learning rate "
          f"{run['learning_rate']:.3g} (DeepSeek LLM's fits), {run['microbatches']} "
          f"microbatch(es)")
    if budget["mfu_source"] and budget["mfu_source"] != "--mfu":
        print(f"  budget lowered to {budget['flops']:.3g} FLOPs: {100 * budget['mfu']:.1f}% MFU, "
              f"{budget['mfu_source']}")
    print(f"  tokens: {_count(run['tokens'])} ({run['tokens'] / shape['params']:.1f} per "
          f"parameter) at {run['flops_per_token']:.4g} FLOPs per token (flops.py; 6 N = "
          f"{6 * shape['params']:.4g}), {run['steps']:,} steps; loss by the law "
          f"{law.loss(shape['params'], run['tokens']):.4f}")
    memory, hbm = plan["memory_per_device"], plan["hbm_per_device"]
    verdict = ("fits: unknown (no HBM figure)" if hbm is None else
               f"{'FITS' if plan['fits'] else 'DOES NOT FIT'}: {memory['total'] / 2**30:.2f} "
               f"of {hbm / 2**30:.0f} GiB per chip")
    print(f"\nthe AOT planner on {topology} ({run['chips']} x {plan['device_kind']}, mesh "
          f"{plan['mesh']}): {verdict}")
    if plan.get("note"):
        print(f"  note: {plan['note']}")
    if plan.get("compiled_flops_per_device"):
        print(f"  FLOPs per chip and step: compiled {plan['compiled_flops_per_device']:.4g}, "
              f"model {plan['model_flops_per_step'] / plan['num_devices']:.4g}")
    roof = plan.get("roofline")
    if roof:
        hours = run["roofline_hours"]
        links = ("collectives not counted" if roof.get("communication_s") is None
                 else f"collectives {roof['communication_s']:.3g} s")
        print(f"  roofline step {roof['step_s']:.3g} s ({roof['bound']}-bound: compute "
              f"{roof['compute_s']:.3g} s, HBM {roof['memory_s']:.3g} s, {links}), MFU at best "
              f"{100 * roof['mfu']:.1f}%: the {run['steps']:,} steps take at least "
              f"{_amount(hours)} hours on the slice ({_amount(hours * run['chips'])} chip-hours)")
        mfu = budget["mfu"]
        hours = budget["flops"] / (run["chips"] * plan["peak_flops_per_device"] * mfu) / 3600
        print(f"  at {100 * mfu:.1f}% MFU they take {_amount(hours)} hours on the slice "
              f"({_amount(hours * run['chips'])} chip-hours)")


@errors.command_line("scaling")
def main(argv=None) -> int:
    args = parse(argv)
    if args.command == "plan" and args.topology:
        topology.prepare_compiler_environment()  # before JAX starts: this is no TPU VM
    if args.command == "sweep":
        return run_sweep(args)
    if args.overrides and not (args.command == "plan" and args.config):
        raise UserError(f"--config.{args.overrides[0]}: config overrides belong to `scaling "
                        "sweep` and to `scaling plan --config`.")
    if args.command == "fit":
        run_fit(args)
    else:
        run_plan(args)
    return 0
