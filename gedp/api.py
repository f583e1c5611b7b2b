"""gedp as a Python library: synthesize a state, protect microdata, tabulate with margins of error,
write and read releases. The command line is a thin layer over the same functions.

    import gedp
    micro = gedp.synthesize(profile="small", seed=1)
    release = gedp.protect(micro, config="recommended")
    release.tabulate(by=["county", "naics3"], moe=True, level=0.95)
    release.write("release/")
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gedp.configs import DEFAULT_CONFIG
from gedp.errors import InputError, run_started
from gedp.options import Engine, Input, Ledger, accepts_legacy_keywords

if TYPE_CHECKING:  # each function imports what it calls: `import gedp.api` loads no numerical library
    import numpy as np
    import pandas as pd

    from gedp.config import Config
    from gedp.postprocess.combine import Combined
    from gedp.release.manifest import Manifest
    from gedp.running.engine import Source
    from gedp.tabulation.job_frame_tables import tabulate_job_frame

__all__ = ["Engine", "Input", "Ledger", "Release", "combine", "interval", "load", "plan", "protect", "read_release",
           "report", "synthesize", "tabulate_job_frame"]


def load(config: str | Path | Mapping[str, Any] | Config = DEFAULT_CONFIG, workflow: str | None = None,
         allow_large_mu: bool = False, integer: bool | None = None) -> Config:
    """A config from a shipped name ("recommended", the default), a YAML path, a mapping with the YAML's keys, or a
    Config; ``workflow`` ("pnc" or "psi") overrides the config's, ``integer`` its rounding to whole numbers
    (controlled rounding). A query's mu above ``gedp.accounting.mu_limits.MAX_QUERY_MU`` is refused unless
    ``allow_large_mu``."""
    from gedp.config import resolve_config

    return resolve_config(config, workflow, allow_large_mu, integer)


def synthesize(profile: str = "small", *, from_qcew: str | Path | None = None, establishments: int | None = None,
               seed: int = 1, state: str | None = None) -> pd.DataFrame:
    """Synthetic establishment microdata: a shipped (or JSON) state profile, or a state fitted to a
    BLS QCEW file so that its tabulations reproduce every published cell (``state``: the 2-digit
    FIPS code to take from a file of several states)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if from_qcew is not None:
        from gedp.synth.establishments import synthesize_state
        from gedp.synth.qcew import read_qcew

        if establishments is not None:
            raise InputError("establishments goes with profile, not from_qcew (the QCEW file fixes the count)")
        return synthesize_state(read_qcew(from_qcew, state), rng=rng)
    from gedp.synth.profiles import generate_profile, load_profile

    return generate_profile(load_profile(profile), n_establishments=establishments, rng=rng)


def plan(published_qcew: str | Path, out: str | Path | None = None, *, mu_total: float | None = None,
         targets: Sequence[int] | None = None, base: str | Path | Config = "baseline",
         weights: Mapping[str, float] | None = None, on_step: Any = None, quarters: int = 1) -> Any:
    """A budget plan chosen from a state's published QCEW file alone (``gedp.planning``): searched on
    a stand-in synthesized from it, by the errors the least squares' covariance predicts. With
    ``out``, writes the plan's YAML (a config for ``protect``), its summary JSON and frontier plot.
    Returns the ``PlanResult``. An agency plans on last year's or last quarter's published file.
    ``targets``: the QCEW levels judged (default: every level the file publishes). ``quarters``:
    ``mu_total`` is the budget of that many quarters, each planned at mu_total / sqrt(quarters)."""
    from gedp.planning.output import write_plan
    from gedp.planning.search import make_plan

    result = make_plan(published_qcew, mu_total=mu_total, targets=targets, base=base,
                       weights=weights, on_step=on_step, quarters=quarters)
    if out is not None:
        write_plan(result, Path(out))
    return result


