"""An audit of a written release: its bytes checked against what its manifest claims.

Each check reads only the release folder (public files) and recomputes what it can from the
released answers and public columns: every noisy value on its stated grid; rows in release order;
the mu of every answer, each state's composed total and the release's; the sd of psi-mechanism
answers (their sensitivity over mu) with their estimates and variances; tau and zeta; pnc's sd and
variances from the clip levels the released identity answers give; no seed in a publishable
manifest; no path anywhere in it. One state's files are the parts ``part-<state>.parquet``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.measure.budget import compose
from gedp.measure.grid import VALUE_GRID, rounded_noise_sd
from gedp.measure.mechanisms import pnc_released_sensitivity, pnc_tau, psi_sensitivity
from gedp.measure.neighbors import NeighborFunction, make_psi
from gedp.measure.queries import IDENTITY, Groupings
from gedp.release.format import MEASUREMENTS_FILE, PROTECTED_FILE, RELEASE_ORDER
from gedp.release.reader import check_one_quarter, parse_query_name, read_manifest
from gedp.synth.io import sorted_by

#: Relative tolerance of recomputed figures: they are computed by the same float operations.
RTOL = 1e-12
#: A string that names a file system location: a separator between names, a home or drive prefix.
PATH_PATTERN = re.compile(r"[\w.-]/[\w.-]|\\|^~|^[A-Za-z]:")


@dataclass(frozen=True)
class Check:
    """One check of a release: its name, whether it held, and what failed (or what was checked)."""

    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class StatePart:
    """One state's files of a release: its protected microdata and its noisy answers."""

    state: str
    protected: pd.DataFrame
    measurements: pd.DataFrame


def state_parts(folder: Path) -> list[StatePart]:
    """The release's per-state parts, in file order (a single file counts as one part)."""
    def files(name: str) -> list[Path]:
        path = folder / name
        return sorted(path.glob("part-*.parquet")) if path.is_dir() else [path]

    parts = []
    for protected, measured in zip(files(PROTECTED_FILE), files(MEASUREMENTS_FILE), strict=True):
        frame = pd.read_parquet(protected)
        parts.append(StatePart(str(frame["state"].iloc[0]), frame, pd.read_parquet(measured)))
    return parts


def answers_of(part: StatePart) -> Iterator[tuple[str, str, tuple[str, ...], pd.DataFrame]]:
    """Each answer of a part: query name, attribute, group-by columns and its rows."""
    for (query, attribute), rows in part.measurements.groupby(["query", "attribute"], sort=False):
        yield str(query), str(attribute), parse_query_name(str(query)), rows.reset_index(drop=True)


def _close(found: np.ndarray | float, expected: np.ndarray | float) -> bool:
    return bool(np.allclose(found, expected, rtol=RTOL, atol=0.0))


def check_grid(manifest: dict, parts: list[StatePart]) -> list[str]:
    """Every released value is a whole multiple of its answer's grid step, the manifest's."""
    failures = []
    for part in parts:
        for query, attribute, _, rows in answers_of(part):
            grid = manifest["grid"][query][attribute]
            off = ~np.isfinite(rows["released"]) | (np.mod(rows["released"], grid) != 0)
            if not (rows["grid"] == grid).all() or off.any():
                failures.append(f"{part.state} {query} on {attribute}: {int(off.sum())} value(s) off the grid "
                                f"{grid:g}")
    return failures


def check_order(manifest: dict, parts: list[StatePart]) -> list[str]:
    """Protected rows sorted by public keys; identity answers in the same order; group answers in
    the order of their sorted keys, one per group of the protected rows."""
    failures = []
    for part in parts:
        positions = part.protected.assign(_row=np.arange(len(part.protected)))
        if not (sorted_by(positions, RELEASE_ORDER)["_row"].to_numpy() == positions["_row"].to_numpy()).all():
            failures.append(f"{part.state} protected rows are not sorted by {', '.join(RELEASE_ORDER)}")
        groupings = Groupings(part.protected)
        for query, attribute, by, rows in answers_of(part):
            expected = groupings(by).keys.reset_index(drop=True) if by else None
            if expected is not None and not rows[list(by)].astype(str).equals(expected.astype(str)):
                failures.append(f"{part.state} {query} on {attribute}: rows not in the order of the groups' keys")
    return failures


