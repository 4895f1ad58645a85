"""A trained mixture of experts read at several capacity factors and dropless: held-out
loss, the fraction of assignments dropped, and each expert's share of them, over the
task's whole validation split (every example once, as ``train`` evaluates).

    python -m t5x_like.train --config=configs/pretrain/t5_tiny_moe.py --workdir=runs/pt_t5_moe
    python benchmarks/moe_capacity.py --checkpoint=runs/pt_t5_moe --dense=runs/pt_t5_dense
    python benchmarks/moe_capacity.py --smoke   # tiny: a check that it runs

``--dense``: a dense run of the same recipe, evaluated on the same batches for the
comparison line. ``--pack``: rows packed with examples (the run's own setting
otherwise); unpacked rows end in padding, which is routed like any token and, coming
last, is what capacity drops first. ``--loads_png``: each expert's share of the assignments over training,
from the MoE run's logged metrics, drawn to a PNG.

``--smoke``: tiny pretraining runs of the MoE recipe (1 layer a stack, made sparse with
``experts.every=1``: the recipe's every other layer would leave it dense) and of the dense
T5 (made in a temporary ``--runs`` unless it holds them), one capacity factor and dropless
on 2 batches, and the loads PNG in the temporary folder: a check that the script runs.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile

import jax
import numpy as np

import t5x_like.builtin_tasks  # noqa: F401  (registers the embedded tasks)
from t5x_like import structures
from t5x_like.checkpoints import param_sources
from t5x_like.data import pipeline


def held_out(config, params, max_batches: int) -> dict:
    """Token-weighted held-out loss and the router metrics' means over the validation
    split of ``config.task`` (one pass, batches of ``config.batch_size``)."""
    structure = structures.for_config(config)
    loss_fn = structure.loss_fn(config.loss)
    step = jax.jit(lambda p, b: loss_fn(structure.model, p, b, None)[1])
    lengths = dict(config.task_feature_lengths)
    stream = pipeline.build_dataset(
        config.task, "validation", lengths, seed=config.seed, shuffle=False, repeat=False,
        feature_converter=structure.feature_converter(lengths, pack=config.data.pack))
    rows = iter(stream)
    sums, tokens = {}, 0.0
    for _ in range(max_batches):
        batch = [example for _, example in zip(range(config.batch_size), rows, strict=False)]
        if len(batch) < config.batch_size:
            break
        stacked = {k: np.stack([e[k] for e in batch]) for k in batch[0]}
        metrics = jax.device_get(step(params, stacked))
        n = float(metrics["num_target_tokens"])
        tokens += n
        for key, value in metrics.items():
            if key != "num_target_tokens" and np.ndim(value) == 0:
                sums[key] = sums.get(key, 0.0) + float(value) * n
    return {key: value / tokens for key, value in sums.items()}


def per_example_nll(config, params, max_batches: int) -> np.ndarray:
    """Each held-out example's summed target negative log-likelihood and its token count
    (``[examples, 2]``), in the order ``held_out`` reads them."""
    structure = structures.for_config(config)
    score = jax.jit(structure.score_batch)
    lengths = dict(config.task_feature_lengths)
    stream = pipeline.build_dataset(
        config.task, "validation", lengths, seed=config.seed, shuffle=False, repeat=False,
        feature_converter=structure.feature_converter(lengths, pack=False))
    rows, found = iter(stream), []
    for _ in range(max_batches):
        batch = [example for _, example in zip(range(config.batch_size), rows, strict=False)]
        if len(batch) < config.batch_size:
            break
        stacked = {k: np.stack([e[k] for e in batch]) for k in batch[0]}
        nll = -np.asarray(score(params, stacked))
        found += list(zip(nll, stacked[structure.weights_feature].sum(axis=-1), strict=True))
    return np.asarray(found)


def paired_difference(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Per-token loss of ``b`` minus ``a`` over the same examples, and its standard error
    (the delta method over examples: ratio of sums)."""
    tokens = a[:, 1].sum()
    diff = (b[:, 0] - a[:, 0]) / tokens * len(a)  # each example's share, scaled to a mean
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(len(a)))


def restore(path: str):
    source = param_sources.resolve(path)
    step = source.steps()[-1]
    config = param_sources.config_from_saved(source.saved_config(step))
    return config, param_sources.load_params(source, step, config), step


