"""The planner's frontier plot: employment error against wage error as the wage share moves."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter

#: Wage shares labelled on each curve.
LABELLED = (0.04, 0.1, 0.2, 0.3, 0.5)
#: Characters per line of a curve's label in the legend (a shape's description runs to 150).
LEGEND_WIDTH = 95


def draw_frontier(frontier: dict[str, list[tuple[float, float, float]]], chosen: tuple[str, float], level: int,
                  path: Path) -> None:
    """Write ``frontier_figure`` to ``path`` (PNG)."""
    figure = frontier_figure(frontier, chosen, level)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def frontier_figure(frontier: dict[str, list[tuple[float, float, float]]], chosen: tuple[str, float],
                    level: int) -> Figure:
    """One curve per shape (label -> (wage share, employment error, wage error)), the chosen plan
    (shape label, wage share) marked; errors are predicted median relative errors at ``level``."""
    figure, ax = plt.subplots(figsize=(7.5, 6), layout="constrained")
    for label, points in frontier.items():
        shares, employment, wage = zip(*points)
        ax.plot([100 * e for e in employment], [100 * w for w in wage], "o-", ms=3,
                label=textwrap.fill(label, LEGEND_WIDTH))
        for share, e, w in points:
            if any(abs(share - s) < 1e-9 for s in LABELLED):
                ax.annotate(f"{share:.0%}", (100 * e, 100 * w), fontsize=7, textcoords="offset points",
                            xytext=(3, 3))
        if label == chosen[0]:
            e, w = next((e, w) for s, e, w in points if abs(s - chosen[1]) < 1e-9)
            ax.plot([100 * e], [100 * w], "k*", ms=14, label="chosen plan")
    ax.set_xlabel(f"employment (month 1): predicted median relative error, level {level} (%)")
    ax.set_ylabel(f"wages: predicted median relative error, level {level} (%)")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    ax.set_title("Plans as the wage share of mu^2 moves (labels: wage share)", fontsize=10)
    # below the plot, inside the figure: the long labels of the shapes neither cover the curves nor
    # run off the image (the constrained layout makes room for them)
    figure.legend(fontsize=6, loc="outside lower center", frameon=False)
    return figure
