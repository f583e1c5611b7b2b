"""The commands that make data and releases: ``run`` (a synthetic state protected, with its
accuracy), ``synth`` (a synthetic state), ``plan`` (a budget plan from published QCEW) and
``protect`` (confidential microdata protected into a release)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.table import Table

from gedp.cli.command_line import app, console, plain, printable, progress_steps, reported_errors
from gedp.cli.defaults import DEFAULT_PROFILE, available_profiles
from gedp.configs import DEFAULT_CONFIG

if TYPE_CHECKING:
    from gedp.evaluation.synthetic_run import SyntheticRun
    from gedp.evaluation.synthetic_states import SyntheticState
    from gedp.planning.search import PlanResult

Out = Annotated[Path, typer.Option(help="Release directory to write (a new folder, or one holding an earlier "
                                                   "release).")]
ConfigName = Annotated[str, typer.Option(help="Config file or shipped config name.")]
Workflow = Annotated[Optional[str], typer.Option(help="Override the config's workflow: pnc or psi.")]
# gedp run
RunSeed = Annotated[Optional[int], typer.Option(help="Noise seed for a reproducible PCG64 stream (experiments).")]
RunRng = Annotated[Optional[str], typer.Option(help="secure (ChaCha20 keyed from the OS; the default without --seed) "
                                                    "or pcg64.")]
RunProfile = Annotated[str, typer.Option(help=f"Built-in state profile ({', '.join(available_profiles())}).")]
RunEstablishments = Annotated[Optional[int], typer.Option(help="Rescale the profile to this many establishments.")]
# gedp synth
MicrodataOut = Annotated[Path, typer.Option(help="Microdata file to write (.parquet or .csv).")]
SynthProfile = Annotated[Optional[str], typer.Option(help=f"Built-in profile ({', '.join(available_profiles())}) or "
                                                          "profile JSON.")]
SynthFromQcew = Annotated[Optional[Path], typer.Option(help="BLS QCEW by-area CSV of one state and quarter, or a "
                                                            "folder of per-area CSVs (statewide and county files).")]
SynthSeed = Annotated[int, typer.Option(help="Random seed of the synthesis.")]
WithinCell = Annotated[str, typer.Option(help="Within-cell sizes: realistic (skewed) or paper (source rule).")]
SynthEstablishments = Annotated[Optional[int], typer.Option(help="With --profile: rescale to this many "
                                                                 "establishments.")]
FitProfile = Annotated[Optional[Path], typer.Option("--fit-profile", help="With --from-qcew: also write a profile "
                                                                          "to this JSON file.")]
SynthJobs = Annotated[bool, typer.Option("--jobs", help="Also write a synthetic job table, one job per month-1 "
                                                        "employee, to OUT.jobs.parquet (or .csv).")]
SynthState = Annotated[Optional[str], typer.Option(help="With --from-qcew: the state (2-digit FIPS) to take from a "
                                                        "file of several states.")]
SynthQuarters = Annotated[Optional[str], typer.Option(help="FIRST:LAST, e.g. 2016Q1:2017Q1: a panel of these quarters "
                                                           "grown from the synthetic first quarter by public business "
                                                           "dynamics.")]
# gedp plan
PlanFromQcew = Annotated[Path, typer.Option(help="The state's published BLS QCEW file or folder of per-area CSVs "
                                                 "(last year's or last quarter's): the plan reads nothing else.")]
PlanOut = Annotated[Path, typer.Option(help="Plan YAML file to write (a config for gedp protect --config); its "
                                            "summary JSON and frontier plot are written beside it.")]
MuTotal = Annotated[Optional[float], typer.Option(help="Total mu (default: the base config's); with --quarters, the "
                                                       "budget of all the quarters.")]
PlanQuarters = Annotated[int, typer.Option(help="Quarters the budget covers (4: an annual budget); each quarter's plan "
                                                "gets mu / sqrt(quarters).")]
Targets = Annotated[str, typer.Option(help="QCEW levels the plan is judged on, comma-separated (default: every level "
                                           "the published file has).")]
Base = Annotated[str, typer.Option(help="Config whose psi, gammas, zeta and options the plan keeps.")]
Weights = Annotated[str, typer.Option(help="Weights of employment and wages in the objective (default "
                                           "employment=1,wage=1, and never worse than recommended on the levels that "
                                           "carry most cells).")]
# gedp protect
Input = Annotated[Path, typer.Argument(help="Establishment microdata: .csv, .parquet, or a folder of Parquet parts.")]
JobTable = Annotated[Optional[Path], typer.Option(help="Job table, a file (.csv, .parquet) or a folder of Parquet "
                                                       "parts (one row per job: estab_id and QWI worker codes), for "
                                                       "a config with job families, e.g. --config jobs.")]
Seed = Annotated[Optional[int], typer.Option(help="Noise seed for a reproducible PCG64 stream; needs "
                                                  "--not-for-publication.")]
Rng = Annotated[Optional[str], typer.Option(help="secure (ChaCha20 keyed from the OS; the default) or pcg64 (needs "
                                                 "--not-for-publication).")]
NotForPublication = Annotated[bool, typer.Option("--not-for-publication", help="Allow --seed / --rng pcg64: the "
                                                 "release is marked \"publishable\": false and no ledger records "
                                                 "it.")]
Integer = Annotated[Optional[bool], typer.Option("--integer/--no-integer", help="Round the release to whole employees "
                                                 "and dollars by controlled rounding (default: the config's "
                                                 "'integer', false in the shipped ones).")]
Engine = Annotated[str, typer.Option(help="local, or dask: one task per state on a dask.distributed cluster.")]
Scheduler = Annotated[Optional[str], typer.Option(help="With --engine dask: tls:// address of an existing scheduler "
                                                       "(default: a local cluster of 2 workers, loopback only, TLS "
                                                       "with keys made for the run).")]
Processes = Annotated[Optional[int], typer.Option(help="With the local engine: worker processes, each protecting one "
                                                       "state at a time (default: one per usable CPU; 1: the states "
                                                       "one after the other).")]
TlsCaFile = Annotated[Optional[Path], typer.Option(help="With --scheduler: the CA certificate of the cluster (a PEM "
                                                         "file).")]
TlsCert = Annotated[Optional[Path], typer.Option(help="With --scheduler: this client's certificate (a PEM file).")]
TlsKey = Annotated[Optional[Path], typer.Option(help="With --scheduler: this client's private key (a PEM file), "
                                                     "unless the certificate's file holds it.")]
InsecureScheduler = Annotated[bool, typer.Option("--insecure-scheduler", help="Accept a scheduler without TLS "
                                                 "credentials (e.g. tcp://): anyone who reaches it can read the "
                                                 "input.")]
Ledger = Annotated[Optional[Path], typer.Option(help="Lifetime budget ledger (NAME.json in an existing folder): "
                                                     "charge every establishment's account and refuse what exceeds "
                                                     "its cap.")]
LifetimeCap = Annotated[Optional[float], typer.Option(help="With --ledger: the lifetime mu cap of establishments new "
                                                           "to the ledger, in (0, 100].")]
DatasetId = Annotated[Optional[str], typer.Option(help="With --ledger: name the dataset, recalling the cap recorded "
                                                       "under that name (e.g. the next quarter).")]
AnnualCap = Annotated[Optional[float], typer.Option(help="With --ledger: the mu cap of any 4 consecutive quarters (by "
                                                         "the input's year and qtr) of establishments new to the "
                                                         "ledger.")]
AllowLargeMu = Annotated[bool, typer.Option("--allow-large-mu", help="Accept a query mu above 2 (refused by default: "
                                            "a typo such as 70 for 0.70 releases nearly exact values).")]
AllowOverCap = Annotated[bool, typer.Option("--allow-over-cap", help="Protect a panel whose quarters together spend "
                                            "more than the config's mu_cap (refused by default: sqrt(quarters) x a "
                                            "quarter's mu).")]
Columns = Annotated[Optional[str], typer.Option(help="Column names of the input: STORED=GEDP,... (e.g. ruid=estab_id), "
                                                     "beyond the names gedp knows.")]
PadCodes = Annotated[bool, typer.Option("--pad-codes", help="Zero-pad state, county, NAICS and own codes that lost "
                                                            "their leading zeros (county 1 -> 001).")]


@app.command()
def run(out: Out = Path("gedp-release"), config: ConfigName = DEFAULT_CONFIG, seed: RunSeed = None, rng: RunRng = None,
        workflow: Workflow = None, profile: RunProfile = DEFAULT_PROFILE,
        establishments: RunEstablishments = None) -> None:
    """Protect a synthetic state (the small profile by default) and report accuracy against its truth."""
    from gedp.evaluation.synthetic_run import protect_synthetic

    start = time.perf_counter()
    with reported_errors(), progress_steps(1) as advance:
        done = protect_synthetic(out, config, profile=profile, establishments=establishments, seed=seed, rng=rng,
                                 workflow=workflow, on_state=lambda state: advance(f"state {state} done"))
    _print_release_summary(done.manifest, out.resolve(), time.perf_counter() - start)
    _print_accuracy(done)


@app.command()
def synth(out: MicrodataOut, profile: SynthProfile = None, from_qcew: SynthFromQcew = None, seed: SynthSeed = 1,
          within_cell: WithinCell = "realistic", establishments: SynthEstablishments = None,
          fit_profile_to: FitProfile = None, jobs: SynthJobs = False, state: SynthState = None,
          quarters: SynthQuarters = None) -> None:
    """Write a synthetic state: from a built-in profile, or fitted to a published QCEW file."""
    from gedp.evaluation.synthetic_states import write_synthetic_state

    with reported_errors():
        written = write_synthetic_state(out, profile=profile, from_qcew=from_qcew, seed=seed, within_cell=within_cell,
                                        establishments=establishments, fit_profile_to=fit_profile_to, jobs=jobs,
                                        state=state, quarters=quarters)
    if from_qcew is not None:
        _print_validation(written.summary)
    _print_synthesis(written, out, quarters is not None)


@app.command(name="plan")
def plan_command(from_qcew: PlanFromQcew, out: PlanOut, mu_total: MuTotal = None, quarters: PlanQuarters = 1,
                 targets: Targets = "", base: Base = "baseline", weights: Weights = "") -> None:
    """Choose a budget plan from a published QCEW file alone.

    A stand-in state is synthesized from the published file, plan shapes are scored by their
    predicted errors on it (calibrated by simulated releases of the stand-in), and the best is
    written as a config."""
    from gedp.planning.plan_request import plan_from_text

    start = time.perf_counter()
    with reported_errors():
        result = plan_from_text(from_qcew, out, mu_total=mu_total, quarters=quarters, targets=targets, base=base,
                                weights=weights, progress=progress_steps)
    _print_plan(result, base, out, quarters, time.perf_counter() - start)


@app.command(name="protect")
def protect_command(
    input: Input, config: ConfigName = DEFAULT_CONFIG, out: Out = Path("gedp-release"), jobs: JobTable = None,
    seed: Seed = None, rng: Rng = None, not_for_publication: NotForPublication = False, workflow: Workflow = None,
    integer: Integer = None, engine: Engine = "local", scheduler: Scheduler = None, processes: Processes = None,
    tls_ca_file: TlsCaFile = None, tls_cert: TlsCert = None, tls_key: TlsKey = None,
    insecure_scheduler: InsecureScheduler = False, ledger: Ledger = None, lifetime_cap: LifetimeCap = None,
    dataset_id: DatasetId = None, annual_cap: AnnualCap = None, allow_large_mu: AllowLargeMu = False,
    allow_over_cap: AllowOverCap = False, columns: Columns = None, pad_codes: PadCodes = False,
) -> None:
    """Protect confidential establishment microdata, state by state: protected microdata, tables, manifest.

    An input of several quarters (a panel) is protected quarter by quarter into one panel release
    (with --ledger, reserved as one release of all its quarters)."""
    import gedp.options as runs
    from gedp.running.file_protection import protect_file  # the input is checked before numpy is imported
    from gedp.synth.intake import parse_columns

    start = time.perf_counter()
    with reported_errors(), progress_steps(None) as advance:
        manifest, reservation = protect_file(
            input, config, out, reading=runs.Input(parse_columns(columns), pad_codes, jobs),
            engine=runs.Engine(engine, scheduler, runs.TlsFiles(tls_ca_file, tls_cert, tls_key), insecure_scheduler,
                               processes),
            ledger=runs.Ledger.from_flags(ledger, lifetime_cap, annual_cap, dataset_id), seed=seed, rng=rng,
            not_for_publication=not_for_publication, workflow=workflow, integer=integer, allow_large_mu=allow_large_mu,
            allow_over_cap=allow_over_cap, on_note=lambda note: typer.echo(f"note: {note}", err=True), on_step=advance)
    try:
        _print_release_summary(manifest, out.resolve(), time.perf_counter() - start)
        _print_quarters_and_budget(manifest, reservation)
    except KeyboardInterrupt as stop:  # the release is published (and charged): a bare "stopped" line had said
        # what a stop that published nothing says, and a script retrying on it charged the ledger again (rt25 F1)
        from gedp.running.recorded_release import stop_note

        stop.add_note(stop_note(reservation, out.resolve(), [out.resolve()]))
        raise


def _print_release_summary(manifest: dict, out: Path, seconds: float) -> None:
    from gedp.measure.conversions import stated_guarantee

    states = manifest["states"]
    console.print(f"[bold]Release written to[/] {plain(out)}")
    console.print(
        f"  {manifest['establishments']:,} establishments in {len(states)} state{'s' if len(states) > 1 else ''}, "
        f"workflow {manifest['workflow']}, psi {manifest['psi']['name']}, zeta {manifest['zeta']}"
    )
    spent = ", ".join(f"{a} {g['mu']:.4f}" for a, g in manifest["privacy"]["attributes"].items())
    console.print(f"  privacy budget: total {stated_guarantee(manifest['mu_total'])} for psi-neighbours; per "
                  f"attribute mu {spent}")
    solvers = ", ".join(f"{a} {r['status']}" for a, r in manifest["solver"].items())
    console.print(f"  postprocessing ({manifest['variance_mode']} variances): {solvers}")
    if manifest.get("integer"):
        reports = [piece["rounding"] for piece in manifest["per_state"].values()]
        changes = ", ".join(
            f"{a} {sum(r[a]['establishments_rounded_up'] for r in reports):,} up / "
            f"{sum(r[a]['establishments_rounded_down'] for r in reports):,} down" for a in reports[0])
        console.print(f"  whole numbers by controlled rounding (every QCEW cell within 1 of its unrounded total): "
                      f"{changes}")
    # whole seconds only: finer timings could reflect confidential values (e.g. a slower exact sum)
    console.print(f"  run time about {max(1, round(seconds))} s")


def _print_accuracy(done: SyntheticRun) -> None:
    from gedp.evaluation.synthetic_states import DEFAULT_STATE_SEED

    console.print(f"  input: synthetic profile '{done.profile}' (seed {DEFAULT_STATE_SEED}), so accuracy can be shown:")
    table = Table("tabulation", "groups", *done.attributes, title="median relative error |x~ - x| / (x + 1)")
    for label, by_attribute in done.accuracy.items():
        first = next(iter(by_attribute.values()))
        table.add_row(label, f"{first['groups']:,}", *[f"{s['median_relative']:.2%}" for s in by_attribute.values()])
    console.print(table)


def _print_validation(report: dict) -> None:
    table = Table("agglvl", "cells", "published", "suppressed", "max |synthetic - published|",
                  "median estabs", "median m1emp", "median wages", title="synthetic versus published cells")
    for level, row in report["levels"].items():
        per_cell = row["per_cell"]
        table.add_row(level, f"{row['cells']:,}", f"{row['published']:,}", f"{row['suppressed']:,}",
                      f"{max(row['max_abs_difference'].values()):g}", f"{per_cell['establishments']['median']:g}",
                      f"{per_cell['employment_m1']['median']:g}", f"{per_cell['wages']['median']:,.0f}")
    console.print(table)
    share = report["top1_share_m1emp_cells_5plus"]
    console.print(f"  largest establishment's share of its cell's employment (cells with 5+): median "
                  f"{share['median']:.2f}, "
                  f"p90 {share['p90']:.2f} over {share['cells']:,} cells")
    if report["rounded_to_whole_numbers"]:
        console.print(f"  fractional published values of {', '.join(report['rounded_to_whole_numbers'])} were rounded "
                      f"to whole numbers (controlled rounding: every total still the sum of its parts)")
    verdict = "[green]every published cell reproduced exactly[/]" if report["exact"] else "[red]NOT exact[/]"
    console.print(f"  {report['establishments']:,} establishments; {verdict}; negative values: "
                  f"{report['negative_values']}")


def _print_synthesis(written: SyntheticState, out: Path, panel: bool) -> None:
    microdata = written.microdata
    jobs = "" if written.jobs_file is None else f" and {written.jobs:,} jobs to {written.jobs_file.name}"
    rows = (f"{len(microdata):,} rows ({microdata['estab_id'].nunique():,} establishments in "
            f"{microdata[['year', 'qtr']].drop_duplicates().shape[0]} quarters)" if panel
            else f"{len(microdata):,} establishments")
    console.print(f"Wrote {rows} to {plain(out)}{plain(jobs)} and {plain(written.sidecar.name)} in "
                  f"{written.summary['seconds']:.1f}s")


def _print_plan(result: PlanResult, base: str, out: Path, quarters: int, seconds: float) -> None:
    from gedp.planning.candidates import REFERENCE
    from gedp.planning.output import acceptance_lines, comparison_rows, output_paths, reference_lines

    table = Table("level", "cells", "attribute", "plan", base, REFERENCE, title="Predicted median relative error, "
                  "published cells (cells: the level's weight, - not a target)")
    for row in comparison_rows(result):
        table.add_row(*row)
    console.print(table)
    console.print(" ".join(acceptance_lines(result) + reference_lines(result)))
    json_path, plot_path = output_paths(out)
    console.print(f"[bold]plan[/] {result.chosen.shape.describe()}; wages {result.chosen.wage_share:.0%} of mu^2, "
                  f"total mu {result.mu_total:.4f}" + (f" per quarter (mu {result.mu_annual:.4f} over {quarters} "
                                                        "quarters)" if quarters > 1 else ""))
    console.print(f"  written to {printable(out)} ({plain(json_path.name)}, {plain(plot_path.name)}) in {seconds:.0f}s")


def _print_quarters_and_budget(manifest: dict, reservation: Any) -> None:
    """The lines of a protect summary on a panel's quarters and on the lifetime ledger's charge."""
    if "quarters" in manifest:
        beyond = (f", over the config's mu_cap {manifest['mu_cap']:.4f} ({manifest['over_cap']})"
                  if "over_cap" in manifest else "")
        console.print(f"  quarters {', '.join(manifest['quarters'])} ({manifest['design']['name']}): each quarter mu "
                      f"{manifest['mu_quarter']:.4f}; the total above is an establishment's in every quarter{beyond}")
    if reservation is None:
        return
    console.print(f"  lifetime budget: this release charged mu {reservation.largest_charge:.4f} in the accounts' "
                  f"terms (mu {reservation.mu:.4f} for each quarter an establishment is in); its "
                  f"most spent establishments are at mu {reservation.spent_after:.4f} of {reservation.cap:.4f} "
                  f"(release {reservation.release_id} committed in the ledger)")
    if reservation.annual_cap is not None:
        console.print(f"  annual budget: the most spent year of an establishment is at mu "
                      f"{reservation.annual_spent_after:.4f} of {reservation.annual_cap:.4f}")