def draw_loads(metrics_path: pathlib.Path, out: str, num_experts: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    records = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    records = [r for r in records if "moe_expert_fraction_0" in r]
    steps = [r["step"] for r in records]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for e in range(num_experts):
        ax.plot(steps, [r[f"moe_expert_fraction_{e}"] for r in records], label=f"expert {e}")
    ax.axhline(1.0 / num_experts, color="black", linestyle=":", label="uniform")
    ax.set_xlabel("step")
    ax.set_ylabel("share of token assignments")
    ax.set_title("Expert load over training (mean over sparse layers, training batches)")
    ax.legend(ncol=3, fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


# --smoke's MoE run: the dense tiny T5's widths, its 1 layer a stack sparse (the recipe's
# every other layer would leave it dense; 2 layers, one of them sparse, compile for twice
# as long).
SMOKE_MOE = ("pt_t5_moe", "configs/pretrain/t5_tiny_moe.py")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="", help="required but in --smoke")
    parser.add_argument("--dense", default="")
    parser.add_argument("--capacity_factors", default="1.0,1.25,2.0")
    parser.add_argument("--max_batches", type=int, default=1000)
    parser.add_argument("--loads_png", default="")
    parser.add_argument("--pack", action="store_true")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny runs, 2 batches: a check that the script runs")
    parser.add_argument("--runs", default="", help="--smoke: where the tiny runs are made")
    args = parser.parse_args(argv)
    if not args.smoke:
        if not args.checkpoint:
            parser.error("--checkpoint is required")
        return report(args)
    import _smoke
    _smoke.IN_PROCESS = True
    args.capacity_factors, args.max_batches = "2.0", 2
    with tempfile.TemporaryDirectory(prefix="moe_capacity_smoke_") as scratch:
        runs = pathlib.Path(args.runs or scratch)
        if not args.checkpoint:
            name, config = SMOKE_MOE
            _, model, lengths = _smoke.PRETRAINED["pt_t5"]
            args.checkpoint = str(_smoke.pretrain(  # its held-out loss is computed below
                runs / name, config, *model, *lengths, "--config.model.experts.every=1",
                "--config.evals.held_out.every_steps=0"))
            args.dense = args.dense or str(_smoke.pretrained(runs, "pt_t5"))
        args.loads_png = args.loads_png or str(pathlib.Path(scratch) / "loads.png")
        report(args)


def report(args) -> None:
    """The held-out table of ``args.checkpoint`` (and ``args.dense``), and the PNG."""
    config, params, step = restore(args.checkpoint)
    pack = config.data.pack or args.pack
    config = config.replace(data=config.data.replace(pack=pack))
    num_experts = config.model.experts.num_experts
    rows = []
    paired = None
    if args.dense:
        dense_config, dense_params, dense_step = restore(args.dense)
        dense_config = dense_config.replace(data=dense_config.data.replace(pack=pack))
        found = held_out(dense_config, dense_params, args.max_batches)
        rows.append((f"dense (step {dense_step})", found["loss"], None, None))
        paired = paired_difference(per_example_nll(dense_config, dense_params, args.max_batches),
                                   per_example_nll(config, params, args.max_batches))
    variants = [("capacity", float(f)) for f in args.capacity_factors.split(",")]
    variants.append(("dropless", None))
    for dispatch, factor in variants:
        experts = config.model.experts.replace(
            dispatch=dispatch, **({} if factor is None else {"capacity_factor": factor}))
        variant = config.replace(model=config.model.replace(experts=experts))
        found = held_out(variant, params, args.max_batches)
        shares = [found[f"moe_expert_fraction_{e}"] for e in range(num_experts)]
        name = f"capacity factor {factor}" if factor is not None else "dropless"
        rows.append((f"MoE (step {step}), {name}", found["loss"], found["moe_dropped_fraction"],
                     max(shares) * num_experts))
    print(f"held-out rows {'packed' if pack else 'padded'}, task {config.task}")
    print(f"{'model':<40} {'held-out loss':>14} {'dropped':>9} {'max load / uniform':>19}")
    for name, loss, dropped, peak in rows:
        dropped_text = "" if dropped is None else f"{100 * dropped:.2f}%"
        peak_text = "" if peak is None else f"{peak:.2f}"
        print(f"{name:<40} {loss:>14.4f} {dropped_text:>9} {peak_text:>19}")
    if paired is not None:
        print(f"MoE (as trained) minus dense, per target token over the same examples: "
              f"{paired[0]:+.4f} nats (standard error {paired[1]:.4f})")
    if args.loads_png:
        draw_loads(pathlib.Path(args.checkpoint) / "metrics.jsonl", args.loads_png, num_experts)
        print(f"wrote {args.loads_png}")


if __name__ == "__main__":
    main()
