"""The experiments of ``gedp evaluate``, by name: each is a compute step, which returns a result object,
and a render step, which writes report.md, summary.json and the plots from that result.

Experiment modules are imported when their experiment runs, so looking one up stays cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gedp.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

    from gedp.evaluation.e3_bias import E3Setup
    from gedp.evaluation.e5_earlier import E5Setup
    from gedp.measure.workflows import MeasurementPlan
    from gedp.synth.qcew import PublishedState


@dataclass(frozen=True)
class ExperimentRequest:
    """What an experiment is asked to run on; each experiment reads the fields it needs.

    ``truth`` is the confidential microdata of the experiments that use data (``Experiment.uses_data``);
    ``config`` names the plan (each experiment has its default); ``replications`` None means the
    experiment's default. ``e3`` and ``e5`` hold those experiments' setups (None: their defaults).
    ``published`` is the QCEW file the truth was synthesized from, when it was (accuracy reads its
    disclosure codes). ``jobs`` is the job table of ``truth`` (e6; None: synthetic jobs drawn with ``seed``);
    ``gedp_replications`` the gedp job-frame releases per eps of e6 (None: ``e6_gedp_replications``).
    ``release`` is a release of part of ``truth`` (risk; None: a random half is protected).
    """

    truth: pd.DataFrame | None = None
    data_label: str = ""
    published: PublishedState | None = None
    config: str | None = None
    replications: int | None = None
    seed: int = 1
    trials: int = 100_000
    e3: E3Setup | None = None
    e5: E5Setup | None = None
    jobs: pd.DataFrame | None = None
    gedp_replications: int | None = None
    release: Path | None = None
    on_step: Callable[[str], None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Experiment:
    """One experiment: ``compute(request)`` returns its result; ``render(result, out)`` writes the report
    into the folder ``out`` and returns the summary written to summary.json."""

    name: str
    description: str
    uses_data: bool
    compute: Callable[[ExperimentRequest], Any]
    render_function: str  # "module:function" of the render step, imported on use
    #: Named steps the computation reports through ``request.on_step`` (None: it reports none).
    steps: Callable[[ExperimentRequest], int] | None = None

    def render(self, result: Any, out: Path) -> dict:
        module, function = self.render_function.split(":")
        return getattr(importlib.import_module(module), function)(result, out)

    def run(self, request: ExperimentRequest, out: Path) -> dict:
        """Compute and render into ``out``."""
        return self.render(self.compute(request), out)


def _plan(config: str | None, default: str) -> MeasurementPlan:
    from gedp.config import load_config

    return load_config(config or default).plan


def _truth(request: ExperimentRequest) -> pd.DataFrame:
    if request.truth is None:
        raise InputError("this experiment needs microdata (ExperimentRequest.truth)")
    return request.truth


def _e1(request: ExperimentRequest):
    from gedp.evaluation.e1_employment import compute_e1
    from gedp.synth.schema import CONFIDENTIAL

    plan = _plan(request.config, "employment")
    truth = _truth(request)
    truth = truth.drop(columns=[c for c in CONFIDENTIAL if c in truth and c not in plan.attributes])
    return compute_e1(truth, plan, replications=request.replications or 1, seed=request.seed,
                      data_label=request.data_label)


def _e2(request: ExperimentRequest):
    from gedp.evaluation.e2_wages import compute_e2

    if request.config is not None:
        raise InputError("e2 compares the shipped baseline and uniform plans; it takes no --config")
    plans = {"baseline": _plan("baseline", "baseline"), "uniform": _plan("uniform", "uniform")}
    return compute_e2(_truth(request), plans, replications=request.replications or 34, seed=request.seed,
                      data_label=request.data_label)


def _e3(request: ExperimentRequest):
    import dataclasses

    from gedp.evaluation.e3_bias import E3Setup, compute_e3

    setup = dataclasses.replace(request.e3 or E3Setup(), trials=request.trials)
    return compute_e3(setup, seed=request.seed)


def _e4(request: ExperimentRequest):
    from gedp.evaluation.e4_analytic import compute_e4

    return compute_e4(trials=request.trials, seed=request.seed)


def _e5(request: ExperimentRequest):
    from gedp.evaluation.e5_earlier import E5Setup, compute_e5

    setup = request.e5 or E5Setup()
    plan = _plan(request.config, "employment")
    if setup.attribute not in plan.attributes:
        raise InputError(f"e5 compares on {setup.attribute}; the plan of --config does not measure it")
    replications = request.replications or 20
    return compute_e5(_truth(request), plan, setup, replications=replications,
                      gedp_replications=min(replications, 5), seed=request.seed, data_label=request.data_label,
                      on_step=request.on_step)


def _e5_steps(request: ExperimentRequest) -> int:
    from gedp.evaluation.e5_earlier import E5Setup

    return len((request.e5 or E5Setup()).budget_factors) * 2 + 2


def _e6(request: ExperimentRequest):
    import numpy as np

    from gedp.evaluation.e5_earlier import E5Setup
    from gedp.evaluation.e6_jobs import compute_e6
    from gedp.synth.jobs import synthesize_jobs

    truth, label = _truth(request), request.data_label
    jobs = request.jobs
    if jobs is None:
        jobs = synthesize_jobs(truth, rng=np.random.default_rng(request.seed))
        label += f", synthetic jobs (illustrative shares, seed {request.seed})"
    return compute_e6(truth, jobs, request.e5 or E5Setup(), replications=_e6_replications(request),
                      gedp_replications=e6_gedp_replications(request), seed=request.seed, data_label=label,
                      on_step=request.on_step)


def _e6_replications(request: ExperimentRequest) -> int:
    return request.replications or 20


def e6_gedp_replications(request: ExperimentRequest) -> int:
    """gedp releases per eps in e6: as asked, else min(replications, 10) (a release costs more than the
    earlier mechanisms' whole grid)."""
    return request.gedp_replications if request.gedp_replications is not None else min(_e6_replications(request), 10)


def _e6_steps(request: ExperimentRequest) -> int:
    from gedp.evaluation.e5_earlier import E5Setup

    return _e6_replications(request) + len((request.e5 or E5Setup()).eps) * e6_gedp_replications(request)


def _coverage(request: ExperimentRequest):
    from gedp.evaluation.coverage import compute_coverage

    return compute_coverage(_truth(request), _plan(request.config, "baseline"),
                            replications=request.replications or 40, seed=request.seed,
                            data_label=request.data_label)


#: The config ``gedp evaluate accuracy`` evaluates without --config: the shipped plan (gedp protect's default).
ACCURACY_CONFIG = "recommended"


def _accuracy(request: ExperimentRequest):
    """One config's accuracy: the shipped plan's alone without --config; a config given other than
    baseline beside baseline (paired seeds)."""
    from gedp.config import load_config
    from gedp.evaluation.accuracy import compute_accuracy
    from gedp.evaluation.plan_comparison import Comparison

    def run(name: str):
        return compute_accuracy(_truth(request), load_config(name), published=request.published,
                                replications=request.replications or 20, seed=request.seed,
                                data_label=request.data_label, on_step=request.on_step)

    config = str(request.config or ACCURACY_CONFIG)
    if _beside_baseline(request):
        return Comparison(run(config), run("baseline"), Path(config).stem)
    return run(config)


def _risk(request: ExperimentRequest):
    """The disclosure risk of a release of part of the truth (or of a random half protected with the config)."""
    from gedp.config import load_config
    from gedp.evaluation.e5_earlier import E5Setup
    from gedp.evaluation.risk import compute_risk
    from gedp.release.reader import read_manifest, read_protected

    setup = request.e5 or E5Setup()
    common = {"seed": request.seed, "infusion": (setup.infusion_s, setup.infusion_t), "data_label": request.data_label}
    if request.release is None:
        config = request.config or "recommended"
        return compute_risk(_truth(request), config=load_config(config), **common,
                            release_label=f"a random half protected with the {config} config (seed {request.seed})")
    if request.config is not None:
        raise InputError("--config goes with risk without --release (a given release is protected already)")
    read_manifest(request.release)  # InputError when it is not a gedp release
    return compute_risk(_truth(request), released=read_protected(request.release), **common,
                        release_label=f"the release {request.release.name}")


def _beside_baseline(request: ExperimentRequest) -> bool:
    return request.config is not None and request.config != "baseline"


def _accuracy_steps(request: ExperimentRequest) -> int:
    return (request.replications or 20) * (2 if _beside_baseline(request) else 1)


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    Experiment("e1", "employment: pnc against the all-sqrt workflow (plan: employment; 1 replication)", True, _e1,
               "gedp.evaluation.e1_employment:render_e1"),
    Experiment("e2", "employment and wages under the baseline and uniform plans (34 replications)", True, _e2,
               "gedp.evaluation.e2_wages:render_e2"),
    Experiment("e3", "bias of estimated variances in least squares (simulated trees)", False, _e3,
               "gedp.evaluation.e3_bias:render_e3"),
    Experiment("e4", "analytic cases of weighting n unbiased measurements", False, _e4,
               "gedp.evaluation.e4_analytic:render_e4"),
    Experiment("e5", "earlier mechanisms, noise infusion and cell suppression (plan: employment; 20 replications)",
               True, _e5, "gedp.evaluation.e5_earlier:render_e5", steps=_e5_steps),
    Experiment("e6", "the employer-employee evaluation of Haney et al. 2017 on a job frame: workloads 1-3, rankings "
               "1-2, findings 1-6, gedp on jobs at comparable budgets (20 replications; 10 gedp releases per eps)",
               True, _e6, "gedp.evaluation.e6_jobs:render_e6", steps=_e6_steps),
    Experiment("coverage", "coverage of the margins of error (plan: baseline; 40 replications)", True, _coverage,
               "gedp.evaluation.coverage:render_coverage"),
    Experiment("accuracy", "errors, zeros, state totals and margin coverage per QCEW level, on the cells BLS "
               "published (plan: recommended, or --config beside baseline; 20 replications)", True, _accuracy,
               "gedp.evaluation.plan_comparison:render", steps=_accuracy_steps),
    Experiment("risk", "disclosure risk of a release (--release, or a random half protected with --config, default "
               "recommended): singling out, linkability, size-class and wage-decile inference, beside noise "
               "infusion and rounding", True, _risk, "gedp.evaluation.risk_report:render_risk"),
)}


def experiment(name: str) -> Experiment:
    """The experiment called ``name``; InputError naming the choices otherwise."""
    if name not in EXPERIMENTS:
        raise InputError(f"experiment '{name}' is unknown; choose one of {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]
