"""Reports: markdown with embedded plots, and the machine-readable summary.json next to them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend chosen first: no display needed)
import numpy as np  # noqa: E402

from gedp.release.format import CONFIDENTIAL_PREFIX, REPORT_FILES, SUMMARY_FILE  # noqa: E402

#: The line under a report's title when it was computed from real confidential microdata.
CONFIDENTIAL_BANNER = ("> **CONFIDENTIAL: not for publication.** Computed from real confidential microdata: its "
                       "tables, plots and files show true values. Keep it where the microdata are kept.")


class Report:
    """A markdown report written section by section into an output folder, with its figures."""

    def __init__(self, out: Path, title: str):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.lines = [f"# {title}", ""]
        self.figures: list[str] = []

    def section(self, heading: str, *paragraphs: str) -> None:
        self.lines += [f"## {heading}", ""]
        for paragraph in paragraphs:
            self.lines += [paragraph, ""]

    def table(self, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        self.lines.append("| " + " | ".join(header) + " |")
        self.lines.append("|" + "---|" * len(header))
        for row in rows:
            self.lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
        self.lines.append("")

    def figure(self, figure: plt.Figure, name: str, caption: str) -> None:
        """Save a figure as PNG and embed it."""
        figure.savefig(self.out / name, dpi=110, bbox_inches="tight")
        plt.close(figure)
        self.figures.append(name)
        self.lines += [f"![{caption}]({name})", "", f"*{caption}*", ""]

    def write(self, summary: dict) -> None:
        summary["figures"] = self.figures
        write_summary(self.out, summary)
        (self.out / "report.md").write_text("\n".join(self.lines) + "\n")


def write_summary(out: Path, summary: dict) -> None:
    """A report's summary.json."""
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=_json_default) + "\n")


def mark_confidentiality(out: Path, confidential: bool) -> dict:
    """Say in every report under ``out`` (its folder and subfolders) whether it was computed from real
    confidential microdata: ``"confidential"`` in summary.json and, when true, a banner under
    report.md's title and ``CONFIDENTIAL-`` before the name of every other file (links and
    summary's figures follow). Returns the summary of ``out``'s own report."""
    for summary_path in sorted(Path(out).rglob(SUMMARY_FILE), key=lambda path: -len(path.parts)):  # out last
        folder = summary_path.parent
        summary = json.loads(summary_path.read_text())
        summary["confidential"] = confidential
        if confidential:
            _mark_files(folder, summary)
        write_summary(folder, summary)
    return summary


def _mark_files(folder: Path, summary: dict) -> None:
    """Prefix a report folder's files (not report.md, summary.json or subfolders) with CONFIDENTIAL-,
    and put the banner under report.md's title, with its links and code spans renamed."""
    renamed = {path.name: CONFIDENTIAL_PREFIX + path.name for path in folder.iterdir()
               if path.is_file() and path.name not in REPORT_FILES and not path.name.startswith(CONFIDENTIAL_PREFIX)}
    for name, marked in renamed.items():
        (folder / name).rename(folder / marked)
    summary["figures"] = [renamed.get(name, name) for name in summary.get("figures", [])]
    title, _, body = (folder / "report.md").read_text().partition("\n")
    for name, marked in renamed.items():
        body = body.replace(f"]({name})", f"]({marked})").replace(f"`{name}`", f"`{marked}`")
    (folder / "report.md").write_text(f"{title}\n\n{CONFIDENTIAL_BANNER}\n{body}")


def _cell(value: object) -> str:
    if isinstance(value, float) and value != value:
        return "n/a"
    if isinstance(value, float):
        if value == 0 or 1e-3 <= abs(value) < 1e6:
            return f"{value:,.4g}"
        return f"{value:.3e}"
    return str(value)


def _json_default(value: object):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def scatter_with_band(ax, true: np.ndarray, protected: np.ndarray, title: str, band: float = 0.03) -> float:
    """Protected against true on log scales, the +/-band around the diagonal, points outside in red.

    Returns the share of points outside the band.
    """
    true, protected = np.asarray(true, float), np.asarray(protected, float)
    outside = np.abs(protected - true) > band * true
    ax.scatter(true[~outside], np.maximum(protected[~outside], 0.5), s=6, color="tab:blue", label="within band")
    ax.scatter(true[outside], np.maximum(protected[outside], 0.5), s=6, color="tab:red", label="outside band")
    low, high = max(true.min(), 0.5), max(true.max(), 1.0)
    grid = np.geomspace(low, high, 50)
    ax.plot(grid, grid, color="black", lw=0.8)
    ax.fill_between(grid, grid * (1 - band), grid * (1 + band), color="grey", alpha=0.3, label=f"+/-{band:.0%}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("true")
    ax.set_ylabel("protected")
    ax.set_title(f"{title}: {outside.mean():.0%} outside")
    return float(outside.mean())
