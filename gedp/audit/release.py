"""An audit of a written release: its bytes checked against what its manifest claims.

Each check reads only the release folder (public files) and recomputes what it can from the
released answers and public columns: every file is one the manifest accounts for; every count
(establishments per state and quarter, one identity answer per protected row, the same ids) is the
manifest's; the protected values are, bit for bit, the postprocessing of the noisy answers and
public columns (``check_refit``), and the QCEW tables those of the protected values, byte for byte
(``check_tables``); every noisy value on its stated grid; rows in release order; the mu of every
answer, each state's composed total and the release's; the sd of psi-mechanism answers (their
sensitivity over mu) with their estimates and variances; tau and zeta; pnc's sd and variances from
the clip levels the released identity answers give; no seed in a publishable manifest; no path
anywhere in it. One state's files are the parts ``part-<state>.parquet``; a panel release's
``part-<quarter>-<state>.parquet``, each quarter audited against its own manifest (``per_quarter``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.errors import InputError
from gedp.measure.budget import compose
from gedp.measure.grid import VALUE_GRID, rounded_noise_sd
from gedp.measure.mechanisms import pnc_released_sensitivity, pnc_tau, psi_sensitivity
from gedp.measure.neighbors import NeighborFunction, make_psi
from gedp.measure.queries import IDENTITY, Groupings
from gedp.postprocess.tabulate import qcew_tables
from gedp.release import resolved
from gedp.release.format import (
    ACCURACY_FILE,
    JOBS_FILE,
    MANIFEST_FILE,
    MEASUREMENTS_FILE,
    PROTECTED_FILE,
    QUARTER_KEY,
    RELEASE_ORDER,
    TABLES_FILE,
)
from gedp.release.part_sizes import check_decoded, check_footer, expected_rows, read_parts
from gedp.release.reader import (
    check_adds_up,
    parse_query_name,
    read_manifest,
    read_protected,
    read_stored,
)
from gedp.release.spending import spending_failures
from gedp.release.validation import listed_parts
from gedp.synth.io import sorted_by
from gedp.synth.schema import public_columns

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
    """One state's files of a release (of one quarter of a panel): its protected microdata and its
    noisy answers, the quarter key dropped once checked (``keyed``: rows of another quarter)."""

    state: str
    protected: pd.DataFrame
    measurements: pd.DataFrame
    quarter: str | None = None
    keyed: int = 0

    @property
    def label(self) -> str:
        return self.state if self.quarter is None else f"{self.quarter} {self.state}"


def state_parts(folder: Path, manifest: dict, quarter: str | None = None,
                read: tuple[list[tuple[str, list[Path]]], Mapping[str, pd.DataFrame]] | None = None) -> list[StatePart]:
    """The parts of the states the manifest lists (of one ``quarter`` of a panel), in name order;
    a part missing from the folder is left out (``check_files`` names it). ``read``: the states'
    files and their protected parts read already (``protected_parts``), not read again."""
    files, protected = read if read is not None else (state_files(folder, manifest, quarter), {})
    parts = []
    for state, paths in files:
        frames = [protected[state] if output == PROTECTED_FILE and state in protected else read_parts([str(path)])
                  for output, path in zip((PROTECTED_FILE, MEASUREMENTS_FILE), paths)]
        keyed = sum(int((frame[QUARTER_KEY] != quarter).sum()) for frame in frames) if quarter else 0
        protected_rows, measured = (frame.drop(columns=QUARTER_KEY) if quarter else frame for frame in frames)
        parts.append(StatePart(state, protected_rows, measured, quarter, keyed))
    return parts


def state_files(folder: Path, manifest: dict, quarter: str | None = None) -> list[tuple[str, list[Path]]]:
    """Each state's protected and measurement parts (of one ``quarter`` of a panel), in name order, where
    both are regular files whose sizes hold (``_sizes_hold``)."""
    section = manifest if quarter is None else manifest["per_quarter"][quarter]
    found = []
    for state in sorted(section["states"]):
        name = f"part-{state if quarter is None else f'{quarter}-{state}'}.parquet"
        files = [folder / output / name for output in (PROTECTED_FILE, MEASUREMENTS_FILE)]
        if all(file.is_file() and not file.is_symlink() for file in files) and _sizes_hold(folder, manifest, files):
            found.append((state, files))
    return found


def protected_parts(folder: Path, manifest: dict) -> tuple[list[tuple[str, list[Path]]], dict[str, pd.DataFrame]]:
    """The states' files (``state_files``) and each state's protected part read, once for the audit:
    before the measurements, so that a job frame is checked against them (``check_files``) while no
    measurements are held."""
    files = state_files(folder, manifest)
    return files, {state: read_parts([str(paths[0])]) for state, paths in files}


def _sizes_hold(folder: Path, manifest: dict, files: list[Path]) -> bool:
    """Whether each part's footer and texts state sizes its file can hold (``part_sizes``; a part that
    does not is left unread: ``check_files`` names it)."""
    try:
        for file in files:
            check_footer(folder, file.parent.name, file, expected_rows(manifest, file.parent.name, file.name))
            check_decoded(folder, file.parent.name, [str(file)])
    except InputError:
        return False
    return True


def answers_of(part: StatePart) -> Iterator[tuple[str, str, tuple[str, ...], pd.DataFrame]]:
    """Each answer of a part: query name, attribute, group-by columns and its rows."""
    for (query, attribute), rows in part.measurements.groupby(["query", "attribute"], sort=False):
        yield str(query), str(attribute), parse_query_name(str(query)), rows.reset_index(drop=True)


def family(attribute: str) -> str:
    """The manifest's name of an answer's attribute: a job family's for one of its categories
    ("worker[1,E1]" -> "worker"), else the attribute's."""
    return attribute.split("[", 1)[0]


