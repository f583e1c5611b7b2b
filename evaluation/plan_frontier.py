"""The planner's frontier plot: employment error against wage error as the wage share moves."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

#: Wage shares labelled on each curve.
LABELLED = (0.04, 0.1, 0.2, 0.3, 0.5)


def draw_frontier(frontier: dict[str, list[tuple[float, float, float]]], chosen: tuple[str, float], level: int,
                  path: Path) -> None:
    """One curve per shape (label -> (wage share, employment error, wage error)), the chosen plan
    (shape label, wage share) marked; errors are predicted median relative errors at ``level``."""
    figure, ax = plt.subplots(figsize=(7.5, 5))
    for label, points in frontier.items():
        shares, employment, wage = zip(*points)
        ax.plot([100 * e for e in employment], [100 * w for w in wage], "o-", ms=3, label=label)
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
    ax.set_title("Plans as the wage share of mu^2 moves (labels: wage share)", fontsize=10)
    ax.legend(fontsize=6, loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
