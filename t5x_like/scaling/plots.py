"""The fit's pictures: IsoFLOP profiles with their minima, the compute-optimal frontier,
and the parametric law's residuals (PNG files, matplotlib's Agg backend)."""

from __future__ import annotations

import pathlib

import numpy as np

from t5x_like import errors
from t5x_like.errors import UserError
from t5x_like.scaling import fit as fitting
from t5x_like.scaling import laws

# Imports inside functions: matplotlib (the `plots` extra) loads only when a figure is drawn.


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UserError("scaling fit's plots need matplotlib: "
                        f"{errors.install_hint('plot')}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def write_plots(runs: fitting.Runs, isoflop: fitting.IsoFlopFit | None, law: laws.Law,
                output_dir: pathlib.Path) -> list[pathlib.Path]:
    plt = _pyplot()
    written = []
    colours = plt.get_cmap("viridis")
    budgets = np.unique(runs.budget)

    figure, axis = plt.subplots(figsize=(6, 4.5))
    for index, flops in enumerate(budgets):
        colour = colours(index / max(len(budgets) - 1, 1))
        rows = runs.budget == flops
        axis.scatter(runs.params[rows], runs.loss[rows], color=colour, s=14,
                     label=f"{flops:.2g} FLOPs")
        profile = next((p for p in (isoflop.budgets if isoflop else []) if p["flops"] == flops),
                       None)
        if profile and "parabola" in profile:
            x = np.linspace(np.log(runs.params[rows]).min(), np.log(runs.params[rows]).max(), 50)
            axis.plot(np.exp(x), np.polyval(profile["parabola"], x), color=colour, lw=1)
            if "N_opt" in profile:
                axis.scatter([profile["N_opt"]], [profile["loss"]], color=colour, marker="*",
                             s=90, edgecolor="black", zorder=3)
    axis.set_xscale("log")
    axis.set_xlabel("parameters N")
    axis.set_ylabel("final loss (nats per token)")
    axis.set_title("IsoFLOP profiles (stars: fitted minima)")
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    written.append(_save(figure, plt, output_dir / "isoflop.png"))

    figure, axis = plt.subplots(figsize=(6, 4.5))
    c = np.geomspace(budgets.min() / 3, budgets.max() * 30, 50)
    axis.plot(c, [law.optimum(x)[0] for x in c], label=f"approach 3: N ∝ C^{law.a:.2f}")
    if isoflop is not None:
        used = [p for p in isoflop.budgets if "N_opt" in p]
        axis.scatter([p["flops"] for p in used], [p["N_opt"] for p in used], color="C1",
                     zorder=3, label="approach 2 minima")
        axis.plot(c, [isoflop.optimum(x)[0] for x in c], color="C1", ls="--",
                  label=f"approach 2: N ∝ C^{isoflop.a:.2f}")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("compute C (FLOPs)")
    axis.set_ylabel("compute-optimal parameters")
    axis.set_title("Frontier")
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3, which="both")
    written.append(_save(figure, plt, output_dir / "frontier.png"))

    figure, axis = plt.subplots(figsize=(6, 4.5))
    predicted = np.array([law.loss(n, d) for n, d in zip(runs.params, runs.tokens, strict=True)])
    axis.scatter(runs.params, np.log(runs.loss) - np.log(predicted), s=14,
                 c=np.log10(runs.budget), cmap="viridis")
    axis.axhline(0, color="black", lw=0.8)
    axis.set_xscale("log")
    axis.set_xlabel("parameters N")
    axis.set_ylabel("ln loss - ln law (colour: log10 budget)")
    axis.set_title("Approach 3 residuals")
    axis.grid(alpha=0.3)
    written.append(_save(figure, plt, output_dir / "residuals.png"))
    return written


def _save(figure, plt, path: pathlib.Path) -> pathlib.Path:
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