def _close(found: np.ndarray | float, expected: np.ndarray | float) -> bool:
    return bool(np.allclose(found, expected, rtol=RTOL, atol=0.0))


def check_counts(manifest: dict, parts: list[StatePart]) -> list[str]:
    """Each state's protected rows: as many as the manifest states, of that state, each id once, and
    one identity answer per row and attribute, of the same ids in the same order; the states' rows
    add up to the manifest's establishments."""
    failures = [f"{part.label}: {part.keyed:,} {'row' if part.keyed == 1 else 'rows'} keyed to another quarter"
                for part in parts if part.keyed]
    for part in parts:
        stated = manifest["per_state"][part.state]["establishments"]
        if len(part.protected) != stated:
            failures.append(f"{part.label}: {len(part.protected):,} protected rows, the manifest states {stated:,}")
        if not (part.protected["state"].astype(str) == part.state).all():
            failures.append(f"{part.label}: protected rows of another state")
        ids = part.protected["estab_id"].astype(str).reset_index(drop=True)
        if ids.duplicated().any():
            failures.append(f"{part.label}: an estab_id is listed twice")
        for query, attribute, by, rows in answers_of(part):
            if by == IDENTITY and not rows["estab_id"].astype(str).equals(ids):
                failures.append(f"{part.label} {query} on {attribute}: the answers' ids are not the protected rows'")
    if sum(len(part.protected) for part in parts) != manifest["establishments"]:
        failures.append(f"{sum(len(part.protected) for part in parts):,} protected rows, the manifest states "
                        f"{manifest['establishments']:,} establishments")
    return failures


def refit(manifest: dict, part: StatePart) -> pd.DataFrame:
    """A part's protected microdata recomputed as the release computed them (``resolved.refit``)."""
    return resolved.refit(manifest, part.protected, part.measurements, part.label)


def check_refit(manifest: dict, parts: list[StatePart]) -> list[str]:
    """Every protected value is the one the release's postprocessing gives from its noisy answers
    and public columns (``refit``), bit for bit: the protected microdata are a function of the
    answers, so a value edited, replaced (by a true one) or of another release differs."""
    failures = []
    for part in parts:
        try:
            solved = refit(manifest, part)
        except Exception as err:  # noqa: BLE001 (untrusted files: whatever stops the solve fails the check)
            failures.append(f"{part.label}: the answers cannot be postprocessed again ({type(err).__name__})")
            continue
        for attribute in solved.columns.drop(public_columns(part.protected)):
            if attribute not in part.protected:
                failures.append(f"{part.label} {attribute}: missing from the protected microdata")
                continue
            found = part.protected[attribute].to_numpy(dtype=np.float64)
            differ = int((found != solved[attribute].to_numpy(dtype=np.float64)).sum())
            if differ:
                failures.append(f"{part.label} {attribute}: {differ:,} of {len(found):,} value(s) are not the "
                                "postprocessing of the release's answers")
    return failures


