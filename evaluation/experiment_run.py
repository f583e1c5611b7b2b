"""``gedp evaluate``: an experiment run from its command-line options into a report folder, with its
data prepared (a file, a state fitted to a QCEW file, or a profile's; rewritten under structures; a
job table) and every option checked before anything runs."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.errors import InputError
from gedp.evaluation.e3_bias import E3Setup
from gedp.evaluation.e5_earlier import E5Setup
from gedp.evaluation.experiments import Experiment, ExperimentRequest, experiment
from gedp.evaluation.report import mark_confidentiality
from gedp.evaluation.synthetic_states import experiment_data
from gedp.release.format import SUMMARY_FILE, check_outside_releases
from gedp.release.writer import staged_directory

#: A progress display of a number of steps: yields the callback that advances it by one named step.
Steps = Callable[[int], AbstractContextManager[Callable[[str], None]]]
#: A status line shown while a step runs.
Status = Callable[[str], AbstractContextManager]


def _no_progress(total: int) -> AbstractContextManager[Callable[[str], None]]:
    return nullcontext(lambda step: None)


@dataclass(frozen=True)
class ExperimentOptions:
    """The options of ``gedp evaluate``, each as its --help says (None: the experiment's default)."""

    replications: int | None
    data: Path | None
    from_qcew: Path | None
    profile: str
    config: str | None
    seed: int
    trials: int
    counties: int
    per_county: int
    employees: float
    gamma_sqrt: float
    gamma_log: float
    mu: float
    infusion_s: float
    infusion_t: float
    delta: float
    jobs: Path | None
    gedp_replications: int | None
    release: Path | None
    structure: list[str] | None
    implicates: int | None


@dataclass(frozen=True)
class ExperimentRun:
    """A written experiment report: its summary (summary.json) and its plots' count per report
    folder ("" for the folder itself)."""

    summary: dict
    plots: dict[str, int]


def run_experiment(name: str, out: Path, options: ExperimentOptions, *, progress: Steps = _no_progress,
                   status: Status = lambda text: nullcontext()) -> ExperimentRun:
    """Run the experiment ``name`` and write its report, summary and plots into the folder ``out``
    (replaced only when complete; never into a release). ``progress`` shows the steps of experiments that count them,
    ``status`` a line while the others run."""
    chosen = experiment(name)
    request = _request(name, options)
    check_outside_releases(out)  # the release read (risk's --release, --data of a release) or any other
    with staged_directory(out, marker=SUMMARY_FILE) as staging:
        if chosen.uses_data:
            truth, label, published = experiment_data(options.data, options.from_qcew, options.profile, options.seed)
            truth, label = _structured(truth, label, options.structure or [], options.seed)
            request = dataclasses.replace(request, truth=truth, data_label=label, published=published)
        elif options.structure:
            raise InputError(f"--structure goes with an experiment on data, not {name}")
        if options.jobs is not None:
            request = dataclasses.replace(request, jobs=_experiment_jobs(name, options.jobs, options, request.truth))
        chosen.render(_computed(chosen, request, name, progress, status), staging)
        summary = mark_confidentiality(staging, confidential=chosen.uses_data and options.data is not None)
    return ExperimentRun(summary, _report_plots(out))


def _request(name: str, options: ExperimentOptions) -> ExperimentRequest:
    """The experiment's request from the options, refused when an option cannot go with it."""
    _check_counts(name, options.replications, options.trials, options.gedp_replications)
    o = options
    try:
        request = ExperimentRequest(
            config=o.config, replications=o.replications, seed=o.seed, trials=o.trials,
            gedp_replications=o.gedp_replications,
            e3=E3Setup(counties=o.counties, per_county=o.per_county, employees=o.employees, gamma_sqrt=o.gamma_sqrt,
                       gamma_log=o.gamma_log, mu=o.mu, trials=o.trials),
            e5=E5Setup(infusion_s=o.infusion_s, infusion_t=o.infusion_t, delta=o.delta))
    except ValueError as err:
        raise InputError(str(err)) from None
    if o.release is not None and name != "risk":
        raise InputError("--release goes with risk")
    if o.implicates is not None and (name != "utility" or o.implicates < 0):
        raise InputError(f"--implicates ({o.implicates}) goes with utility and must be >= 0")
    return dataclasses.replace(request, release=o.release, implicates=o.implicates)


def _check_counts(name: str, replications: int | None, trials: int, gedp_replications: int | None) -> None:
    """Refuse counts of an experiment that cannot run."""
    if replications is not None and replications < 1:
        raise InputError(f"--replications ({replications}) must be >= 1")
    if trials < 2:
        raise InputError(f"--trials ({trials}) must be >= 2")
    if gedp_replications is not None and (name != "e6" or gedp_replications < 0):
        raise InputError(f"--gedp-replications ({gedp_replications}) goes with e6 and must be >= 0")


def _structured(truth: pd.DataFrame, label: str, names: list[str], seed: int) -> tuple[pd.DataFrame, str]:
    """The experiment's microdata rewritten under the named structures (``gedp.synth.structures``)."""
    from gedp.synth.structures import apply_structures

    if not names:
        return truth, label
    try:
        return (apply_structures(truth, names, np.random.default_rng(seed)),
                f"{label}, rewritten under {' + '.join(names)} (seed {seed})")
    except ValueError as err:
        raise InputError(str(err)) from None


def _experiment_jobs(name: str, jobs: Path, options: ExperimentOptions, truth: pd.DataFrame | None) -> pd.DataFrame:
    """The validated job table ``jobs`` of --data for e6."""
    from gedp.release.format import release_holding
    from gedp.synth.io import read_jobs

    if name != "e6" or options.data is None:
        raise InputError("--jobs goes with e6 and --data (the job table of that establishment file)")
    if release_holding(jobs) is not None:  # a release's job frame is not a job table
        raise InputError(f"--jobs '{jobs}' is in a release: give the job table of --data")
    return read_jobs(jobs, truth)


def _computed(chosen: Experiment, request: ExperimentRequest, name: str, progress: Steps,
              status: Status) -> object:
    """An experiment's result, with a progress display (experiments that count their steps) or a status line."""
    if chosen.steps is not None:
        with progress(chosen.steps(request)) as advance:
            return chosen.compute(dataclasses.replace(request, on_step=advance))
    what = f"{len(request.truth):,} establishments" if chosen.uses_data else f"{request.trials:,} trials"
    with status(f"running {name} on {what}"):
        return chosen.compute(request)


def _report_plots(out: Path) -> dict[str, int]:
    """The plots of a report folder and of the reports inside it (a plan's accuracy beside baseline
    writes each in its own folder), as their summaries list them: folder name ("" for ``out``) -> count."""
    return {("" if path.parent == out else path.parent.name): len(json.loads(path.read_text()).get("figures", []))
            for path in sorted(out.rglob(SUMMARY_FILE))}
