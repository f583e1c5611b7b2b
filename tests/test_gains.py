"""Gross job gains and losses: the sums against a direct count, the bias formula and the margins'
variance against simulation, the deconvolution's correction on simulated noisy changes, and the
panel microdata and releases route."""

import numpy as np
import pandas as pd
import pytest

from gedp.postprocess.gains import (
    _positive_part_variance,
    establishment_changes,
    expected_positive_part,
    gains_losses,
    posterior_positive_parts,
)
from gedp.synth.panel import quarter_range, synthesize_panel

DRAWS = 400_000
#: 4 standard errors: a false failure about 6e-5 per comparison.
Z = 4.0


def test_expected_positive_part_matches_simulation_and_rejects_a_wrong_sd():
    rng = np.random.default_rng(5)
    for d in (-3.0, -1.0, 0.0, 0.5, 2.0, 9.0):
        for sd in (1.0, 3.0):
            draws = np.maximum(d + sd * rng.standard_normal(DRAWS), 0.0)
            error = draws.std() / np.sqrt(DRAWS)
            assert abs(expected_positive_part(d, sd) - draws.mean()) < Z * error, (d, sd)
            if abs(d) <= sd:  # power: a sd 30% off is rejected where the bias is large
                for wrong in (0.7, 1.3):
                    assert abs(expected_positive_part(d, wrong * sd) - draws.mean()) > Z * error, (d, sd, wrong)
    assert expected_positive_part(np.array([-2.0, 3.0]), np.zeros(2)).tolist() == [0.0, 3.0]


def test_the_variance_of_a_positive_part_matches_simulation():
    rng = np.random.default_rng(6)
    for d, sd in ((-2.0, 1.5), (0.0, 2.0), (3.0, 1.0)):
        draws = np.maximum(d + sd * rng.standard_normal(DRAWS), 0.0)
        # the variance of a sample variance: (m4 - s^4) / n
        error = np.sqrt((((draws - draws.mean()) ** 4).mean() - draws.var() ** 2) / DRAWS)
        assert abs(_positive_part_variance(np.array([d]), np.array([sd]))[0] - draws.var()) < Z * error, (d, sd)


def next_quarter(first: pd.DataFrame, seed: int) -> pd.DataFrame:
    """The quarter after ``first`` grown by the panel synthesizer (``gedp.synth.panel``)."""
    panel = synthesize_panel(first, quarter_range("2016Q1:2016Q2"), rng=np.random.default_rng(seed))
    return panel[panel["qtr"] == 2].reset_index(drop=True)


def _quarters(rng, n=400):
    ids = [f"E{i}" for i in range(n)]
    public = pd.DataFrame({"estab_id": ids, "state": "44", "county": rng.choice(["001", "003", "005"], n),
                           "sector": rng.choice(["23", "44-45", "62"], n)})
    before = public.assign(m3emp=rng.integers(0, 40, n).astype(float)).iloc[: int(0.9 * n)]
    after = public.assign(m3emp=rng.integers(0, 40, n).astype(float)).iloc[int(0.05 * n):]
    return before.reset_index(drop=True), after.reset_index(drop=True)


def test_gains_and_losses_match_a_count_establishment_by_establishment():
    before, after = _quarters(np.random.default_rng(1))
    table = gains_losses(before, after, "county,sector").set_index(["state", "county", "sector"])
    expected: dict = {}
    levels_before = dict(zip(before["estab_id"], before["m3emp"]))
    for _, row in pd.concat([after, before[~before["estab_id"].isin(after["estab_id"])]]).iterrows():
        change = (row["m3emp"] if row["estab_id"] in set(after["estab_id"]) else 0.0) - levels_before.get(
            row["estab_id"], 0.0)
        cell = expected.setdefault((row["state"], row["county"], row["sector"]), [0.0, 0.0, 0, 0])
        cell[0] += max(change, 0.0)
        cell[1] += max(-change, 0.0)
        cell[2] += row["estab_id"] not in levels_before
        cell[3] += row["estab_id"] not in set(after["estab_id"])
    assert len(table) == len(expected)
    for key, (gains, losses, openings, closings) in expected.items():
        got = table.loc[key]
        assert (got["gains"], got["losses"], got["net"]) == pytest.approx((gains, losses, gains - losses))
        assert (got["estabs_opening"], got["estabs_closing"]) == (openings, closings)
    total = gains_losses(before, after, "total")
    assert total["gains"].item() == pytest.approx(table["gains"].sum()) and len(total) == 1


def test_a_closing_keeps_its_public_columns_and_an_opening_counts_from_zero():
    before = pd.DataFrame({"estab_id": ["A", "B"], "county": ["001", "003"], "state": "44", "m3emp": [5.0, 7.0]})
    after = pd.DataFrame({"estab_id": ["A", "C"], "county": ["001", "005"], "state": "44", "m3emp": [4.0, 2.0]})
    changes = establishment_changes(before, after).set_index("estab_id")
    assert changes.loc["B", "county"] == "003" and changes.loc["B", "change"] == -7.0
    assert changes.loc["C", "status"] == "opening" and changes.loc["C", "change"] == 2.0
    assert changes.loc["A", "status"] == "continuing" and changes.loc["A", "change"] == -1.0


