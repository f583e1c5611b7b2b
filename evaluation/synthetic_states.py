"""Where synthetic and experimental microdata come from: ``gedp synth`` writes a state drawn from a
built-in profile or fitted to a published QCEW file (with its summary, a job table, a panel of
quarters or a fitted profile beside it); an experiment reads a file, fits a state to a QCEW file,
or draws the profile's state."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.errors import InputError
from gedp.release.writer import check_output_path
from gedp.synth.establishments import WITHIN_CELL_MODES, synthesize_state
from gedp.synth.io import write_microdata
from gedp.synth.profiles import generate_profile, load_profile
from gedp.synth.qcew import PublishedState, read_qcew
from gedp.tabulation.output_files import write_atomically

#: Seed of the synthetic state of a profile (the data; the noise has its own seed): ``gedp run``'s and
#: an experiment's without --data or --from-qcew.
DEFAULT_STATE_SEED = 2016


@dataclass(frozen=True)
class SyntheticState:
    """What ``write_synthetic_state`` wrote: the microdata, its summary (the sidecar's contents),
    the sidecar's path, and the job table's path and size (None without jobs)."""

    microdata: pd.DataFrame
    summary: dict
    sidecar: Path
    jobs_file: Path | None = None
    jobs: int | None = None


def write_synthetic_state(out: Path, *, profile: str | None = None, from_qcew: Path | None = None, seed: int = 1,
                          within_cell: str = "realistic", establishments: int | None = None,
                          fit_profile_to: Path | None = None, jobs: bool = False, state: str | None = None,
                          quarters: str | None = None) -> SyntheticState:
    """Write a synthetic state to ``out`` (.parquet or .csv): from exactly one of ``profile`` and
    ``from_qcew``; a panel of ``quarters`` (FIRST:LAST) grown from it, or ``jobs`` (OUT.jobs.parquet);
    its summary beside it (OUT.summary.json, or OUT.validation.json against the published file), and
    with ``fit_profile_to`` a profile fitted to the published file."""
    start = time.perf_counter()
    if (profile is None) == (from_qcew is None):
        raise InputError("give exactly one of --profile NAME and --from-qcew FILE")
    if out.suffix.lower() not in (".parquet", ".csv"):
        raise InputError(f"--out '{out}': use a .parquet or .csv file name")
    check_output_path(out.resolve())
    if within_cell not in WITHIN_CELL_MODES:
        raise InputError(f"--within-cell '{within_cell}': choose one of {', '.join(WITHIN_CELL_MODES)}")
    rng = np.random.default_rng(seed)
    microdata, summary, published = _synthesized(profile, from_qcew, within_cell, establishments, seed, rng, state)
    if quarters is not None:
        from gedp.synth.panel import grown_panel

        if jobs:
            raise InputError("--jobs goes with one quarter, not --quarters")
        microdata = grown_panel(microdata, quarters, rng=rng)
        summary["quarters"] = quarters
    written = _with_jobs(out, microdata, summary, rng) if jobs else {}
    summary["seconds"] = time.perf_counter() - start
    for path, table in {out: microdata, **written}.items():
        write_atomically(path, partial(write_microdata, table))
    sidecar = out.with_name(out.stem + (".validation.json" if from_qcew else ".summary.json"))
    write_atomically(sidecar, lambda path: path.write_text(json.dumps(summary, indent=2) + "\n"))
    if fit_profile_to is not None and from_qcew is not None:
        _write_fitted_profile(fit_profile_to, published, microdata, from_qcew, within_cell, seed)
    jobs_file = next(iter(written), None)
    jobs_count = None if jobs_file is None else len(written[jobs_file])
    return SyntheticState(microdata, summary, sidecar, jobs_file, jobs_count)


def _with_jobs(out: Path, microdata: pd.DataFrame, summary: dict, rng: np.random.Generator) -> dict[Path, pd.DataFrame]:
    """A synthetic job table of ``microdata`` under its file name beside ``out``, noted in ``summary``."""
    from gedp.synth.jobs import synthesize_jobs

    job_table = synthesize_jobs(microdata, rng=rng)
    jobs_out = out.with_name(f"{out.stem}.jobs{out.suffix}")
    summary["jobs"] = {"file": jobs_out.name, "jobs": len(job_table), "shares": "illustrative"}
    return {jobs_out: job_table}


def _write_fitted_profile(path: Path, published: PublishedState | None, microdata: pd.DataFrame, from_qcew: Path,
                          within_cell: str, seed: int) -> None:
    from gedp.synth.profiles import fit_profile

    fitted = fit_profile(published, microdata, name=path.stem,
                         description=f"Fitted to {from_qcew.name} (gedp synth --from-qcew, {within_cell}, seed {seed})")
    write_atomically(path, lambda staging: staging.write_text(json.dumps(fitted, indent=1) + "\n"))


def _synthesized(profile: str | None, from_qcew: Path | None, within_cell: str, establishments: int | None,
                 seed: int, rng: np.random.Generator,
                 state: str | None = None) -> tuple[pd.DataFrame, dict, PublishedState | None]:
    """A synthetic state from a profile or fitted to a QCEW file, its summary, and the published
    QCEW it was fitted to (None for a profile)."""
    from gedp.synth.schema import CONFIDENTIAL
    from gedp.synth.validate import validation_report

    if profile is not None:
        spec = load_profile(profile)
        microdata = generate_profile(spec, n_establishments=establishments, rng=rng)
        return microdata, {"profile": spec["name"], "description": spec["description"], "seed": seed,
                           "establishments": len(microdata), "counties": int(microdata["county"].nunique()),
                           "totals": {a: float(microdata[a].sum()) for a in CONFIDENTIAL}}, None
    published = read_qcew(from_qcew, state)
    microdata = synthesize_state(published, mode=within_cell, rng=rng)
    return microdata, {"source": str(from_qcew), "within_cell": within_cell, "seed": seed,
                       **validation_report(microdata, published)}, published


def experiment_data(data: Path | None, from_qcew: Path | None, profile: str,
                    seed: int) -> tuple[pd.DataFrame, str, PublishedState | None]:
    """The microdata of an experiment, its description, and the published QCEW it was fitted to (if any)."""
    if data is not None and from_qcew is not None:
        raise InputError("give at most one of --data and --from-qcew")
    if data is not None:
        return experiment_microdata(data), f"file {data.name}", None
    if from_qcew is not None:
        published = read_qcew(from_qcew)
        microdata = synthesize_state(published, rng=np.random.default_rng(seed))
        return (microdata, f"synthetic state fitted to {from_qcew.name} (realistic within-cell sizes, seed {seed})",
                published)
    spec = load_profile(profile)
    return (generate_profile(spec, rng=np.random.default_rng(DEFAULT_STATE_SEED)),
            f"synthetic profile '{spec['name']}'", None)


def experiment_microdata(data: Path) -> pd.DataFrame:
    """The validated microdata of the file ``data`` (``intake.read_input``); of a release (its folder
    or its protected microdata), its protected microdata read through the release reader's checks
    (``reader.read_validated``): a part alone, or a copy with parts its manifest does not list, is refused."""
    from gedp.release.format import PROTECTED_FILE, release_holding
    from gedp.synth.intake import read_input

    release = release_holding(data)
    if release is None:
        return read_input(data)
    if data.resolve() not in (release, release / PROTECTED_FILE):
        raise InputError(f"--data '{data}' is in the release '{release}' and is not its protected microdata: "
                         "give the release's folder")
    from gedp.release.reader import check_one_quarter, read_validated

    check_one_quarter(release, "an experiment")
    return read_validated(release)