def check_mu(manifest: dict, parts: list[StatePart]) -> list[str]:
    """Each answer's mu is the manifest's for its state; each state's total is those composed; the
    release's totals are the largest state's."""
    failures = []
    for part in parts:
        section = manifest["per_state"][part.state]
        charged = {}
        for query, attribute, _, rows in answers_of(part):
            charged[query, attribute] = float(rows["mu"].iloc[0])
            claimed = section["mu"].get(query, {}).get(attribute)
            if claimed is None or not _close(rows["mu"].to_numpy(), claimed):
                failures.append(f"{part.state} {query} on {attribute}: answers charge mu "
                                f"{charged[query, attribute]:g}, manifest says {claimed}")
            if not _close(manifest["mu"][query][attribute], max(
                    s["mu"][query][attribute] for s in manifest["per_state"].values())):
                failures.append(f"{query} on {attribute}: release mu is not the largest state's")
        if not _close(section["mu_total"], compose(charged.values())):
            failures.append(f"{part.state}: mu_total {section['mu_total']:g} is not the answers' composed "
                            f"{compose(charged.values()):g}")
    if not _close(manifest["mu_total"], max(s["mu_total"] for s in manifest["per_state"].values())):
        failures.append(f"mu_total {manifest['mu_total']:g} is not the largest state's")
    return failures


def check_psi_answers(manifest: dict, parts: list[StatePart]) -> list[str]:
    """psi-mechanism answers: sd = (gamma + grid + float error) / mu widened by the rounding, and
    the estimates and variances the release computed from the released values and that sd."""
    psi = make_psi(**manifest["psi"])
    failures = []
    for part in parts:
        groupings = Groupings(part.protected)
        for query, attribute, by, rows in answers_of(part):
            if rows["mechanism"].iloc[0] != "psi":
                continue
            grid, mu = float(rows["grid"].iloc[0]), float(rows["mu"].iloc[0])
            sd = float(rounded_noise_sd(psi_sensitivity(psi, manifest["gammas"][attribute], groupings(by)) / mu, grid))
            estimate = psi.unbiased_estimate(rows["released"].to_numpy(), sd)
            if not (_close(rows["sd"], sd) and _close(rows["estimate"], estimate)
                    and _close(rows["variance"], psi.releasable_variance(estimate, sd))):
                failures.append(f"{part.state} {query} on {attribute}: sd, estimates or variances are not those of mu "
                                f"{mu:g} (sd {sd:.6g}, recorded {float(rows['sd'].iloc[0]):.6g})")
    return failures


def check_tau_zeta(manifest: dict, parts: list[StatePart]) -> list[str]:
    """zeta per state = 1 - (1 - zeta)^(1 / states); tau = Phi^-1((1 - zeta_state)^(1 / bounds)),
    one bound per establishment and attribute (pnc releases)."""
    states = len(manifest["states"])
    failures = []
    zeta_state = -math.expm1(math.log1p(-manifest["zeta"]) / states)
    if not _close(manifest["zeta_per_state"], zeta_state):
        failures.append(f"zeta_per_state {manifest['zeta_per_state']:g} is not "
                        f"1 - (1 - {manifest['zeta']:g})^(1/{states})")
    if manifest["workflow"] != "pnc":
        return failures
    for part in parts:
        tau = pnc_tau(zeta_state, len(manifest["gammas"]) * len(part.protected))
        if not _close(manifest["tau"][part.state], tau):
            failures.append(f"{part.state}: tau {manifest['tau'][part.state]:g} is not {tau:g}")
    return failures