def tables_text(parts: list[StatePart]) -> str:
    """The QCEW tables CSV the release writer writes of these parts (states, quarters in order): each
    part's ``qcew_tables`` of its protected microdata, one header."""
    texts = []
    for part in parts:
        public = part.protected[public_columns(part.protected)]
        lines = qcew_tables(part.protected, Groupings(public)).to_csv(index=False).splitlines(keepends=True)
        texts += lines if not texts else lines[1:]
    return "".join(texts)


def check_tables(folder: Path, parts: list[StatePart]) -> list[str]:
    """``qcew_tables.csv`` holds, byte for byte, the tables of the release's protected microdata."""
    file = folder / TABLES_FILE
    if not file.is_file() or file.is_symlink():
        return []  # check_files names it
    try:
        expected = tables_text(parts).encode()
    except Exception as err:  # noqa: BLE001 (untrusted files: whatever stops the tables fails the check)
        return [f"{TABLES_FILE}: the protected microdata cannot be tabulated ({type(err).__name__})"]
    found = file.read_bytes()
    if found == expected:
        return []
    lines = [found.splitlines(), expected.splitlines()]
    differ = sum(a != b for a, b in zip(*lines)) + abs(len(lines[0]) - len(lines[1]))
    return [f"{TABLES_FILE}: {differ:,} line(s) are not the tables of the protected microdata"]


def check_grid(manifest: dict, parts: list[StatePart]) -> list[str]:
    """Every released value is a whole multiple of its answer's grid step, the manifest's."""
    failures = []
    for part in parts:
        for query, attribute, _, rows in answers_of(part):
            grid = manifest["grid"][query][family(attribute)]
            off = ~np.isfinite(rows["released"]) | (np.mod(rows["released"], grid) != 0)
            if not (rows["grid"] == grid).all() or off.any():
                failures.append(f"{part.label} {query} on {attribute}: {int(off.sum())} value(s) off the grid "
                                f"{grid:g}")
    return failures


def check_order(manifest: dict, parts: list[StatePart]) -> list[str]:
    """Protected rows sorted by public keys; identity answers in the same order; group answers in
    the order of their sorted keys, one per group of the protected rows."""
    failures = []
    for part in parts:
        positions = part.protected.assign(_row=np.arange(len(part.protected)))
        if not (sorted_by(positions, RELEASE_ORDER)["_row"].to_numpy() == positions["_row"].to_numpy()).all():
            failures.append(f"{part.label} protected rows are not sorted by {', '.join(RELEASE_ORDER)}")
        groupings = Groupings(part.protected)
        for query, attribute, by, rows in answers_of(part):
            expected = groupings(by).keys.reset_index(drop=True) if by else None
            if expected is not None and not rows[list(by)].astype(str).equals(expected.astype(str)):
                failures.append(f"{part.label} {query} on {attribute}: rows not in the order of the groups' keys")
    return failures


def check_mu(manifest: dict, parts: list[StatePart]) -> list[str]:
    """Each answer's mu is the manifest's for its state (a job family's: its categories' composed);
    each state's total is those composed; the release's totals are the largest state's, as every reader
    checks them against the ledgers (``spending.spending_failures``)."""
    failures = []
    for part in parts:
        section = manifest["per_state"][part.state]
        charged: dict[tuple[str, str], list[float]] = {}
        for query, attribute, _, rows in answers_of(part):
            if not _close(rows["mu"].to_numpy(), float(rows["mu"].iloc[0])):
                failures.append(f"{part.label} {query} on {attribute}: answers charge different mu")
            charged.setdefault((query, family(attribute)), []).append(float(rows["mu"].iloc[0]))
        for (query, name), mus in charged.items():
            spent = mus[0] if len(mus) == 1 else compose(mus)
            claimed = section["mu"].get(query, {}).get(name)
            if claimed is None or not _close(spent, claimed):
                failures.append(f"{part.label} {query} on {name}: answers charge mu {spent:g}, manifest says {claimed}")
            if not _close(manifest["mu"][query][name], max(
                    s["mu"][query][name] for s in manifest["per_state"].values())):
                failures.append(f"{query} on {name}: release mu is not the largest state's")
        every = [mu for mus in charged.values() for mu in mus]
        if not _close(section["mu_total"], compose(every)):
            failures.append(f"{part.label}: mu_total {section['mu_total']:g} is not the answers' composed "
                            f"{compose(every):g}")
    return failures + spending_failures("", manifest)  # the stated totals: the check every reader makes


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
            sensitivity = psi_sensitivity(psi, manifest["gammas"][family(attribute)], groupings(by))
            sd = float(rounded_noise_sd(sensitivity / mu, grid))
            estimate = psi.unbiased_estimate(rows["released"].to_numpy(), sd)
            if not (_close(rows["sd"], sd) and _close(rows["estimate"], estimate)
                    and _close(rows["variance"], psi.releasable_variance(estimate, sd))):
                failures.append(f"{part.label} {query} on {attribute}: sd, estimates or variances are not those of mu "
                                f"{mu:g} (sd {sd:.6g}, recorded {float(rows['sd'].iloc[0]):.6g})")
    return failures


