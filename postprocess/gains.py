"""Gross job gains and losses between two quarters (BLS Business Employment Dynamics style).

Each establishment's change is its employment in the later quarter minus the earlier (month 3 of
each, as BED measures it; an establishment absent from one quarter counts 0 there: an opening or a
closing). By group (e.g. county x sector, the later quarter's public columns, the earlier's for a
closing): **gains** sum the positive changes (expansions and openings), **losses** the negative
ones (contractions and closings, as positive numbers), **net** = gains - losses.

From protected microdata these sums are biased upward: an establishment's protected change is
d + e with noise e of sd s, and E max(d + e, 0) = d Phi(d/s) + s phi(d/s) > max(d, 0), by
s phi(0) = 0.399 s at d = 0. Net is unbiased (a sum of differences). Given each establishment's
noise sd (``sd``), :func:`gains_losses` also gives corrected gains and losses by empirical-Bayes
deconvolution (:func:`posterior_positive_parts`) and margins of error.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy.stats import norm

from gedp.postprocess.tabulate import group_keys
from gedp.synth.panel import parse_quarter

#: BED measures employment change from the third month of one quarter to the third of the next.
EMPLOYMENT = "m3emp"
#: Support of the deconvolved prior of the standardized changes d / s, and EM iterations.
PRIOR_GRID = np.concatenate([-np.geomspace(40, 0.05, 40), [0.0], np.geomspace(0.05, 40, 40)])
EM_ITERATIONS = 300
#: Establishments are deconvolved in groups of similar noise sd (quantile bins), so that the prior
#: of d / s may differ with the establishment's size.
SD_BINS = 10


def establishment_changes(before: pd.DataFrame, after: pd.DataFrame, attribute: str = EMPLOYMENT) -> pd.DataFrame:
    """One row per establishment of either quarter: its public columns (the later quarter's, the
    earlier's for a closing), ``before``, ``after`` (0 where absent), ``change`` and ``status``
    (continuing, opening or closing)."""
    public = [c for c in after.columns if c not in (attribute, "year", "qtr") and c in before.columns]
    merged = after[public + [attribute]].merge(before[["estab_id", attribute]], on="estab_id", how="outer",
                                               suffixes=("_after", "_before"), indicator=True)
    closed = merged["_merge"] == "right_only"
    if closed.any():
        columns = [c for c in public if c != "estab_id"]
        earlier = before.set_index("estab_id").loc[merged.loc[closed, "estab_id"], columns]
        merged.loc[closed, columns] = earlier.to_numpy()
    changes = merged[public].copy()
    changes["before"] = merged[f"{attribute}_before"].fillna(0.0).to_numpy()
    changes["after"] = merged[f"{attribute}_after"].fillna(0.0).to_numpy()
    changes["change"] = changes["after"] - changes["before"]
    changes["status"] = np.select([merged["_merge"] == "left_only", closed], ["opening", "closing"], "continuing")
    return changes


def expected_positive_part(d: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """E max(d + e, 0) for e ~ N(0, sd^2): d Phi(d/sd) + sd phi(d/sd) (max(d, 0) where sd = 0)."""
    d, sd = np.asarray(d, float), np.asarray(sd, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = d / sd
        value = d * norm.cdf(t) + sd * norm.pdf(t)
    return np.where(sd > 0, value, np.maximum(d, 0.0))


def posterior_positive_parts(observed: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Empirical-Bayes estimates of max(d, 0) from observations d + e, e ~ N(0, sd^2) with known sd.

    Within bins of similar sd, the prior of t = d / sd is estimated by nonparametric maximum
    likelihood on a fixed grid (EM, as Kiefer and Wolfowitz's estimator; Koenker and Mizera 2014),
    from z = observed / sd = t + N(0, 1); each estimate is sd E[max(t, 0) | z]. Summed over many
    establishments, the estimates are unbiased for the sum of max(d, 0) when the prior is well
    estimated (E E[g(t) | z] = E g(t)); where sd = 0 the observation is returned as is.
    """
    observed, sd = np.asarray(observed, float), np.asarray(sd, float)
    estimate = np.maximum(observed, 0.0)
    noisy = np.flatnonzero(sd > 0)
    if len(noisy) == 0:
        return estimate
    bins = np.array_split(noisy[np.argsort(sd[noisy], kind="stable")], min(SD_BINS, len(noisy)))
    for members in bins:
        z = observed[members] / sd[members]
        likelihood = norm.pdf(z[:, None] - PRIOR_GRID[None, :])
        weights = np.full(len(PRIOR_GRID), 1.0 / len(PRIOR_GRID))
        for _ in range(EM_ITERATIONS):
            posterior = likelihood * weights
            posterior /= np.maximum(posterior.sum(axis=1, keepdims=True), np.finfo(float).tiny)
            weights = posterior.mean(axis=0)
        estimate[members] = sd[members] * (posterior @ np.maximum(PRIOR_GRID, 0.0))
    return estimate


def gains_losses(before: pd.DataFrame, after: pd.DataFrame, by: str | Sequence[str], *,
                 attribute: str = EMPLOYMENT, sd: pd.Series | None = None, level: float = 0.95) -> pd.DataFrame:
    """Gross gains, losses and net change of ``attribute`` from ``before`` to ``after`` by public
    columns ``by`` (module docstring), with the openings' and closings' parts and the numbers of
    expanding, contracting, opening and closing establishments.

    ``sd``: each establishment's noise sd of its change (by estab_id; e.g. sqrt of the sum of the two
    quarters' variances): adds ``gains_corrected`` and ``losses_corrected`` (deconvolved, see
    :func:`posterior_positive_parts`) and margins of error at ``level`` (``*_moe``) of the raw and
    net sums, from the noise of each establishment's change taken as independent.
    """
    changes = establishment_changes(before, after, attribute)
    keys = group_keys(changes, by)
    d = changes["change"].to_numpy()
    status = changes["status"].to_numpy()
    parts = pd.DataFrame({
        "gains": np.maximum(d, 0.0), "losses": np.maximum(-d, 0.0), "net": d,
        "openings": np.where(status == "opening", d, 0.0), "closings": np.where(status == "closing", -d, 0.0),
        "estabs_expanding": (d > 0) & (status == "continuing"),
        "estabs_contracting": (d < 0) & (status == "continuing"),
        "estabs_opening": status == "opening", "estabs_closing": status == "closing"})
    if sd is not None:
        s = changes["estab_id"].map(sd).fillna(0.0).to_numpy(float)
        parts["gains_corrected"] = posterior_positive_parts(d, s)
        parts["losses_corrected"] = posterior_positive_parts(-d, s)
        parts["var_gains"], parts["var_losses"] = _positive_part_variance(d, s), _positive_part_variance(-d, s)
        parts["var_net"] = s * s
    table = parts.groupby([changes[k] for k in keys], sort=True, dropna=False).sum().reset_index() if keys else \
        parts.sum().to_frame().T
    if sd is not None:
        z = norm.ppf(0.5 + level / 2)
        for name in ("gains", "losses", "net"):
            table[f"{name}_moe"] = z * np.sqrt(table.pop(f"var_{name}").astype(float))
    counts = [c for c in table.columns if c.startswith("estabs_")]
    table[counts] = table[counts].astype("int64")
    return table


def _positive_part_variance(observed: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Var max(X, 0) for X ~ N(d, sd^2), evaluated at d = the observation (a plug-in)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t = observed / sd
        second = (observed**2 + sd**2) * norm.cdf(t) + observed * sd * norm.pdf(t)
        variance = second - expected_positive_part(observed, sd) ** 2
    return np.where(sd > 0, np.maximum(variance, 0.0), 0.0)


def quarter_rows(microdata: pd.DataFrame, label: str) -> pd.DataFrame:
    """The rows of one quarter (``YYYYQn``) of microdata with ``year`` and ``qtr`` columns."""
    year, qtr = parse_quarter(label)
    if not {"year", "qtr"} <= set(microdata.columns):
        raise ValueError("gains and losses need the microdata's year and qtr columns (two quarters of one panel)")
    rows = microdata[(microdata["year"] == year) & (microdata["qtr"] == qtr)]
    if len(rows) == 0:
        raise ValueError(f"the microdata have no rows of quarter {label.strip()}")
    return rows


def panel_gains_losses(microdata: pd.DataFrame, quarters: str, by: str | Sequence[str], *,
                       attribute: str = EMPLOYMENT) -> pd.DataFrame:
    """Raw gains and losses between the two quarters ``FROM:TO`` (e.g. ``2016Q1:2016Q2``) of panel
    microdata (rows keyed by estab_id, year and qtr)."""
    parts = quarters.split(":")
    if len(parts) != 2:
        raise ValueError(f"--gains-losses '{quarters}' must be two quarters FROM:TO, e.g. 2016Q1:2016Q2")
    return gains_losses(quarter_rows(microdata, parts[0]), quarter_rows(microdata, parts[1]), by, attribute=attribute)