def _noisy_changes(rng, n):
    """Changes like an establishment panel's (most 0, a few large), noise sd growing with size."""
    size = rng.lognormal(1.5, 1.2, n)
    kind = rng.choice(3, n, p=[0.6, 0.2, 0.2])
    d = np.round(np.where(kind == 1, 1 + rng.exponential(0.15 * size), 0.0)
                 - np.where(kind == 2, 1 + rng.exponential(0.15 * size), 0.0))
    sd = 0.8 * np.sqrt(size + 1)
    return d, sd, d + sd * rng.standard_normal(n)


def test_the_deconvolution_removes_most_of_the_bias_of_gains_and_losses():
    """On a hard mix (40% of establishments moving, most by less than the noise), the raw sums are
    2.4 times the truth and the deconvolved ones 15-16% over it (the prior of small changes is hard to
    tell from no change through noise of their size): at least 85% of the bias removed."""
    n = 20_000
    raw_bias, corrected_bias = [], []
    for seed in range(2):
        d, sd, observed = _noisy_changes(np.random.default_rng(seed), n)
        for sign in (1, -1):
            truth = np.maximum(sign * d, 0.0).sum()
            raw_bias.append(np.maximum(sign * observed, 0.0).sum() / truth - 1)
            corrected_bias.append(posterior_positive_parts(sign * observed, sd).sum() / truth - 1)
    assert min(raw_bias) > 1.0
    assert all(abs(corrected) < 0.15 * raw for raw, corrected in zip(raw_bias, corrected_bias)), corrected_bias
    exact = np.array([3.0, -2.0, 0.0])
    assert posterior_positive_parts(exact, np.zeros(3)).tolist() == [3.0, 0.0, 0.0]


def test_corrected_gains_and_margins_come_with_the_noise_sd():
    before, after = _quarters(np.random.default_rng(2))
    sd = pd.Series(2.0, index=pd.concat([before, after])["estab_id"].unique())
    table = gains_losses(before, after, "county,sector", sd=sd)
    assert {"gains_corrected", "losses_corrected", "gains_moe", "losses_moe", "net_moe"} <= set(table.columns)
    changes = establishment_changes(before, after)
    assert (table["net_moe"] ** 2).sum() == pytest.approx((1.959964 * 2.0) ** 2 * len(changes), rel=1e-5)


def test_tabulate_gains_losses_of_a_panel_file_matches_the_library(small_state, tmp_path):
    from typer.testing import CliRunner

    from gedp.cli import app

    later = next_quarter(small_state, 4)
    panel = tmp_path / "panel.parquet"
    pd.concat([small_state, later], ignore_index=True).to_parquet(panel)
    out = tmp_path / "gains.csv"
    run = CliRunner().invoke(app, ["tabulate", str(panel), "--by", "county,sector", "--gains-losses",
                                   "2016Q1:2016Q2", "--out", str(out)])
    assert run.exit_code == 0, run.output
    assert "biased upward" in run.output
    table = pd.read_csv(out, dtype={"state": str, "county": str, "sector": str})
    expected = gains_losses(small_state, later, "county,sector")
    assert table["gains"].to_numpy() == pytest.approx(expected["gains"].to_numpy())
    assert table["losses"].sum() == pytest.approx(expected["losses"].sum())
    refused = CliRunner().invoke(app, ["tabulate", str(panel), "--gains-losses", "2016Q1:2016Q3"])
    assert refused.exit_code == 2 and "no rows of quarter 2016Q3" in refused.output
    refused = CliRunner().invoke(app, ["tabulate", str(panel), "--gains-losses", "2016Q1"])
    assert refused.exit_code == 2 and "must be two quarters FROM:TO" in refused.output


def test_gains_between_two_releases_are_corrected_with_the_releases_own_noise(small_state, tmp_path):
    import gedp
    from gedp.tabulation.panel_gains import between_releases

    later = next_quarter(small_state, 5)
    folders = []
    for i, frame in enumerate((small_state, later)):
        folders.append(tmp_path / f"q{i}")
        gedp.protect(frame, "employment", seed=i, not_for_publication=True).write(folders[-1])
    table = between_releases(folders[0], folders[1], "total")
    truth = gains_losses(small_state, later, "total")
    raw_error = abs(table["gains"].item() - truth["gains"].item())
    corrected_error = abs(table["gains_corrected"].item() - truth["gains"].item())
    assert table["gains"].item() > truth["gains"].item() and corrected_error < raw_error / 3
    assert abs(table["net"].item() - truth["net"].item()) <= table["net_moe"].item() * 1.5