@accepts_legacy_keywords
@run_started()
def protect(microdata: Source, config: str | Path | Mapping[str, Any] | Config = DEFAULT_CONFIG, *,
            seed: int | None = None, not_for_publication: bool = False, ledger: Ledger | None = None,
            engine: Engine | None = None, input: Input | None = None, allow_over_cap: bool = False) -> Release:
    """Protect establishment microdata (a DataFrame, a CSV or Parquet file, or a folder of Parquet
    parts) state by state; returns the release, held in a temporary folder until ``write``. ``config``:
    a shipped name, a YAML path, a mapping or a ``Config`` (``gedp.load(config, workflow=...,
    integer=..., allow_large_mu=...)`` to change its workflow, its rounding to whole numbers or its
    limit on mu). ``input``: how the input is read (``gedp.Input``: the agency's column names, zero
    padding of codes, the job table of a config with job families).

    Noise comes from the secure generator; ``seed`` gives a replayable stream and needs
    ``not_for_publication=True`` (the release then says ``"publishable": false``).

    ``ledger`` (``gedp.Ledger``): the lifetime budget ledger that records the release, as ``gedp
    protect --ledger`` does: refused before any noise is drawn when it would take the dataset over
    its lifetime or annual cap, committed once complete; the manifest's ``lifetime`` section shows the
    spending.

    An input of several quarters (``year`` and ``qtr`` columns: a panel, ``gedp.synth.panel``) is
    protected quarter by quarter into one panel release (``gedp.running.panel_protect``; with
    ``ledger``, reserved as one release of all its quarters before any noise is drawn); tabulate it
    with ``quarter``, ``change`` or ``gains_losses``. A panel whose quarters together spend more than
    the config's ``mu_cap`` (sqrt(quarters) x a quarter's mu, for an establishment in every quarter) is
    refused unless ``allow_over_cap=True``.

    Stopped (Ctrl-C; SIGTERM where ``gedp.running.process.stop_on_sigterm`` is installed), it raises the
    ``KeyboardInterrupt`` with a note saying what the run left (a release pending or committed in the
    ledger); a SIGTERM it survives does not stop a later call.

    ``engine`` (``gedp.Engine``): local worker processes (the default) or a dask cluster, built in
    (loopback only, TLS with keys made for the run) or existing (``tls://`` with credentials).
    The keywords of gedp 0.x (``lifetime_cap=``, ``scheduler=``, ``jobs=``, ``workflow=``, ...) still
    work, with a DeprecationWarning.
    """
    from gedp.measure.rng import check_publication
    from gedp.running.engine import engine_access
    from gedp.running.panel_protect import is_panel, protect_panel
    from gedp.running.recorded_release import protect_recorded, requested_ledger
    from gedp.synth.intake import prepare_input

    engine, input = engine or Engine(), input or Input()
    check_publication(seed, None, not_for_publication)
    access = engine_access(engine)
    request = requested_ledger(ledger, not_for_publication)
    loaded = load(config)
    microdata = prepare_input(microdata, columns=input.columns, pad_codes=input.pad_codes,
                              attributes=loaded.attributes)
    holder = tempfile.TemporaryDirectory(prefix="gedp-release-")
    folder = Path(holder.name) / "release"
    if is_panel(microdata):  # several quarters: a panel release (gedp.running.panel_protect)
        if input.jobs is not None:
            raise InputError("a job table goes with a release of one quarter, not a panel")
        protect_panel(microdata, loaded, folder, ledger=request, seed=seed, engine=engine.name, scheduler=access,
                      processes=engine.processes, allow_over_cap=allow_over_cap)
    else:
        protect_recorded(microdata, loaded, folder, ledger=request, seed=seed, engine=engine.name, scheduler=access,
                         jobs=input.jobs, processes=engine.processes)
    return Release(folder, holder)


def report(release: str | Path | Release, out: str | Path | None = None, *,
           published: str | Path | None = None) -> Any:
    """One self-contained HTML page a manager reads about a release (``gedp.evaluation.manager_report``):
    the privacy statement, the cells published against cell suppression, the margins of error, and
    with ``published`` (the agency's public QCEW file of the same state and quarter) the release
    beside the published numbers. Reads only the release and that file. With ``out``, writes the
    page there and its summary beside it (``out``.json). Returns the ``ManagerReport`` (html, summary)."""
    from gedp.evaluation.manager_report import build_report
    from gedp.release.format import check_outside
    from gedp.synth.qcew import read_qcew
    from gedp.tabulation.output_files import check_output_file, summary_path

    folder = release.folder if isinstance(release, Release) else Path(release)
    if out is not None:  # refused before the page is built
        check_output_file(Path(out))
        check_outside(folder, out, summary_path(Path(out)))
    agency = None if published is None else read_qcew(published)
    page = build_report(folder, agency, None if published is None else Path(published).name)
    if out is not None:
        page.write(out)
    return page


