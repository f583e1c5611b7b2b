"""What a newcomer tripped on: `gedp synth --quarters` counts rows, not establishments; progress
without a known total shows no "None"; the planner's frontier plot keeps its legend inside the image
and off the curves; `gedp evaluate accuracy` evaluates the shipped plan by default and counts the
plots of a comparison."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from rich.progress import Progress
from typer.testing import CliRunner

from gedp.cli import StepsColumn, app

runner = CliRunner()


def test_synth_of_quarters_counts_rows_establishments_and_quarters(tmp_path):
    out = tmp_path / "panel.parquet"
    result = runner.invoke(app, ["synth", "--profile", "small", "--establishments", "300", "--quarters",
                                 "2016Q1:2016Q3", "--out", str(out), "--seed", "3"])
    assert result.exit_code == 0, result.output
    panel = pd.read_parquet(out)
    line = " ".join(result.output.split())
    expected = f"Wrote {len(panel):,} rows ({panel['estab_id'].nunique():,} establishments in 3 quarters)"
    assert expected in line, line
    assert len(panel) > panel["estab_id"].nunique()  # the rows are not the establishments


@pytest.mark.parametrize("total, done, shown", [(None, 0, "0"), (None, 3, "3"), (12, 3, "3/12"),
                                                (1_500, 1_200, "1,200/1,500")])
def test_progress_shows_the_steps_and_the_total_only_when_known(total, done, shown):
    progress = Progress(StepsColumn(), disable=True)
    task = progress.add_task("measuring", total=total, completed=done)
    assert str(StepsColumn().render(progress.tasks[task])) == shown
    assert "None" not in shown


def test_the_frontier_plots_legend_lies_in_the_image_below_the_curves():
    from gedp.evaluation.plan_frontier import frontier_figure

    shares = np.round(np.arange(0.02, 0.52, 0.02), 2)
    long = ("employment: identity + NAICS-5 + county + county x NAICS-5 (60% identity, 5% county); wages: "
            "identity + {} county x NAICS-5 (65% identity)")
    frontier = {long.format(""): [(s, 0.05 + 0.05 * s, 0.02 / s**0.5) for s in shares],
                long.format("NAICS-5 + "): [(s, 0.051 + 0.05 * s, 0.021 / s**0.5) for s in shares]}
    figure = frontier_figure(frontier, (long.format(""), 0.16), 78)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    [legend] = figure.legends
    box, page = legend.get_window_extent(renderer), figure.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    [ax] = figure.axes
    assert box.y1 <= ax.get_tightbbox(renderer).y0 + 1  # below the axes and their labels: no curve hidden
    assert len(legend.get_texts()) == 3  # both shapes and the chosen plan


def test_evaluate_accuracy_evaluates_the_shipped_plan_and_counts_a_comparisons_plots(tmp_path):
    import json

    out = tmp_path / "accuracy"
    result = runner.invoke(app, ["evaluate", "accuracy", "--replications", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = (out / "report.md").read_text()
    assert "config 'recommended'" in report
    plots = len(json.loads((out / "summary.json").read_text())["figures"])
    assert plots > 0 and f"{plots} plots)" in " ".join(result.output.split())
    beside = tmp_path / "beside"
    for _ in range(2):  # written again over itself: its plan/ and baseline/ reports are gedp's
        result = runner.invoke(app, ["evaluate", "accuracy", "--replications", "1", "--config", "employment",
                                     "--out", str(beside)])
        assert result.exit_code == 0, result.output
        counted = len(list(beside.rglob("*.png")))
        assert counted > 0 and re.search(rf"{counted} plots in baseline/, plan/\)", " ".join(result.output.split()))
