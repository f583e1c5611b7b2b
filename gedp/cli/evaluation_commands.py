"""The commands that evaluate: ``evaluate`` (the experiments), ``suppress`` (cell suppression as the
QCEW runs it, audited) and ``audit`` (a written release's bytes, or the release path's privacy)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

from gedp.cli.command_line import (
    app,
    console,
    errors,
    plain,
    printable,
    progress_counts,
    progress_steps,
    reported_errors,
)
from gedp.cli.defaults import DEFAULT_PROFILE, E3_DEFAULTS, E5_DEFAULTS, SUPPRESSION_DEFAULTS

if TYPE_CHECKING:
    from gedp.audit.requested import AuditResult
    from gedp.evaluation.suppression_run import SuppressionRun

# gedp evaluate
Name = Annotated[str, typer.Argument(help="e1 (employment), e2 (wages), e3 (bias), e4 (analytic), e5 (earlier "
                                          "mechanisms, noise infusion, cell suppression), e6 (employer-employee "
                                          "workloads on a job frame), accuracy (QCEW), coverage (margins of error), "
                                          "risk (disclosure risk of a release), utility (for microdata users).")]
ReportFolder = Annotated[Path, typer.Option(help="Folder for report.md, summary.json and the plots.")]
Replications = Annotated[Optional[int], typer.Option(help="Replications (e1: 1, e2: 34, e5: 20, e6: 20, coverage: 40, "
                                                          "accuracy: 20, utility: 5 by default).")]
ExperimentData = Annotated[Optional[Path], typer.Option(help="Microdata (e1, e2, e5, e6, coverage, accuracy, utility) "
                                                             "instead of a profile: a file (.csv, .parquet), a folder "
                                                             "of Parquet parts, or a release folder (its protected "
                                                             "microdata, read through the release reader's checks).")]
ExperimentFromQcew = Annotated[Optional[Path], typer.Option(help="A BLS QCEW file (or folder of per-area CSVs): "
                                                                 "evaluate on a state synthesized "
                                                                 "from it.")]
ExperimentProfile = Annotated[str, typer.Option(help="Built-in profile for e1, e2, e5, e6, coverage, accuracy and "
                                                     "utility.")]
ExperimentConfig = Annotated[Optional[str], typer.Option(help="e1, e5, coverage, accuracy, utility: config name or "
                                                              "YAML file (default employment, employment, baseline, "
                                                              "recommended, recommended: the shipped plan).")]
ExperimentSeed = Annotated[int, typer.Option(help="Seed; replications use independent child streams.")]
Trials = Annotated[int, typer.Option(help="e3 and e4: simulated trials.")]
Counties = Annotated[int, typer.Option(help="e3: counties.")]
PerCounty = Annotated[int, typer.Option(help="e3: establishments per county.")]
Employees = Annotated[float, typer.Option(help="e3: employees per establishment.")]
GammaSqrt = Annotated[float, typer.Option(help="e3: gamma of psi = sqrt.")]
GammaLog = Annotated[float, typer.Option(help="e3: gamma of psi = log.")]
Mu = Annotated[float, typer.Option(help="e3: mu of each query.")]
InfusionS = Annotated[float, typer.Option(help="e5, risk: smallest distortion |f - 1| of noise infusion.")]
InfusionT = Annotated[float, typer.Option(help="e5, risk: largest distortion |f - 1| of noise infusion.")]
Delta = Annotated[float, typer.Option(help="e5, e6: delta of Smooth Laplace.")]
Jobs = Annotated[Optional[Path], typer.Option(help="e6: the job table of --data, a file (.csv, .parquet) "
                                                   "or a folder of Parquet parts (default: synthetic jobs drawn with "
                                                   "--seed).")]
GedpReplications = Annotated[Optional[int], typer.Option(help="e6: gedp job-frame releases per eps (default: "
                                                              "min(replications, 10); 0 leaves gedp out).")]
RiskRelease = Annotated[Optional[Path], typer.Option(help="risk: a release folder of part of --data (the rest is the "
                                                          "control); default: a random half protected with "
                                                          "--config.")]
Structure = Annotated[Optional[list[str]], typer.Option(help="Rewrite the state's establishments under a structure of "
                                                             "gedp.synth.structures first (repeatable; e.g. "
                                                             "moving-cells).")]
Implicates = Annotated[Optional[int], typer.Option(help="utility: implicates per release (default 10; 0: none).")]
# gedp suppress
SuppressionFolder = Annotated[Path, typer.Option(help="Folder for cells.csv, the audit, shares, report.md and the "
                                                      "plot.")]
SuppressedData = Annotated[Optional[Path], typer.Option(help="Microdata: a file (.csv, .parquet), a folder of Parquet "
                                                              "parts, or a release folder (its protected microdata, "
                                                              "read through the release reader's checks).")]
SuppressedFromQcew = Annotated[Optional[Path], typer.Option(help="A BLS QCEW file (or folder of per-area "
                                                                 "CSVs): suppress a state synthesized from it and "
                                                                 "compare with the published suppression.")]
SuppressedProfile = Annotated[str, typer.Option(help="Built-in profile when neither --data nor --from-qcew is given.")]
P = Annotated[float, typer.Option("--p", help="p of the p% rule.")]
MinEstabs = Annotated[int, typer.Option(help="Cells with fewer establishments are suppressed.")]
Attributes = Annotated[str, typer.Option(help="Attributes the rule and the audit cover, comma-separated.")]
LpAudit = Annotated[bool, typer.Option("--audit/--no-audit", help="LP audit of every suppressed cell, with repair of "
                                                                  "failing primaries.")]
SynthesisSeed = Annotated[int, typer.Option(help="Seed of the synthesis with --from-qcew.")]
EveryLp = Annotated[bool, typer.Option("--every-lp", help="Final audit: solve both LPs of every cell, so the audit "
                                                          "file has each interval's ends (slower; same verdicts).")]
# gedp audit
AuditedRelease = Annotated[Optional[Path], typer.Option(help="A release folder: audit its written bytes against its "
                                                             "manifest.")]
Pipeline = Annotated[bool, typer.Option("--pipeline", help="Audit the release path: gedp protect run on two "
                                                           "neighbouring datasets many times.")]
Runs = Annotated[int, typer.Option(help="With --pipeline: runs of gedp protect on each dataset.")]
AuditConfig = Annotated[str, typer.Option(help="With --pipeline: the plan protected (name or YAML).")]
Broken = Annotated[bool, typer.Option("--broken", help="With --pipeline: audit a deliberately broken build (noise sd "
                                                       "halved, full sd claimed).")]
AuditOut = Annotated[Optional[Path], typer.Option(help="Also write the results to this JSON file.")]
Workers = Annotated[int, typer.Option(help="With --pipeline: processes the runs are spread over (1: this one).")]


@app.command()
def evaluate(
    name: Name, out: ReportFolder, replications: Replications = None, data: ExperimentData = None,
    from_qcew: ExperimentFromQcew = None, profile: ExperimentProfile = DEFAULT_PROFILE, config: ExperimentConfig = None,
    seed: ExperimentSeed = 1, trials: Trials = 100_000, counties: Counties = E3_DEFAULTS["counties"],
    per_county: PerCounty = E3_DEFAULTS["per_county"], employees: Employees = E3_DEFAULTS["employees"],
    gamma_sqrt: GammaSqrt = E3_DEFAULTS["gamma_sqrt"], gamma_log: GammaLog = E3_DEFAULTS["gamma_log"],
    mu: Mu = E3_DEFAULTS["mu"], infusion_s: InfusionS = E5_DEFAULTS["infusion_s"],
    infusion_t: InfusionT = E5_DEFAULTS["infusion_t"], delta: Delta = E5_DEFAULTS["delta"], jobs: Jobs = None,
    gedp_replications: GedpReplications = None, release: RiskRelease = None, structure: Structure = None,
    implicates: Implicates = None,
) -> None:
    """Run an evaluation experiment (e1-e6, coverage, accuracy, risk, utility) and write its report and plots."""
    from gedp.evaluation.experiment_run import ExperimentOptions, run_experiment

    start = time.perf_counter()
    with reported_errors():
        options = ExperimentOptions(
            replications=replications, data=data, from_qcew=from_qcew, profile=profile, config=config, seed=seed,
            trials=trials, counties=counties, per_county=per_county, employees=employees, gamma_sqrt=gamma_sqrt,
            gamma_log=gamma_log, mu=mu, infusion_s=infusion_s, infusion_t=infusion_t, delta=delta, jobs=jobs,
            gedp_replications=gedp_replications, release=release, structure=structure, implicates=implicates)
        done = run_experiment(name, out, options, progress=progress_steps, status=errors.status)
    from gedp.synth.columns import count

    inner = sorted({f"{folder}/" for folder in done.plots if folder})
    where = f" in {', '.join(inner)}" if inner else ""
    console.print(f"[bold]{name}[/] written to {printable(out.resolve())} (report.md, summary.json, "
                  f"{count(sum(done.plots.values()), 'plot')}{where}) in {time.perf_counter() - start:.0f}s")
    _say_if_confidential(done.summary)


@app.command(name="suppress")
def suppress_command(
    out: SuppressionFolder, data: SuppressedData = None, from_qcew: SuppressedFromQcew = None,
    profile: SuppressedProfile = DEFAULT_PROFILE, p: P = SUPPRESSION_DEFAULTS["p"],
    min_estabs: MinEstabs = SUPPRESSION_DEFAULTS["min_estabs"],
    attributes: Attributes = ",".join(SUPPRESSION_DEFAULTS["attributes"]), audit: LpAudit = True,
    seed: SynthesisSeed = 1, every_lp: EveryLp = False,
) -> None:
    """Cell suppression as the QCEW runs it, audited: what the published cells still reveal.

    The p% rule and a minimum count mark sensitive cells; secondary suppression over the industry
    and geography hierarchies protects them; an LP audit checks every suppressed cell."""
    from gedp.evaluation.suppression_run import run_suppression

    start = time.perf_counter()
    with reported_errors():
        done = run_suppression(out, data=data, from_qcew=from_qcew, profile=profile, p=p, min_estabs=min_estabs,
                               attributes=attributes, audit=audit, seed=seed, every_lp=every_lp,
                               progress=lambda: progress_counts("auditing intervals"))
    _print_suppression(done, out, time.perf_counter() - start)
    if done.summary["failing_cells"]:
        raise typer.Exit(1)


@app.command()
def audit(release: AuditedRelease = None, pipeline: Pipeline = False, runs: Runs = 200, config: AuditConfig = "audit",
          broken: Broken = False, out: AuditOut = None, workers: Workers = 2) -> None:
    """Audit a written release (--release DIR) or the release path (--pipeline).

    --release checks the bytes: values on their grid, rows in release order, mu, sd, variances, tau and zeta recomputed from the released answers, no seed and no path; exits 2 naming each failed check.

    --pipeline bounds from below, per statistic of the written files, the mu that one establishment's psi-neighbour shows, and exits 1 if a bound exceeds the mu claimed.
    """  # noqa: E501 (one line per paragraph: the help wraps them)
    from gedp.audit.requested import run_audit

    with reported_errors():
        done = run_audit(release, pipeline=pipeline, runs=runs, config=config, broken=broken, workers=workers, out=out,
                         progress=progress_steps)
    if release is not None:
        _print_release_audit(done, release)
    else:
        _print_pipeline_audit(done, broken)
    if done.failed and release is not None:
        errors.print(f"[red]release audit failed[/]: {'; '.join(row['name'] for row in done.failed)}")
        raise typer.Exit(2)
    if done.failed:
        raise typer.Exit(1)


def _print_suppression(done: SuppressionRun, out: Path, seconds: float) -> None:
    summary, published = done.summary, done.published
    table = Table("agglvl", "cells", "withheld", f"withheld {done.attribute}", "before audit repair",
                  *(["withheld by BLS"] if published else []), title="cell suppression")
    for row in summary["shares"]:
        table.add_row(str(row["agglvl"]), f"{row['cells']:,}", f"{row['suppressed_share']:.1%}",
                      f"{row[f'{done.attribute}_share']:.1%}", f"{row['before_repair_share']:.1%}",
                      *([f"{row['published_share']:.1%}"] if published else []))
    console.print(table)
    audited = ("no audit" if summary["failing_cells"] is None else
               f"audit: {summary['audited_intervals']:,} intervals, {summary['failing_cells']} primary cells failing "
               f"after {summary['repair_rounds']} repair round(s)")
    console.print(f"[bold]suppression[/] written to {printable(out.resolve())}: {summary['suppressed']:,} of "
                  f"{summary['cells']:,} cells withheld ({summary['primary']:,} primary); {audited}; {seconds:.0f}s")
    _say_if_confidential(summary)


def _say_if_confidential(summary: dict) -> None:
    """A reminder that a report computed from real microdata is confidential (its files say so too)."""
    from gedp.release.format import CONFIDENTIAL_PREFIX

    if summary["confidential"]:
        console.print(f"  [bold red]CONFIDENTIAL[/]: computed from real microdata; its files are marked "
                      f"{CONFIDENTIAL_PREFIX}... and it must not be published")


def _print_release_audit(done: AuditResult, release: Path) -> None:
    table = Table("check", "verdict", "what failed", title=f"Audit of the release in {plain(release)}")
    for check in done.checks:
        table.add_row(check.name, "[green]pass[/]" if check.passed else "[red]FAIL[/]", printable(check.detail))
    console.print(table)
    console.print(f"{sum(c.passed for c in done.checks)} of {len(done.checks)} checks passed")


def _print_pipeline_audit(done: AuditResult, broken: bool) -> None:
    from gedp.audit.pipeline import PIPELINE_ALPHA

    table = Table("statistic", "claimed mu", "audited lower bound", "runs", "verdict",
                  title="Pipeline audit" + (" of a broken build (noise sd halved)" if broken else ""))
    for r in done.statistics:
        table.add_row(r.statistic, f"{r.claimed_mu:.4g}", f"{r.audited_mu_low:.3f}", f"{r.runs:,}",
                      "[green]pass[/]" if r.passed else "[red]FAIL: leaks more than claimed[/]")
    console.print(table)
    console.print(f"the bounds hold together with probability >= {1 - PIPELINE_ALPHA:.2f} "
                  "(Clopper-Pearson, Bonferroni)")