def check_tau_zeta(manifest: dict, parts: list[StatePart]) -> list[str]:
    """zeta per state = 1 - (1 - zeta)^(1 / states); tau = Phi^-1((1 - zeta_state)^(1 / bounds)),
    one bound per establishment and attribute (pnc releases); each state's section states them alike."""
    states = len(manifest["states"])
    failures = []
    zeta_state = -math.expm1(math.log1p(-manifest["zeta"]) / states)
    if not _close(manifest["zeta_per_state"], zeta_state):
        failures.append(f"zeta_per_state {manifest['zeta_per_state']:g} is not "
                        f"1 - (1 - {manifest['zeta']:g})^(1/{states})")
    failures += [f"{state}: per_state tau or zeta is not the release's tau.{state} or zeta_per_state"
                 for state, section in manifest["per_state"].items()
                 if (section.get("tau"), section.get("zeta")) != (manifest["tau"][state], manifest["zeta_per_state"])]
    if manifest["workflow"] != "pnc":
        return failures
    for part in parts:
        measured = part.measurements.loc[part.measurements["query"] == "identity", "attribute"].nunique()
        tau = pnc_tau(zeta_state, measured * len(part.protected))
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
            sd = pnc_released_sensitivity(clip, psi, manifest["gammas"][family(attribute)]) / float(rows["mu"].iloc[0])
            noise_sd = np.where(sd > 0, rounded_noise_sd(sd, VALUE_GRID), 0.0)
            if not (_close(rows["sd"], noise_sd) and _close(rows["variance"], noise_sd**2)):
                failures.append(f"{part.label} {query} on {attribute}: sd or variances are not those the released "
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
    """A publishable manifest comes from the secure generator and holds no seed. A panel's manifest
    states no generator of its own: each of its quarters states its own (audited as a quarter), and
    is publishable as the panel is (``validation.checked_manifest``)."""
    if not manifest.get("publishable"):
        return []
    kind = manifest["rng"].get("kind") if "quarters" not in manifest else "secure"
    failures = [f"publishable, but its generator is '{kind}'"] if kind != "secure" else []
    return failures + [f"publishable, but holds a {key} ({value})" for key, value in _entries(manifest)
                       if "seed" in key.lower()]


def check_no_paths(manifest: dict, parts: list[StatePart]) -> list[str]:
    """No string of the manifest names a file system location."""
    return [f"'{key}' holds a path ({value})" for key, value in _entries(manifest)
            if isinstance(value, str) and PATH_PATTERN.search(value)]


CHECKS: dict[str, Callable[[dict, list[StatePart]], list[str]]] = {
    "counts": check_counts,
    "re-solved values": check_refit,
    "grid": check_grid,
    "order": check_order,
    "mu": check_mu,
    "psi answers": check_psi_answers,
    "tau and zeta": check_tau_zeta,
    "pnc variances": check_pnc_answers,
    "no seed": check_no_seed,
    "no paths": check_no_paths,
}


def check_files(folder: Path, manifest: dict, protected: Mapping[str, pd.DataFrame] | None = None) -> list[str]:
    """The release holds gedp's files only (no link), and each Parquet output exactly the parts its
    manifest lists (``validation.listed_parts``); a job frame's rows as every reader checks them,
    against the protected microdata the audit read (``protected``: ``audit_protected``)."""
    outputs = [PROTECTED_FILE, MEASUREMENTS_FILE, *([JOBS_FILE] if "jobs" in manifest else [])]
    allowed = {MANIFEST_FILE, TABLES_FILE, ACCURACY_FILE, *outputs}
    failures = [f"{entry.name!r} is not a file of a gedp release" if entry.name not in allowed
                else f"{entry.name!r} is a link" for entry in sorted(folder.iterdir())
                if entry.name not in allowed or entry.is_symlink()]
    failures += [f"{name} is missing" for name in (TABLES_FILE,) if not (folder / name).is_file()]
    decoded = set()
    for output in outputs:
        try:
            check_decoded(folder, output, listed_parts(folder, output, manifest))
            decoded.add(output)
            if output == JOBS_FILE:  # its rows as every reader checks them (codes, jobs adding up)
                rows = audit_protected(folder, manifest, protected if PROTECTED_FILE in decoded else None)
                check_adds_up(folder, read_stored(folder, JOBS_FILE), rows)
        except InputError as err:
            failures.append(str(err).split(": ", 1)[-1])
    return failures


def audit_protected(folder: Path, manifest: dict, protected: Mapping[str, pd.DataFrame] | None) -> pd.DataFrame:
    """The protected microdata as every reader reads them (``reader.read_protected``), taken from the
    states' ``protected`` parts the audit read (``protected_parts``) when they are every part listed,
    each of the columns of the first, and their sizes passed ``check_decoded``: the same checks on the
    same rows (schemas from the footers, count, codes), the rows read once. Otherwise (``protected``
    None, a part left out or of other columns) ``read_protected``, refusing as it does."""
    from gedp.release.reader import checked_protected, part_schemas, parts_read

    if protected is None or "quarters" in manifest or list(protected) != sorted(manifest["states"]):
        return read_protected(folder)
    with parts_read(folder, PROTECTED_FILE):
        names = part_schemas(folder, listed_parts(folder, PROTECTED_FILE, manifest), manifest)
    if any(list(frame.columns) != names for frame in protected.values()):
        return read_protected(folder)
    return checked_protected(folder, pd.concat(list(protected.values()), ignore_index=True), manifest)


def _run(checks: Mapping[str, Callable[[dict, list[StatePart]], list[str]]], manifest: dict,
         parts: list[StatePart]) -> dict[str, list[str]]:
    """Each check's failures (a manifest or file missing what it must hold: cannot be checked)."""
    found = {}
    for name, check in checks.items():
        try:
            found[name] = check(manifest, parts)
        except (KeyError, IndexError, TypeError, ValueError) as err:
            found[name] = [f"cannot be checked: {type(err).__name__} {err}"]
    return found


def _panel_failures(folder: Path, manifest: dict) -> dict[str, list[str]]:
    """Every check of every quarter of a panel release against the quarter's own manifest, and the
    panel's distinct establishments against its manifest's."""
    found: dict[str, list[str]] = {name: [] for name in CHECKS}
    ids: set[str] = set()
    every: list[StatePart] = []
    for quarter, section in manifest["per_quarter"].items():
        parts = state_parts(folder, manifest, quarter)
        every += parts
        ids.update(id_ for part in parts for id_ in part.protected["estab_id"].astype(str))
        for name, failures in _run(CHECKS, dict(section), parts).items():
            found[name] += [f"{quarter}: {failure}" for failure in failures]
    if len(ids) != manifest["establishments"]:
        found["counts"].append(f"{len(ids):,} distinct establishments over the quarters, the manifest states "
                               f"{manifest['establishments']:,}")
    found["tables"] = check_tables(folder, every)
    found["no seed"] += check_no_seed(manifest, [])
    found["no paths"] += check_no_paths(manifest, [])
    return found


def audit_release(folder: str | Path) -> list[Check]:
    """Every check of ``CHECKS`` on the release in ``folder``, after ``check_files`` (a panel release:
    on each of its quarters). A manifest that cannot be read as a release's is the one failed check."""
    folder = Path(folder)
    try:
        manifest = dict(read_manifest(folder))
    except InputError as err:
        return [Check("manifest", False, str(err))]
    if "quarters" in manifest:
        found = {"files": check_files(folder, manifest)} | _panel_failures(folder, manifest)
    else:
        read = protected_parts(folder, manifest)  # each protected part read once, before the measurements
        found = {"files": check_files(folder, manifest, read[1])}
        parts = state_parts(folder, manifest, read=read)
        found |= _run(CHECKS, manifest, parts) | {"tables": check_tables(folder, parts)}
    return [Check(name, not failures, "; ".join(failures[:5]) + (" ..." if len(failures) > 5 else ""))
            for name, failures in found.items()]