def read_release(path: str | Path) -> Release:
    """A release directory written by ``gedp protect``, ``gedp run`` or ``Release.write``."""
    from gedp.release.validation import read_manifest

    read_manifest(path)
    return Release(Path(path))


class Release:
    """A release: protected microdata, noisy measurements, QCEW tables and manifest (all public)."""

    def __init__(self, folder: Path, holder: tempfile.TemporaryDirectory | None = None) -> None:
        self.folder = folder
        self._holder = holder  # keeps a temporary release alive as long as this object
        self._microdata: pd.DataFrame | None = None

    def __repr__(self) -> str:
        m = self.manifest
        return (f"<gedp.Release: {m['establishments']:,} establishments, states {', '.join(m['states'])}, "
                f"mu_total {m['mu_total']:.4f}, publishable {m['publishable']}>")

    @property
    def manifest(self) -> Manifest:
        from gedp.release.validation import read_manifest

        return read_manifest(self.folder)

    @property
    def privacy(self) -> dict[str, Any]:
        """The release's guarantee between psi-neighbours (the manifest's ``privacy`` block): ``mu``,
        ``rho`` = mu^2 / 2 and ``epsilon`` at delta 1e-5, 1e-6 and 1e-9 (exact GDP conversion), in
        total and under ``attributes`` for each attribute's own queries; checked against the ledgers
        (``read_manifest``), each epsilon against its mu (``spending.checked_privacy``) and the mu
        against the noise the answers drew (their every reader's check, ``reader.read_measurements``)."""
        from gedp.release.reader import confirmed_manifest
        from gedp.release.spending import checked_privacy

        return checked_privacy(self.folder, confirmed_manifest(self.folder))

    @property
    def microdata(self) -> pd.DataFrame:
        """The protected microdata (public columns and protected attributes)."""
        if self._microdata is None:
            from gedp.release.reader import read_stored

            self._microdata = read_stored(self.folder)
        return self._microdata

    @property
    def measurements(self) -> pd.DataFrame:
        """Every noisy answer: query, attribute, mechanism, mu, keys, released, estimate, variance, sd, grid
        (a panel's quarter by quarter, with its quarter), checked as every reader of them checks them
        (``reader.read_measurements``)."""
        import pandas as pd

        from gedp.release.reader import read_measurements, release_quarters

        quarters = release_quarters(self.folder)
        if not quarters:
            return read_measurements(self.folder)
        return pd.concat([read_measurements(self.folder, quarter) for quarter in quarters], ignore_index=True)

    @property
    def qcew_tables(self) -> pd.DataFrame:
        """QCEW aggregation levels 51-58 and 71-78 in BLS layout, tabulated from the protected microdata."""
        from gedp.release.reader import read_tables

        return read_tables(self.folder)

    @property
    def jobs(self) -> pd.DataFrame:
        """The protected job frame (a release with job families): estab_id, family, worker columns, jobs."""
        from gedp.release.reader import check_adds_up
        from gedp.tabulation.job_frame_tables import read_job_frame

        frame = read_job_frame(self.folder)
        check_adds_up(self.folder, frame, self.microdata)
        return frame

    def tabulate(self, by: str | Sequence[str] = "total", *, agglvl: int | None = None, format: str = "table",
                 titles: str | Path | None = None, out: str | Path | None = None, moe: bool = False,
                 level: float = 0.95, where: str | None = None, quarter: str | None = None,
                 change: str | None = None, gains_losses: str | None = None,
                 implicates: str | Path | None = None) -> pd.DataFrame:
        """Totals of the protected attributes by public columns (``"total"`` or [] for the grand
        total), optionally only over establishments matching ``where`` (a filter on public columns:
        comparisons joined by and, or, not, as ``gedp tabulate --where`` reads it) and with margins
        of error ``<attribute>_moe`` at confidence ``level``, computed from the release's
        least-squares covariance (no privacy budget spent). With worker columns
        in ``by`` (sex, education, home_county, ...), protected jobs of the release's job frame
        (``tabulate_job_frame``).

        ``agglvl`` gives a QCEW aggregation level (50-58, 70-78) instead of ``by``; ``format``
        ``"qcew"`` gives it ready to publish (``postprocess.publication``: titles, whole numbers,
        avg_wkly_wage, margins rounded up), with titles from ``titles`` (a published QCEW CSV) or the
        lists shipped with gedp; ``"xlsx"`` writes the workbook ``out`` (the level, or every level
        present without ``agglvl``, and a notes sheet with the privacy statement) and returns its
        levels stacked (``out`` with another format is refused: the table is returned; an ``out`` in
        the release is refused, as every reader refuses it).

        A panel release (``manifest["quarters"]``) takes ``quarter`` (e.g. "2017Q1": that quarter's
        levels) or ``change`` ("2016Q1:2017Q1": ``<attribute>_chg``, ``_chg_moe``, ``_pct_chg``
        of each cell; with format "qcew" and ``agglvl``, the second quarter's publication with
        BLS's ``oty_`` columns), or ``gains_losses`` ("2016Q1:2016Q2": gross job gains and losses by
        ``by``, raw and corrected, with margins when ``moe``), see ``gedp.tabulation.panel_tables.tabulate_panel``.

        A table by ``size_class`` is combined over 20 implicates drawn with the release's seed, or over
        ``implicates``: a folder ``gedp implicates`` (``Release.implicates``'s command) wrote of this
        release, checked as ``gedp tabulate --implicates`` checks it (``release.implicates_folder``)."""
        import numpy as np

        from gedp.postprocess.keys import has_derived

        if not isinstance(moe, (bool, np.bool_)):  # "no" would be true (red team rt23 F5)
            raise InputError(f"moe must be True or False, not {type(moe).__name__}")
        moe = bool(moe)
        if out is not None and format != "xlsx":
            raise InputError(f"out is the workbook of format 'xlsx'; format {format!r} writes no file (the table "
                             "is returned: write it with DataFrame.to_csv)")
        if has_derived(by) and change is None and gains_losses is None:
            from gedp.release.implicates import tabulate_derived
            from gedp.release.implicates_folder import open_implicates

            drawn = None if implicates is None else open_implicates(self.folder, implicates, quarter)
            return tabulate_derived(self.folder, by, where=where, moe=moe, level=level, format=format, quarter=quarter,
                                    drawn=drawn)
        if implicates is not None:
            raise InputError("implicates go with a table by size_class: tables by public columns come from the "
                             "release's answers, not implicates")
        if quarter is not None or change is not None or gains_losses is not None or "quarters" in self.manifest:
            from gedp.tabulation.panel_tables import tabulate_panel

            return tabulate_panel(self.folder, None if agglvl is not None else by, quarter=quarter, change=change,
                                  gains_losses=gains_losses, agglvl=agglvl, format=format, titles=titles, where=where,
                                  moe=moe, level=level)
        if format not in ("table", "qcew", "xlsx"):
            raise InputError(f"format {format!r}: choose one of table, qcew, xlsx")
        if format != "table" or agglvl is not None:
            return self._publish(agglvl, format, titles, out, moe, level, where)
        from gedp.postprocess.keys import worker_keys
        from gedp.postprocess.tabulate import tabulate
        from gedp.release.margins import kept_variances

        if worker_keys(by):
            from gedp.tabulation.job_frame_tables import tabulate_job_frame

            return tabulate_job_frame(self.folder, self.microdata, by, where=where, moe=moe, level=level)
        margins = kept_variances(self.folder) if moe else None
        try:
            return tabulate(self.microdata, by, where=where, moe=moe, level=level, margins=margins)
        except ValueError as err:
            raise InputError(str(err)) from None

    def _publish(self, agglvl: int | None, format: str, titles: str | Path | None, out: str | Path | None,
                 moe: bool, level: float, where: str | None) -> pd.DataFrame:
        """QCEW levels in BLS layout (``tabulate``'s ``agglvl`` and ``format``)."""
        import pandas as pd

        from gedp.postprocess.publication import publish_levels
        from gedp.release.margins import kept_variances

        options = {"where": where, "moe": moe, "level": level, "margins": kept_variances(self.folder) if moe else None}
        tables = publish_levels(self.microdata, agglvl, format, titles, **options)
        if format == "xlsx":
            if out is None:
                raise InputError("format xlsx needs out (the workbook's file name)")
            from gedp.postprocess.publication import publication_notes, write_workbook
            from gedp.release.format import check_outside
            from gedp.release.reader import confirmed_manifest

            check_outside(self.folder, out)

            notes = publication_notes(confirmed_manifest(self.folder), tables.titles, str(self.folder),
                                      level if moe else None)
            write_workbook(tables.levels, notes, out)
        return pd.concat(tables.levels.values(), ignore_index=True)

    def implicates(self, m: int, seed: int | None = None, *, quarter: str | None = None,
                   level_prior: str = "month1", change_prior: str = "independent",
                   wage_prior: str = "sector") -> pd.DataFrame:
        """``m`` complete microdata files drawn from the posterior of the confidential values given
        this release's answers, stacked: an ``implicate`` column (1..m), then the release's columns
        (``gedp.release.implicates``; no budget spent, nothing of the release changed). Draws come
        from the secure generator unless ``seed`` is given; a panel release takes a ``quarter``.
        ``level_prior="quarter"`` puts the size prior on the quarter's level instead of month 1's
        (job destruction nearer the truth; job creation and small size classes shifted: see the method docs);
        ``change_prior="joint"`` draws the two month-to-month changes from one joint prior per size band
        instead of two independent ones (the method docs' measurement);
        ``wage_prior="cells"`` gives each county x NAICS-6 cell its own wage level (the size-wage slope
        within cells kept, the slope with sector effects too steep: the method docs' measurement).
        Combine a statistic computed on each with ``gedp.combine``."""
        from gedp.release.implicates import implicates_in_memory

        return implicates_in_memory(self.folder, m, seed=seed, quarter=quarter, level_prior=level_prior,
                                    change_prior=change_prior, wage_prior=wage_prior)

    def write(self, out: str | Path) -> Path:
        """Copy the release to ``out`` atomically (a new folder, or one holding an earlier release);
        a release holding a file its manifest does not account for is refused, not copied."""
        from gedp.release.format import JOBS_FILE, MEASUREMENTS_FILE, PROTECTED_FILE
        from gedp.release.validation import read_manifest, release_parts
        from gedp.release.writer import check_output_directory, staged_directory

        out = Path(out).resolve()
        check_output_directory(out)
        manifest = read_manifest(self.folder)
        for output in (MEASUREMENTS_FILE, PROTECTED_FILE, *([JOBS_FILE] if "jobs" in manifest else [])):
            release_parts(self.folder, output, manifest)
        with staged_directory(out) as staging:
            for entry in self.folder.iterdir():
                target = staging / entry.name
                (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, target)
        return out


