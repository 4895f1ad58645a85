"""Measure-by-layer line charts, one PNG per analysis, models as lines.

Models differ in depth (a 2-layer T5 encoder beside 4-layer BERT and GPT-2), so the x
axis is relative depth, layer / num_layers: 0 is the embedding output, 1 the last
block. Random-init controls share their model's colour, dashed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# Imports inside functions: matplotlib (the `plots` extra) loads only when a figure is drawn.

# Pixels: 100 dpi, so a (8, 5) figure is 800 x 500.
DPI = 100


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _style(name: str, colours: dict) -> dict:
    base = name.removesuffix(" (random init)")
    if base not in colours:
        colours[base] = f"C{len(colours)}"
    dashed = base != name
    return {"color": colours[base], "linestyle": "--" if dashed else "-",
            "marker": "o", "markersize": 4, "alpha": 0.6 if dashed else 1.0, "label": name}


def relative_depth(values: Sequence[float]) -> np.ndarray:
    return np.arange(len(values)) / max(len(values) - 1, 1)


def _draw(ax, curves: Mapping[str, Sequence[float]], colours: dict, hlines=None):
    for name, values in curves.items():
        ax.plot(relative_depth(values), values, **_style(name, colours))
    for label, (value, colour) in (hlines or {}).items():
        ax.axhline(value, color=colour, linestyle=":", linewidth=1.2, label=label)
    ax.set_xlabel("relative depth (layer / num_layers; 0 = embeddings)")
    ax.grid(alpha=0.3)


def layer_curves(path, curves: Mapping[str, Sequence[float]], *, title: str, ylabel: str,
                 hlines: Mapping[str, tuple[float, str]] | None = None,
                 size=(8, 5)) -> None:
    """One panel: a line per model (values per layer, layer 0 first)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=size, dpi=DPI)
    _draw(ax, curves, {}, hlines)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def panels(path, panel_curves: Mapping[str, Mapping[str, Sequence[float]]], *, title: str,
           ylabel: str, size=(8, 5), sharey: bool = True,
           hlines: Mapping[str, tuple[float, str]] | None = None) -> None:
    """Several panels side by side (one per treatment), a line per model in each;
    ``hlines`` (label -> (value, colour)) drawn in every panel."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panel_curves), figsize=size, dpi=DPI, sharey=sharey,
                             squeeze=False)
    colours: dict = {}
    for ax, (panel, curves) in zip(axes[0], panel_curves.items(), strict=False):
        _draw(ax, curves, colours, hlines)
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel("relative depth", fontsize=9)
    axes[0][0].set_ylabel(ylabel)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), fontsize=8)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