def check_pnc_answers(manifest: dict, parts: list[StatePart]) -> list[str]:
    """pnc answers: sd and variance recomputed from the clip levels u*_g = max over the group of
    psi^-1(omega_j + s_j tau + g_j), the released identity answers."""
    if manifest["workflow"] != "pnc":
        return []
    psi = make_psi(**manifest["psi"])
    failures = []
    for part in parts:
        groupings = Groupings(part.protected)
        upper = _upper_bounds(part, psi, float(manifest["tau"][part.state]))
        for query, attribute, by, rows in answers_of(part):
            if rows["mechanism"].iloc[0] != "pnc":
                continue
            clip = groupings(by).max(upper[attribute])
            sd = pnc_released_sensitivity(clip, psi, manifest["gammas"][attribute]) / float(rows["mu"].iloc[0])
            noise_sd = np.where(sd > 0, rounded_noise_sd(sd, VALUE_GRID), 0.0)
            if not (_close(rows["sd"], noise_sd) and _close(rows["variance"], noise_sd**2)):
                failures.append(f"{part.state} {query} on {attribute}: sd or variances are not those the released "
                                "identity answers give")
    return failures


def _upper_bounds(part: StatePart, psi: NeighborFunction, tau: float) -> dict[str, np.ndarray]:
    """Each attribute's upper bounds from its identity answers (rows in the protected order)."""
    bounds = {}
    for _, attribute, by, rows in answers_of(part):
        if by == IDENTITY:
            bounds[attribute] = psi.inverse(rows["released"].to_numpy() + rows["sd"].to_numpy() * tau
                                            + rows["grid"].to_numpy())
    return bounds


def _entries(value: object, key: str = "") -> Iterator[tuple[str, object]]:
    """Every (key, value) pair of a JSON document, nested ones included."""
    if isinstance(value, dict):
        for name, inner in value.items():
            yield str(name), inner
            yield from _entries(inner, str(name))
    elif isinstance(value, list):
        for inner in value:
            yield from _entries(inner, key)


def check_no_seed(manifest: dict, parts: list[StatePart]) -> list[str]:
    """A publishable manifest comes from the secure generator and holds no seed."""
    if not manifest.get("publishable"):
        return []
    failures = [f"publishable, but its generator is '{manifest['rng'].get('kind')}'"] \
        if manifest["rng"].get("kind") != "secure" else []
    return failures + [f"publishable, but holds a {key} ({value})" for key, value in _entries(manifest)
                       if "seed" in key.lower()]


def check_no_paths(manifest: dict, parts: list[StatePart]) -> list[str]:
    """No string of the manifest names a file system location."""
    return [f"'{key}' holds a path ({value})" for key, value in _entries(manifest)
            if isinstance(value, str) and PATH_PATTERN.search(value)]


CHECKS: dict[str, Callable[[dict, list[StatePart]], list[str]]] = {
    "grid": check_grid,
    "order": check_order,
    "mu": check_mu,
    "psi answers": check_psi_answers,
    "tau and zeta": check_tau_zeta,
    "pnc variances": check_pnc_answers,
    "no seed": check_no_seed,
    "no paths": check_no_paths,
}


def audit_release(folder: str | Path) -> list[Check]:
    """Every check of ``CHECKS`` on the release in ``folder`` (a release of one quarter)."""
    check_one_quarter(folder, "gedp audit")
    manifest = dict(read_manifest(folder))
    parts = state_parts(Path(folder))
    results = []
    for name, check in CHECKS.items():
        try:
            failures = check(manifest, parts)
        except (KeyError, IndexError, TypeError, ValueError) as err:  # a manifest or file missing what it must hold
            failures = [f"cannot be checked: {type(err).__name__} {err}"]
        results.append(Check(name, not failures, "; ".join(failures[:5]) + (" ..." if len(failures) > 5 else "")))
    return results