def combine(estimates: Any, variances: Any = None) -> Combined:
    """Combine a statistic computed on each of M implicates (``Release.implicates``) by Rubin's (1987)
    rules: ``estimates`` has one row per implicate (further axes: statistics combined separately),
    ``variances`` their complete-data variances u, or None for a statistic of the establishments
    themselves (a census: u = 0). Returns the mean, T = U_bar + (1 + 1/M) B, the degrees of freedom
    and ``margin(level)`` / ``interval(level)`` (t intervals). Why Rubin's rules and not the
    synthetic-data ones: see the Implicates method page.

    Raises:
        ValueError: values that are not real numbers, fewer than 2 implicates, shapes that differ, non-finite
            values or negative variances, or values whose mean or variance overflows.
    """
    from gedp.postprocess.combine import combine as rubin

    return rubin(estimates, variances)


def interval(values: Sequence[float] | np.ndarray, psi: str = "sqrt", gamma: float | None = None,
             **params: float) -> pd.DataFrame:
    """The uncertainty interval I(x) of each value for this psi and gamma (by default 1 for
    sqrt-linear, whose gamma* is 1, and 0.5 otherwise): x, lower, upper, and the distances below and
    above x in percent; ``attrs["psi"]`` holds the psi's parameters and ``attrs["gamma"]`` gamma."""
    import numpy as np
    import pandas as pd

    from gedp.measure.neighbors import interval_table, make_psi

    if gamma is None:
        gamma = 1.0 if psi == "sqrt-linear" else 0.5

    values = np.asarray(values, dtype=float)
    bad = values[~(np.isfinite(values) & (values >= 0))]
    if len(bad):
        raise InputError(f"values must be finite numbers >= 0; got {bad[0]}")
    try:
        neighbor = make_psi(psi, **params)
        table = pd.DataFrame(interval_table(neighbor, gamma, values))
    except ValueError as err:
        raise InputError(str(err)) from None
    table.attrs["psi"] = neighbor.params()
    table.attrs["gamma"] = gamma
    return table


def __getattr__(name: str) -> object:
    """``tabulate_job_frame`` (``gedp.tabulation.job_frame_tables``), imported on first use."""
    if name == "tabulate_job_frame":
        from gedp.tabulation.job_frame_tables import tabulate_job_frame

        return tabulate_job_frame
    raise AttributeError(f"module 'gedp.api' has no attribute {name!r}")
