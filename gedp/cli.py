"""The gedp command line: run, protect, tabulate, interval.

Input errors (bad data, bad config, over-budget plans) print one line and exit with status 2,
leaving no output behind; a solver that fails to reach an optimum exits with status 1.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.table import Column, Table
from rich.text import Text
from typer.core import TyperOption

import gedp
from gedp.configs import DEFAULT_CONFIG
from gedp.errors import AuditError, GedpError, InputError, InputProblems, SolverError
from gedp.running.process import end_process, exit_status, set_up_command_memory, stop_on_sigterm
from gedp.tabulation.output_files import check_output_file, write_atomically

# `gedp --help` and `gedp --version` start in well under a second: numpy, pandas, scipy, cvxpy,
# matplotlib and the stage packages (which import them) are imported inside the commands that use
# them. tests/test_cli.py times both and checks that importing gedp.cli loads none of them.
if TYPE_CHECKING:
    import pandas as pd

    from gedp.config import Config
    from gedp.synth.qcew import PublishedState
    from gedp.tabulation.request import Tabulation

try:  # typer >= 0.20 carries its own copy of click
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover
    from click import exceptions as click_errors

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Gaussian Establishment DP: protected, consistent establishment microdata with stated error.",
)
#: Width of output that is not on a terminal: wide enough that no table is cut to fit.
UNWRAPPED_WIDTH = 10_000


def _console(*, stderr: bool = False) -> Console:
    """A terminal wraps to its width; a pipe, file or log gets every line whole (rich would wrap it
    at 80 columns and split log lines): soft wrapping, and tables as wide as their content."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, soft_wrap=True, width=UNWRAPPED_WIDTH)


console = _console()
errors = _console(stderr=True)


def _flag_type(option: TyperOption, ctx) -> Optional[str]:
    """No type column for flags: typer 0.29 labels every flag (--help, --moe, ...) ``<bool>``,
    though a flag takes no value; options that take one keep their type."""
    return None if option.is_flag else _option_type(option, ctx)


_option_type = TyperOption.display_type_rich
TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"gedp {gedp.__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print gedp's version and exit.")] = False,
) -> None:
    pass

#: Option defaults of commands whose implementations are imported only when they run (written out
#: so that `gedp --help` imports none of them; tests/test_cli.py checks each against its source:
#: gedp.synth.profiles.DEFAULT_PROFILE, E3Setup, E5Setup and SuppressionRule).
DEFAULT_PROFILE = "small"
E3_DEFAULTS = {"counties": 100, "per_county": 2, "employees": 10.0, "gamma_sqrt": 0.5, "gamma_log": 0.1, "mu": 1.0}
E5_DEFAULTS = {"infusion_s": 0.05, "infusion_t": 0.15, "delta": 1e-3}
SUPPRESSION_DEFAULTS = {"p": 10.0, "min_estabs": 3, "attributes": ("m1emp", "wage")}


def available_profiles() -> list[str]:
    """Names of the built-in profiles (the JSON files of gedp.synth's profiles folder), found
    without importing gedp.synth."""
    spec = importlib.util.find_spec("gedp.synth")
    folders = spec.submodule_search_locations if spec is not None else None
    return sorted({p.stem for folder in folders or () for p in (Path(folder) / "profiles").glob("*.json")})


#: Seed of the synthetic input of `gedp run` (the data; the noise has its own --seed).
DEFAULT_STATE_SEED = 2016
#: Tabulations whose accuracy `gedp run` reports (its input is synthetic, so truth may be shown).
ACCURACY_CHECKS = {
    "state total": ["state"],
    "county": ["state", "county"],
    "state x NAICS-5": ["state", "naics5"],
    "county x NAICS-5": ["state", "county", "naics5"],
    "county x NAICS-6 (unmeasured)": ["state", "county", "naics"],
}


@contextmanager
def reported_errors():
    """Turn every gedp error into one line on stderr: exit status 1 when the computation failed
    (solver, audit LP), 2 when an input, config, budget or path was refused (gedp.errors)."""
    try:
        yield
    except (SolverError, AuditError) as err:
        kind = "solver" if isinstance(err, SolverError) else "audit"
        typer.echo(f"{kind} error: {_one_line(err)}", err=True)
        raise typer.Exit(1) from None
    except InputProblems as err:  # every problem of an input, one per line
        typer.echo("\n".join([f"error: {_one_line(err.subject)} has:", *(f"  - {_one_line(p)}" for p in err.problems)]),
                   err=True)
        raise typer.Exit(2) from None
    except GedpError as err:
        typer.echo(f"error: {_one_line(err)}", err=True)
        raise typer.Exit(2) from None


#: Characters that end a line (str.splitlines): escaped in error messages, which stay on one line.
LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def _one_line(err: Exception) -> str:
    """The message on one line: line breaks from user text (keys, values) shown escaped."""
    return "".join(c.encode("unicode_escape").decode() if c in LINE_BREAKS else c for c in str(err))


class StepsColumn(ProgressColumn):
    """The steps done, out of the total when it is known ("3/12"), else alone ("3"; the bar then
    moves to and fro: rich's indeterminate bar)."""

    def render(self, task: Task) -> Text:
        done = f"{task.completed:,.0f}"
        return Text(done if task.total is None else f"{done}/{task.total:,.0f}")


def _progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description:<28}"), BarColumn(), StepsColumn(),
        TimeElapsedColumn(), console=errors, transient=True, disable=not errors.is_terminal,
    )


@contextmanager
def progress_steps(total: int | None):
    """A progress bar on stderr (of ``total`` steps, or counting without an end); yields the callback
    that advances it by one named step."""
    with _progress_bar() as progress:
        task = progress.add_task("measuring", total=total)

        def advance(description: str) -> None:
            progress.update(task, advance=1, description=description)

        yield advance


@contextmanager
def progress_counts(description: str):
    """A progress bar on stderr; yields callbacks ``(done, total)`` for the bar and ``(message)``,
    which prints a line above it and names the next phase."""
    with _progress_bar() as progress:
        task = progress.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        def say(message: str) -> None:
            progress.console.print(f"  {message}")
            progress.update(task, completed=0, total=None, description=description)

        yield update, say


def _load(config_name: str, workflow: Optional[str], integer: Optional[bool] = None,
          allow_large_mu: bool = False) -> Config:
    """A config by name or path, with the command's --workflow, --integer and --allow-large-mu."""
    from gedp.api import load

    config = load(config_name, workflow, allow_large_mu)
    return config if integer is None else config.with_integer(integer)


def _print_release_summary(manifest: dict, out: Path, seconds: float) -> None:
    states = manifest["states"]
    console.print(f"[bold]Release written to[/] {out}")
    console.print(
        f"  {manifest['establishments']:,} establishments in {len(states)} state{'s' if len(states) > 1 else ''}, "
        f"workflow {manifest['workflow']}, psi {manifest['psi']['name']}, zeta {manifest['zeta']}"
    )
    from gedp.measure.conversions import stated_guarantee

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


def _accuracy(truth: pd.DataFrame, release: Path, config: Config) -> dict:
    """Error summaries of the release's tabulations against the synthetic truth (``gedp run`` only)."""
    import pandas as pd

    from gedp.evaluation.compare import compare_tabulations, error_summary
    from gedp.release.format import PROTECTED_FILE

    protected = pd.read_parquet(release / PROTECTED_FILE)
    return {label: {attribute: error_summary(compare_tabulations(truth, protected, by, attribute))
                    for attribute in config.attributes}
            for label, by in ACCURACY_CHECKS.items()}


@app.command()
def run(
    out: Annotated[Path, typer.Option(help="Release directory to write.")] = Path("gedp-release"),
    config: Annotated[str, typer.Option(help="Config file or shipped config name.")] = DEFAULT_CONFIG,
    seed: Annotated[Optional[int], typer.Option(help="Noise seed for a reproducible PCG64 stream "
                                                     "(experiments).")] = None,
    rng: Annotated[Optional[str], typer.Option(help="secure (ChaCha20 keyed from the OS; the default without --seed) "
                                                    "or pcg64.")] = None,
    workflow: Annotated[Optional[str], typer.Option(help="Override the config's workflow: pnc or psi.")] = None,
    profile: Annotated[str, typer.Option(help=f"Built-in state profile "
                                              f"({', '.join(available_profiles())}).")] = DEFAULT_PROFILE,
    establishments: Annotated[Optional[int], typer.Option(help="Rescale the profile to this many "
                                                               "establishments.")] = None,
) -> None:
    """Protect a synthetic state (the small profile by default) and report accuracy against its truth."""
    import numpy as np

    from gedp.release.format import ACCURACY_FILE
    from gedp.release.writer import check_output_directory
    from gedp.running.engine import protect_input
    from gedp.synth.profiles import generate_profile, load_profile
    from gedp.synth.schema import CONFIDENTIAL

    start = time.perf_counter()
    with reported_errors():
        cfg = _load(config, workflow)
        check_output_directory(out.resolve())
        spec = load_profile(profile)
        truth = generate_profile(spec, n_establishments=establishments, rng=np.random.default_rng(DEFAULT_STATE_SEED))
        truth = truth.drop(columns=[c for c in CONFIDENTIAL if c not in cfg.attributes])
        jobs = None
        if cfg.jobs is not None:
            from gedp.synth.jobs import synthesize_jobs

            jobs = synthesize_jobs(truth, rng=np.random.default_rng(DEFAULT_STATE_SEED))
        with progress_steps(1) as advance:
            manifest = protect_input(truth, cfg, out, seed=seed, rng=rng, jobs=jobs,
                                     on_state=lambda state: advance(f"state {state} done"),
                                     extra_files=lambda staging: {ACCURACY_FILE: _accuracy(truth, staging, cfg)})
        written = out.resolve()
    _print_release_summary(manifest, written, time.perf_counter() - start)
    accuracy = json.loads((written / ACCURACY_FILE).read_text())
    console.print(f"  input: synthetic profile '{spec['name']}' (seed {DEFAULT_STATE_SEED}), so accuracy can be shown:")
    table = Table("tabulation", "groups", *cfg.attributes, title="median relative error |x~ - x| / (x + 1)")
    for label, by_attribute in accuracy.items():
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


def _synthesized(profile: Optional[str], from_qcew: Optional[Path], within_cell: str, establishments: Optional[int],
                 seed: int, rng, state: Optional[str] = None) -> tuple[pd.DataFrame, dict, Optional[PublishedState]]:
    """A synthetic state from a profile or fitted to a QCEW file, its summary, and the published
    QCEW it was fitted to (None for a profile)."""
    from gedp.synth.establishments import synthesize_state
    from gedp.synth.profiles import generate_profile, load_profile
    from gedp.synth.qcew import read_qcew
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


@app.command()
def synth(
    out: Annotated[Path, typer.Option(help="Microdata file to write (.parquet or .csv).")],
    profile: Annotated[Optional[str], typer.Option(help=f"Built-in profile ({', '.join(available_profiles())}) or "
                                                        "profile JSON.")] = None,
    from_qcew: Annotated[Optional[Path], typer.Option(help="BLS QCEW by-area CSV of one state and quarter, or a folder "
                                                           "of per-area CSVs (statewide and county files).")] = None,
    seed: Annotated[int, typer.Option(help="Random seed of the synthesis.")] = 1,
    within_cell: Annotated[str, typer.Option(help="Within-cell sizes: realistic (skewed) or paper (source "
                                                  "rule).")] = "realistic",
    establishments: Annotated[Optional[int], typer.Option(help="With --profile: rescale to this many "
                                                               "establishments.")] = None,
    fit_profile_to: Annotated[Optional[Path], typer.Option("--fit-profile", help="With --from-qcew: also write a "
                                                                                 "profile JSON.")] = None,
    jobs: Annotated[bool, typer.Option("--jobs", help="Also write a synthetic job table, one job per month-1 "
                                                      "employee, to OUT.jobs.parquet (or .csv).")] = False,
    state: Annotated[Optional[str], typer.Option(help="With --from-qcew: the state (2-digit FIPS) to take from a "
                                                      "file of several states.")] = None,
    quarters: Annotated[Optional[str], typer.Option(help="FIRST:LAST, e.g. 2016Q1:2017Q1: a panel of these "
                                                         "quarters grown from the synthetic first quarter by public "
                                                         "business dynamics.")] = None,
) -> None:
    """Write a synthetic state: from a built-in profile, or fitted to a published QCEW file."""
    import numpy as np

    from gedp.release.writer import check_output_path
    from gedp.synth.establishments import WITHIN_CELL_MODES
    from gedp.synth.io import write_microdata
    from gedp.synth.jobs import synthesize_jobs
    from gedp.synth.profiles import fit_profile

    start = time.perf_counter()
    with reported_errors():
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
        if jobs:
            job_table = synthesize_jobs(microdata, rng=rng)
            jobs_out = out.with_name(f"{out.stem}.jobs{out.suffix}")
            summary["jobs"] = {"file": jobs_out.name, "jobs": len(job_table), "shares": "illustrative"}
        summary["seconds"] = time.perf_counter() - start
        write_atomically(out, lambda path: write_microdata(microdata, path))
        if jobs:
            write_atomically(jobs_out, lambda path: write_microdata(job_table, path))
        sidecar = out.with_name(out.stem + (".validation.json" if from_qcew else ".summary.json"))
        write_atomically(sidecar, lambda path: path.write_text(json.dumps(summary, indent=2) + "\n"))
        if fit_profile_to is not None and from_qcew is not None:
            fitted = fit_profile(published, microdata, name=fit_profile_to.stem,
                                 description=f"Fitted to {from_qcew.name} (gedp synth --from-qcew, {within_cell}, seed "
                                             f"{seed})")
            write_atomically(fit_profile_to, lambda path: path.write_text(json.dumps(fitted, indent=1) + "\n"))
    if from_qcew is not None:
        _print_validation(summary)
    written = f" and {len(job_table):,} jobs to {jobs_out.name}" if jobs else ""
    rows = (f"{len(microdata):,} rows ({microdata['estab_id'].nunique():,} establishments in "
            f"{microdata[['year', 'qtr']].drop_duplicates().shape[0]} quarters)" if quarters is not None
            else f"{len(microdata):,} establishments")
    console.print(f"Wrote {rows} to {out}{written} and {sidecar.name} in {summary['seconds']:.1f}s")


@app.command(name="plan")
def plan_command(
    from_qcew: Annotated[Path, typer.Option(help="The state's published BLS QCEW file (last year's or last "
                                                 "quarter's): the plan reads nothing else.")],
    out: Annotated[Path, typer.Option(help="Plan YAML to write (a config for gedp protect --config); its "
                                           "summary JSON and frontier plot are written beside it.")],
    mu_total: Annotated[Optional[float], typer.Option(help="Total mu (default: the base config's); with "
                                                           "--quarters, the budget of all the quarters.")] = None,
    quarters: Annotated[int, typer.Option(help="Quarters the budget covers (4: an annual budget); each "
                                               "quarter's plan gets mu / sqrt(quarters).")] = 1,
    targets: Annotated[str, typer.Option(help="QCEW levels the plan is judged on, comma-separated (default: "
                                              "every level the published file has).")] = "",
    base: Annotated[str, typer.Option(help="Config whose psi, gammas, zeta and options the plan keeps.")] =
        "baseline",
    weights: Annotated[str, typer.Option(help="Weights of employment and wages in the objective (default "
                                              "employment=1,wage=1, and never worse than recommended on the levels "
                                              "that carry most cells).")] = "",
) -> None:
    """Choose a budget plan from a published QCEW file alone.

    A stand-in state is synthesized from the published file, plan shapes are scored by their
    predicted errors on it (calibrated by simulated releases of the stand-in), and the best is
    written as a config."""
    from gedp.planning.candidates import REFERENCE
    from gedp.planning.output import acceptance_lines, comparison_rows, output_paths, reference_lines
    from gedp.planning.search import search_steps

    start = time.perf_counter()
    with reported_errors():
        check_output_file(out)
        levels = _numbers(targets, "--targets", int)
        weight_map = {key.strip(): _numbers(value, "--weights", float)[0]
                      for key, value in (_pair(item, "--weights") for item in weights.split(",") if item.strip())}
        with progress_steps(search_steps()) as advance:
            result = gedp.plan(from_qcew, out, mu_total=mu_total, targets=levels or None, base=base,
                               weights=weight_map or None, on_step=advance, quarters=quarters)
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
    console.print(f"  written to {out} ({json_path.name}, {plot_path.name}) in {time.perf_counter() - start:.0f}s")


def _numbers(text: str, option: str, kind: type) -> list:
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"{option} ({text}) must be comma-separated numbers") from None


def _pair(item: str, option: str) -> tuple[str, str]:
    if "=" not in item:
        raise InputError(f"{option} item '{item}' must be NAME=NUMBER")
    key, value = item.split("=", 1)
    return key, value


@app.command(name="protect")
def protect_command(
    input: Annotated[Path, typer.Argument(help="Establishment microdata: .csv, .parquet, or a folder of Parquet "
                                               "parts.")],
    config: Annotated[str, typer.Option(help="Config file or shipped config name.")] = DEFAULT_CONFIG,
    out: Annotated[Path, typer.Option(help="Release directory to write.")] = Path("gedp-release"),
    jobs: Annotated[Optional[Path], typer.Option(help="Job table (one row per job: estab_id and QWI worker codes) "
                                                      "for a config with job families, e.g. --config jobs.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Noise seed for a reproducible PCG64 stream; needs "
                                                     "--not-for-publication.")] = None,
    rng: Annotated[Optional[str], typer.Option(help="secure (ChaCha20 keyed from the OS; the default) or pcg64 "
                                                    "(needs --not-for-publication).")] = None,
    not_for_publication: Annotated[bool, typer.Option("--not-for-publication",
                                                      help="Allow --seed / --rng pcg64: the release is marked "
                                                           "\"publishable\": false and no ledger records it.")] = False,
    workflow: Annotated[Optional[str], typer.Option(help="Override the config's workflow: pnc or psi.")] = None,
    integer: Annotated[Optional[bool], typer.Option("--integer/--no-integer",
                                                    help="Round the release to whole employees and dollars by "
                                                         "controlled rounding (default: the config's 'integer', "
                                                         "false in the shipped ones).")] = None,
    engine: Annotated[str, typer.Option(help="local, or dask: one task per state on a dask.distributed "
                                             "cluster.")] = "local",
    scheduler: Annotated[Optional[str], typer.Option(help="With --engine dask: tls:// address of an existing "
                                                          "scheduler (default: a local cluster of 2 workers, "
                                                          "loopback only, TLS with keys made for the run).")] = None,
    processes: Annotated[Optional[int], typer.Option(help="With the local engine: worker processes, each protecting "
                                                          "one state at a time (default: one per usable CPU; 1: "
                                                          "the states one after the other).")] = None,
    tls_ca_file: Annotated[Optional[Path], typer.Option(help="With --scheduler: the CA certificate of the "
                                                             "cluster (PEM).")] = None,
    tls_cert: Annotated[Optional[Path], typer.Option(help="With --scheduler: this client's certificate "
                                                          "(PEM).")] = None,
    tls_key: Annotated[Optional[Path], typer.Option(help="With --scheduler: this client's private key (PEM), "
                                                         "unless the certificate's file holds it.")] = None,
    insecure_scheduler: Annotated[bool, typer.Option("--insecure-scheduler",
                                                     help="Accept a scheduler without TLS credentials (e.g. "
                                                          "tcp://): anyone who reaches it can read the "
                                                          "input.")] = False,
    ledger: Annotated[Optional[Path], typer.Option(help="Lifetime budget ledger (NAME.json in an existing "
                                                       "folder): charge every establishment's account and "
                                                       "refuse what exceeds its cap.")] = None,
    lifetime_cap: Annotated[Optional[float], typer.Option(help="With --ledger: the lifetime mu cap of "
                                                               "establishments new to the ledger, in "
                                                               "(0, 100].")] = None,
    dataset_id: Annotated[Optional[str], typer.Option(help="With --ledger: name the dataset, recalling the "
                                                           "cap recorded under that name (e.g. the next "
                                                           "quarter).")] = None,
    annual_cap: Annotated[Optional[float], typer.Option(help="With --ledger: the mu cap of any 4 consecutive "
                                                             "quarters (by the input's year and qtr) of "
                                                             "establishments new to the ledger.")] = None,
    allow_large_mu: Annotated[bool, typer.Option("--allow-large-mu",
                                                 help="Accept a query mu above 2 (refused by default: a typo such "
                                                      "as 70 for 0.70 releases nearly exact values).")] = False,
    allow_over_cap: Annotated[bool, typer.Option("--allow-over-cap",
                                                 help="Protect a panel whose quarters together spend more than the "
                                                      "config's mu_cap (refused by default: sqrt(quarters) x a "
                                                      "quarter's mu).")] = False,
    columns: Annotated[Optional[str], typer.Option(help="Column names of the input: STORED=GEDP,... (e.g. "
                                                        "ruid=estab_id), beyond the names gedp knows.")] = None,
    pad_codes: Annotated[bool, typer.Option("--pad-codes", help="Zero-pad state, county, NAICS and own codes that "
                                                                "lost their leading zeros (county 1 -> 001).")] = False,
) -> None:
    """Protect confidential establishment microdata, state by state: protected microdata, tables, manifest.

    An input of several quarters (a panel) is protected quarter by quarter into one panel release
    (with --ledger, reserved as one release of all its quarters)."""
    from gedp.synth.intake import configured_attributes, inspect_input, load_input, parse_columns

    start = time.perf_counter()
    with reported_errors():  # the input is checked first, before the numerical stack is imported
        intake = inspect_input(input, columns=parse_columns(columns), pad_codes=pad_codes,
                               attributes=configured_attributes(config))
        for note in intake.notes:
            typer.echo(f"note: {note}", err=True)
        if engine == "local" and intake.parquet and not intake.needs_translation():
            from gedp.synth.prefetch import prefetch_input

            prefetch_input(intake.path)  # read on a thread while the numerical stack is imported
        from gedp.running.state_pool import early_workers  # started while the input is checked and read

        with early_workers(intake.path, processes if engine == "local" else 1):
            from gedp.measure.rng import check_publication
            from gedp.running.engine import scheduler_access, tls_credentials
            from gedp.running.recorded_release import ledger_request

            check_publication(seed, rng, not_for_publication)
            access = scheduler_access(scheduler, tls_credentials(tls_ca_file, tls_cert, tls_key), insecure_scheduler)
            request = ledger_request(ledger, lifetime_cap, dataset_id, not_for_publication, annual_cap)
            cfg = _load(config, workflow, integer, allow_large_mu)
            with progress_steps(None) as advance:
                manifest, reservation = _protected(load_input(intake), cfg, out, request, jobs, advance, seed=seed,
                                                   rng=rng, engine=engine, scheduler=access, processes=processes,
                                                   allow_over_cap=allow_over_cap)
    _print_release_summary(manifest, out.resolve(), time.perf_counter() - start)
    _print_quarters_and_budget(manifest, reservation)


def _protected(source: Any, cfg: Any, out: Path, request: Any, jobs: Optional[Path], advance: Callable[[str], None],
               allow_over_cap: bool = False, **options: Any) -> tuple[dict, Any]:
    """Protect a checked input: a panel (several quarters) into one panel release, else state by
    state as one release; returns the manifest and the ledger reservation (None without a ledger)."""
    from gedp.running.panel_protect import is_panel, protect_panel
    from gedp.running.recorded_release import protect_recorded

    if is_panel(source):  # several quarters: one panel release
        if jobs is not None:
            raise InputError("--jobs goes with a release of one quarter, not a panel")
        return protect_panel(source, cfg, out, ledger=request, allow_over_cap=allow_over_cap,
                             on_quarter=lambda quarter: advance(f"quarter {quarter} done"), **options)
    return protect_recorded(source, cfg, out, ledger=request, jobs=jobs,
                            on_state=lambda state: advance(f"state {state} done"), **options)


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


ledger_app = typer.Typer(no_args_is_help=True, help="Inspect the lifetime budget ledger and clear pending releases.")
app.add_typer(ledger_app, name="ledger")


@ledger_app.command(name="show")
def ledger_show(
    ledger: Annotated[Path, typer.Option(help="The lifetime budget ledger.")],
) -> None:
    """Print every release of a ledger (its dataset, cap, charge and status).

    Then the accounts' psi and gammas, the most spent account and the head of the ledger's chain."""
    from gedp.accounting.ledger_file import CLEARED, PENDING, check_ledger_path, live, read_ledger
    from gedp.accounting.ledger_spending import largest_spending, release_charge

    with reported_errors():
        path = check_ledger_path(ledger)
        book = read_ledger(path)
        most, cap = largest_spending(ledger, book)
    releases = Table(Column("dataset", overflow="fold"), *(Column(c, no_wrap=True) for c in (
        "release", "status", "cap", "charge mu", "establishments", "date (UTC)")), Column("quarters", overflow="fold"),
        Column("config", overflow="fold"),
        title=f"ledger {ledger}")
    for r in book["releases"].values():
        status = f"[red]{r['status']}[/]" if r["status"] == PENDING else r["status"]
        annual = "" if r.get("annual_cap") is None else f", {r['annual_cap']:.4f} a year"
        quarters = ", ".join(q for q, _ in r.get("quarters", []) if q is not None) or "-"
        releases.add_row(r["dataset_id"] or "-", r["id"], status, f"{r['lifetime_cap']:.4f}{annual}",
                         _charge(None if r["status"] == CLEARED else release_charge(path, r), r),
                         f"{r['establishments']:,}", r["date_utc"][:16].replace("T", " "), quarters, r["config"])
    console.print(releases)
    counting = live(book)
    if counting:
        console.print(f"accounts: psi {counting[0]['psi']}, gammas "
                      f"{dict(kv for r in reversed(counting) for kv in r['gammas'].items())}; "
                      f"the most spent establishment is at mu {most:.4f} of its cap {cap:.4f}")
    console.print(f"Each establishment's spending composes the charges of every pending or committed release that "
                  f"includes it, once per quarter it is in, as sqrt(sum of mu^2); {CLEARED} releases do not count. "
                  f"Head of the ledger's chain: "
                  f"{book['head']} (keep it elsewhere: a ledger rewritten from an earlier head is not detected).")


@ledger_app.command(name="clear")
def ledger_clear(
    ledger: Annotated[Path, typer.Option(help="The lifetime budget ledger.")],
    release: Annotated[str, typer.Option(help="Id of the pending release to clear (see gedp ledger show).")],
) -> None:
    """Clear a pending release (a run that failed or was killed before publishing): its mu stops counting.

    Clear only a release you know was not published; committed releases cannot be cleared. A run
    killed before its commit leaves hidden staging folders beside its --out without a manifest: no
    gedp reader takes them for a release, and the next run writing that --out removes them."""
    from gedp.accounting.ledger import clear

    with reported_errors():
        entry = clear(ledger, release)
    console.print(f"Cleared pending release {entry['id']} (charge mu {_charge(entry['charge'], entry)}, reserved "
                  f"{entry['date_utc']}): it no longer counts against its establishments' caps.")


def _charge(charge: float | None, release: dict) -> str:
    """A ledger release's charge as ``gedp protect`` states it: its largest charge to one establishment
    (``ledger.release_charge``; None: not known, the key file of a cleared release is gone) and, for a
    release of several quarters, its charge per quarter an establishment is in."""
    if len(release.get("quarters") or []) <= 1:
        return f"{release['mu']:.4f}"
    per_quarter = f"{release['mu']:.4f} a quarter"
    return per_quarter if charge is None else f"{charge:.4f} ({per_quarter})"


#: Rows shown on a terminal; a pipe or --out gets the whole table as CSV.
SHOWN_ROWS = 25


@app.command(name="tabulate")
def tabulate_command(
    microdata: Annotated[Path, typer.Argument(help="A release directory or a microdata file.")],
    by: Annotated[Optional[str], typer.Option(help="Public columns, comma-separated ('total' for the total); "
                                                   "county keys always carry the state; size_class (BLS size "
                                                   "codes 1-9) is estimated over implicates.")] = None,
    agglvl: Annotated[Optional[int], typer.Option(help="A QCEW aggregation level (50-58, 70-78; 50 "
                                                       "and 70 total over ownerships) instead of --by.")] = None,
    where: Annotated[Optional[str], typer.Option(help="Keep establishments matching this filter of columns, "
                                                      "comparisons, in [..] and and/or/not (never run as code), "
                                                      "e.g. \"sector == '31-33'\".")] = None,
    moe: Annotated[bool, typer.Option("--moe", help="Add margins of error (needs a release directory).")] = False,
    level: Annotated[float, typer.Option(help="Confidence level of the margins of error.")] = 0.95,
    table_format: Annotated[Optional[str], typer.Option("--format", help="csv, parquet, qcew (a level ready to "
                                                                         "publish) or xlsx (levels and notes); default "
                                                                         "from --out.")] = None,
    titles: Annotated[Optional[Path], typer.Option(help="A published QCEW CSV whose area and industry titles "
                                                        "--format qcew/xlsx carry (default: lists shipped with gedp).")
                      ] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write the table to this file (without it: CSV on stdout when "
                                                     "piped, the first rows on a terminal).")] = None,
    quarter: Annotated[Optional[str], typer.Option(help="A panel release: the quarter tabulated, e.g. "
                                                        "2017Q1.")] = None,
    change: Annotated[Optional[str], typer.Option(help="A panel release: the change FIRST:SECOND of every cell, "
                                                       "e.g. 2016Q1:2017Q1 (<attribute>_chg, _chg_moe, "
                                                       "_pct_chg).")] = None,
    unprotected: Annotated[bool, typer.Option("--unprotected", help="Allow --format qcew or xlsx of confidential "
                                                                     "microdata (not a release): every row's "
                                                                     "disclosure_code then says NOT PROTECTED.")
                           ] = False,
    gains_losses: Annotated[Optional[str], typer.Option(help="FROM:TO quarters (e.g. 2016Q1:2016Q2) of a panel "
                                                             "release or panel microdata: gross job gains and losses "
                                                             "of month-3 employment by --by instead of levels (of a "
                                                             "release: corrected sums, and margins with --moe).")
                            ] = None,
) -> None:
    """Tabulate microdata by any public columns or a QCEW level, optionally with margins of error.

    Margins of error come from the release's weighted least squares covariance: no new privacy
    budget is spent and no confidential data is read.
    """
    from gedp.tabulation.request import TabulationRequest, tabulate_request

    with reported_errors():
        request = TabulationRequest(microdata, by=by, agglvl=agglvl, where=where, moe=moe, level=level,
                                    format=table_format, titles=titles, out=out, quarter=quarter, change=change,
                                    gains_losses=gains_losses, unprotected=unprotected)
        answer = tabulate_request(request, frame=out is None and sys.stdout.isatty())
        for said in answer.warnings:
            typer.echo(f"warning: {said}", err=True)
        if out is not None:
            answer.write()
    _show_tabulation(answer, out, request.margins_note)


def _show_written(n_rows: int, out: Optional[Path], margins: str) -> None:
    """Say where a table of ``n_rows`` rows went: ``out``, or (without it) standard output as CSV."""
    from gedp.synth.columns import count

    if out is not None:
        console.print(f"{count(n_rows, 'row')} written to {out}{margins}")
    else:
        errors.print(f"{count(n_rows, 'row')} written as CSV to standard output{margins}")


def _show_tabulation(answer: Tabulation, out: Optional[Path], margins: str) -> None:
    """Say where the table went; without --out, the whole table as CSV to a pipe, or its first rows
    to a terminal."""
    from gedp.synth.columns import count

    if out is not None or not sys.stdout.isatty():
        if out is None:
            answer.write_csv(sys.stdout)
        _show_written(answer.n_rows, out, margins)
    else:
        table = answer.frame()
        typer.echo(table.head(SHOWN_ROWS).to_string(index=False, float_format=lambda v: f"{v:,.1f}"))
        shown = (f" (the first {SHOWN_ROWS} shown; --out FILE or a pipe gives them all as CSV)"
                 if len(table) > SHOWN_ROWS else "")
        console.print(f"{count(len(table), 'row')}{shown}{margins}")


@app.command(name="serve")
def serve_command(
    releases: Annotated[list[Path], typer.Argument(help="Release directories to serve (each loaded once).")],
    host: Annotated[str, typer.Option(help="Address to listen on (loopback unless told: 0.0.0.0 exposes the server "
                                           "to the network).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: a free one, printed).")] = 8000,
    max_rows: Annotated[int, typer.Option(help="Most rows a table answered may have.")] = 100_000,
    timeout: Annotated[float, typer.Option(help="Most seconds a request may compute.")] = 30.0,
) -> None:
    """Serve releases to data users: a web page and a JSON API of tabulations with margins of error.

    The page shows tables with margins and quality flags, charts, and CSV and xlsx downloads; the
    API answers /api/tabulate, /api/releases and /api/openapi.json. Every number is the one gedp
    tabulate gives for the same request; tables are computed from the releases alone, so they spend
    no further privacy budget.
    """
    started = time.perf_counter()
    with reported_errors():
        from gedp.serve.app import Limits, create_app
        from gedp.serve.releases import load_releases

        if max_rows < 1 or not timeout > 0:
            raise InputError("--max-rows must be >= 1 and --timeout > 0")
        with errors.status("loading releases"):
            served = load_releases(releases)
        application = create_app(served, Limits(max_rows=max_rows, timeout=timeout))
        listening = _listening_socket(host, port)
    import uvicorn

    if host not in ("127.0.0.1", "localhost", "::1"):
        errors.print(f"warning: listening on {host}: anyone who can reach this address can use the server")
    port = listening.getsockname()[1]
    console.print(f"Serving {', '.join(served)} at http://{'[' + host + ']' if ':' in host else host}:{port}/ "
                  f"(loaded in {time.perf_counter() - started:.1f} s; Ctrl-C stops)", highlight=False)
    uvicorn.Server(uvicorn.Config(application, log_level="warning", access_log=False)).run(sockets=[listening])


def _listening_socket(host: str, port: int):
    """A socket bound to ``host`` and ``port`` (0: a free port), refused in one line when it cannot be."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except (OSError, OverflowError) as err:
        listening.close()
        raise InputError(f"cannot listen on {host} port {port} ({getattr(err, 'strerror', None) or err})") from None
    return listening


@app.command(name="implicates")
def implicates_command(
    release: Annotated[Path, typer.Argument(help="A release directory.")],
    out: Annotated[Path, typer.Option(help="The folder of implicates to write (one Parquet file per implicate; "
                                           "pandas.read_parquet(OUT) reads them all).")],
    n: Annotated[int, typer.Option("--n", help="Number of implicates M.")] = 10,
    seed: Annotated[Optional[int], typer.Option(help="Seed the draws (reproducible; default: the secure "
                                                     "generator).")] = None,
    quarter: Annotated[Optional[str], typer.Option(help="A panel release: the quarter drawn, e.g. 2016Q1.")] = None,
) -> None:
    """Draw M complete microdata files from the posterior of the confidential values given a release.

    Reads the release's files only, spends no privacy budget and changes nothing in the release;
    combine a statistic computed on each implicate with gedp.combine (Rubin's rules).
    """
    from gedp.release.implicates import write_implicates

    with reported_errors():
        start = time.perf_counter()
        with progress_counts("drawing implicates") as (update, say):
            write_implicates(release, n, out, seed=seed, quarter=quarter, progress=update, note=say)
    console.print(f"[bold]{n} implicates[/] written to {out} in {time.perf_counter() - start:.0f} s "
                  "(pandas.read_parquet reads them with an implicate column)")


@app.command(name="report")
def report_command(
    release: Annotated[Path, typer.Argument(help="A release directory.")],
    out: Annotated[Path, typer.Option(help="The HTML page to write (one self-contained file); its summary JSON is "
                                           "written beside it (OUT.json).")] = Path("report.html"),
    published: Annotated[Optional[Path], typer.Option(help="The agency's published QCEW file (BLS layout) of the same "
                                                           "state and quarter: the release beside its numbers and "
                                                           "its cell suppression.")] = None,
) -> None:
    """Write one self-contained HTML page a manager reads about a release.

    The privacy statement in plain words, the cells published against cell suppression, the margins
    of error, and the release beside the agency's published numbers. Reads only the release and the
    public published file, never confidential data.
    """
    with reported_errors():
        check_output_file(out)
        with errors.status(f"reporting on {release}"):
            page = gedp.report(release, published=published)
        write_atomically(out, lambda path: path.write_text(page.html, encoding="utf-8"))
        write_atomically(out.with_name(out.name + ".json"),
                          lambda path: path.write_text(json.dumps(page.summary, indent=2) + "\n"))
    console.print(f"[bold]report[/] written to {out} ({len(page.html) / 1e6:.1f} MB, one self-contained file) and "
                  f"{out.name}.json")


@app.command()
def interval(
    values: Annotated[list[float], typer.Argument(help="Values x to show I(x) for.")],
    psi: Annotated[str, typer.Option(help="sqrt, log, linear or sqrt-linear.")] = "sqrt",
    gamma: Annotated[Optional[float], typer.Option(help="Distance parameter gamma (default 0.5; 1 for "
                                                        "sqrt-linear).")] = None,
    a: Annotated[Optional[float], typer.Option(help="Offset a of sqrt(x + a) or log(x + a).")] = None,
    d: Annotated[Optional[float], typer.Option(help="Person-level bound d of linear and sqrt-linear.")] = None,
    gamma_sqrt: Annotated[Optional[float], typer.Option(help="gamma of the sqrt part of sqrt-linear.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Print the uncertainty interval I(x) of each value: how far x is hidden for this psi and gamma."""

    from gedp.api import interval as interval_of

    with reported_errors():
        params = {k: v for k, v in {"a": a, "d": d, "gamma_sqrt": gamma_sqrt}.items() if v is not None}
        table_of = interval_of(values, psi, gamma, **params)
    rows = table_of.to_dict("records")
    if as_json:
        print(json.dumps({"psi": table_of.attrs["psi"], "gamma": table_of.attrs["gamma"], "intervals": rows}, indent=2))
        return
    described = ", ".join(f"{k} {v:g}" for k, v in table_of.attrs["psi"].items() if k != "name")
    described = f" ({described})" if described else ""
    title = f"Uncertainty intervals, psi {psi}{described}, gamma {table_of.attrs['gamma']:g}"
    table = Table("x", "lower", "upper", "below x", "above x", title=title)
    for row in rows:
        below, above = (f"{sign}{row[k]:.1f}%" if math.isfinite(row[k]) else "–"
                        for sign, k in (("-", "below_pct"), ("+", "above_pct")))
        table.add_row(*(_readable(row[k]) for k in ("x", "lower", "upper")), below, above)
    console.print(table)


def _experiment_data(data: Optional[Path], from_qcew: Optional[Path], profile: str,
                     seed: int) -> tuple[pd.DataFrame, str, Optional[PublishedState]]:
    """The microdata of an experiment, its description, and the published QCEW it was fitted to (if any)."""
    import numpy as np

    from gedp.synth.establishments import synthesize_state
    from gedp.synth.intake import read_input
    from gedp.synth.profiles import generate_profile, load_profile
    from gedp.synth.qcew import read_qcew

    if data is not None and from_qcew is not None:
        raise InputError("give at most one of --data and --from-qcew")
    if data is not None:
        return read_input(data), f"file {data.name}", None
    if from_qcew is not None:
        published = read_qcew(from_qcew)
        microdata = synthesize_state(published, rng=np.random.default_rng(seed))
        return (microdata, f"synthetic state fitted to {from_qcew.name} (realistic within-cell sizes, seed {seed})",
                published)
    spec = load_profile(profile)
    return (generate_profile(spec, rng=np.random.default_rng(DEFAULT_STATE_SEED)), f"synthetic profile "
                                                                                   f"'{spec['name']}'",
            None)


def _structured(truth: pd.DataFrame, label: str, names: list[str], seed: int) -> tuple[pd.DataFrame, str]:
    """The experiment's microdata rewritten under the named structures (``gedp.synth.structures``)."""
    import numpy as np

    from gedp.synth.structures import apply_structures

    if not names:
        return truth, label
    try:
        return (apply_structures(truth, names, np.random.default_rng(seed)),
                f"{label}, rewritten under {' + '.join(names)} (seed {seed})")
    except ValueError as err:
        raise InputError(str(err)) from None


def _experiment_jobs(name: str, jobs: Path, data: Optional[Path], truth: Optional[pd.DataFrame]) -> pd.DataFrame:
    """The validated job table of --data for e6."""
    from gedp.synth.io import read_jobs

    if name != "e6" or data is None:
        raise InputError("--jobs goes with e6 and --data (the job table of that establishment file)")
    return read_jobs(jobs, truth)


def _check_counts(name: str, replications: Optional[int], trials: int, gedp_replications: Optional[int]) -> None:
    """Refuse counts of an experiment that cannot run."""
    if replications is not None and replications < 1:
        raise InputError(f"--replications ({replications}) must be >= 1")
    if trials < 2:
        raise InputError(f"--trials ({trials}) must be >= 2")
    if gedp_replications is not None and (name != "e6" or gedp_replications < 0):
        raise InputError(f"--gedp-replications ({gedp_replications}) goes with e6 and must be >= 0")


def _computed(chosen, request, name: str):
    """An experiment's result, with a progress bar (experiments that count their steps) or a status line."""
    if chosen.steps is not None:
        with progress_steps(chosen.steps(request)) as advance:
            return chosen.compute(dataclasses.replace(request, on_step=advance))
    what = f"{len(request.truth):,} establishments" if chosen.uses_data else f"{request.trials:,} trials"
    with errors.status(f"running {name} on {what}"):
        return chosen.compute(request)


@app.command()
def evaluate(
    name: Annotated[str, typer.Argument(help="e1 (employment), e2 (wages), e3 (bias), e4 (analytic), e5 (earlier "
                                             "mechanisms, noise infusion, cell suppression), e6 (employer-employee "
                                             "workloads on a job frame), accuracy (QCEW), coverage (margins of "
                                             "error), risk (disclosure risk of a release), utility (for "
                                             "microdata users).")],
    out: Annotated[Path, typer.Option(help="Folder for report.md, summary.json and the plots.")],
    replications: Annotated[Optional[int], typer.Option(help="Replications (e1: 1, e2: 34, e5: 20, e6: 20, "
                                                             "coverage: 40, accuracy: 20, utility: 5 by "
                                                             "default).")] = None,
    data: Annotated[Optional[Path], typer.Option(help="Microdata file (e1, e2, e5, e6, coverage, accuracy, utility) "
                                                      "instead of a profile.")] = None,
    from_qcew: Annotated[Optional[Path], typer.Option(help="A BLS QCEW file: evaluate on a state synthesized from "
                                                           "it.")] = None,
    profile: Annotated[str, typer.Option(help="Built-in profile for e1, e2, e5, e6, coverage, accuracy and "
                                              "utility.")] = DEFAULT_PROFILE,
    config: Annotated[Optional[str], typer.Option(help="e1, e5, coverage, accuracy, utility: config name or "
                                                       "YAML file (default employment, employment, baseline, "
                                                       "recommended, recommended: the shipped plan).")] = None,
    seed: Annotated[int, typer.Option(help="Seed; replications use independent child streams.")] = 1,
    trials: Annotated[int, typer.Option(help="e3 and e4: simulated trials.")] = 100_000,
    counties: Annotated[int, typer.Option(help="e3: counties.")] = E3_DEFAULTS["counties"],
    per_county: Annotated[int, typer.Option(help="e3: establishments per county.")] = E3_DEFAULTS["per_county"],
    employees: Annotated[float, typer.Option(help="e3: employees per establishment.")] = E3_DEFAULTS["employees"],
    gamma_sqrt: Annotated[float, typer.Option(help="e3: gamma of psi = sqrt.")] = E3_DEFAULTS["gamma_sqrt"],
    gamma_log: Annotated[float, typer.Option(help="e3: gamma of psi = log.")] = E3_DEFAULTS["gamma_log"],
    mu: Annotated[float, typer.Option(help="e3: mu of each query.")] = E3_DEFAULTS["mu"],
    infusion_s: Annotated[float, typer.Option(help="e5, risk: smallest distortion |f - 1| of noise "
                                                   "infusion.")] = E5_DEFAULTS["infusion_s"],
    infusion_t: Annotated[float, typer.Option(help="e5, risk: largest distortion |f - 1| of noise "
                                                   "infusion.")] = E5_DEFAULTS["infusion_t"],
    delta: Annotated[float, typer.Option(help="e5, e6: delta of Smooth Laplace.")] = E5_DEFAULTS["delta"],
    jobs: Annotated[Optional[Path], typer.Option(help="e6: the job table of --data (default: synthetic jobs drawn "
                                                      "with --seed).")] = None,
    gedp_replications: Annotated[Optional[int], typer.Option(help="e6: gedp job-frame releases per eps (default: "
                                                                  "min(replications, 10); 0 leaves gedp "
                                                                  "out).")] = None,
    release: Annotated[Optional[Path], typer.Option(help="risk: a release of part of --data (the rest is the "
                                                         "control); default: a random half protected with "
                                                         "--config.")] = None,
    structure: Annotated[Optional[list[str]], typer.Option(help="Rewrite the state's establishments under a "
                                                                "structure of gedp.synth.structures first "
                                                                "(repeatable; e.g. moving-cells).")] = None,
    implicates: Annotated[Optional[int], typer.Option(help="utility: implicates per release (default 10; 0: "
                                                           "none).")] = None,
) -> None:
    """Run an evaluation experiment (e1-e6, coverage, accuracy, risk, utility) and write its report and plots."""
    from gedp.evaluation.e3_bias import E3Setup
    from gedp.evaluation.e5_earlier import E5Setup
    from gedp.evaluation.experiments import ExperimentRequest, experiment
    from gedp.evaluation.report import mark_confidentiality
    from gedp.release.format import SUMMARY_FILE
    from gedp.release.writer import staged_directory
    from gedp.synth.columns import count

    start = time.perf_counter()
    with reported_errors():
        chosen = experiment(name)
        _check_counts(name, replications, trials, gedp_replications)
        try:
            request = ExperimentRequest(
                config=config, replications=replications, seed=seed, trials=trials,
                gedp_replications=gedp_replications,
                e3=E3Setup(counties=counties, per_county=per_county, employees=employees, gamma_sqrt=gamma_sqrt,
                           gamma_log=gamma_log, mu=mu, trials=trials),
                e5=E5Setup(infusion_s=infusion_s, infusion_t=infusion_t, delta=delta))
        except ValueError as err:
            raise InputError(str(err)) from None
        if release is not None and name != "risk":
            raise InputError("--release goes with risk")
        if implicates is not None and (name != "utility" or implicates < 0):
            raise InputError(f"--implicates ({implicates}) goes with utility and must be >= 0")
        request = dataclasses.replace(request, release=release, implicates=implicates)
        with staged_directory(out, marker=SUMMARY_FILE) as staging:
            if chosen.uses_data:
                truth, label, published = _experiment_data(data, from_qcew, profile, seed)
                truth, label = _structured(truth, label, structure or [], seed)
                request = dataclasses.replace(request, truth=truth, data_label=label, published=published)
            elif structure:
                raise InputError(f"--structure goes with an experiment on data, not {name}")
            if jobs is not None:
                request = dataclasses.replace(request, jobs=_experiment_jobs(name, jobs, data, request.truth))
            chosen.render(_computed(chosen, request, name), staging)
            summary = mark_confidentiality(staging, confidential=chosen.uses_data and data is not None)
    plots = _report_plots(out)
    inner = sorted({f"{folder}/" for folder in plots if folder})
    where = f" in {', '.join(inner)}" if inner else ""
    console.print(f"[bold]{name}[/] written to {out.resolve()} (report.md, summary.json, "
                  f"{count(sum(plots.values()), 'plot')}{where}) in {time.perf_counter() - start:.0f}s")
    _say_if_confidential(summary)


def _report_plots(out: Path) -> dict[str, int]:
    """The plots of a report folder and of the reports inside it (a plan's accuracy beside baseline
    writes each in its own folder), as their summaries list them: folder name ("" for ``out``) -> count."""
    from gedp.release.format import SUMMARY_FILE

    return {("" if path.parent == out else path.parent.name): len(json.loads(path.read_text()).get("figures", []))
            for path in sorted(out.rglob(SUMMARY_FILE))}


def _say_if_confidential(summary: dict) -> None:
    """A reminder that a report computed from real microdata is confidential (its files say so too)."""
    from gedp.release.format import CONFIDENTIAL_PREFIX

    if summary["confidential"]:
        console.print(f"  [bold red]CONFIDENTIAL[/]: computed from real microdata; its files are marked "
                      f"{CONFIDENTIAL_PREFIX}... and it must not be published")


@app.command(name="suppress")
def suppress_command(
    out: Annotated[Path, typer.Option(help="Folder for cells.csv, the audit, shares, report.md and the plot.")],
    data: Annotated[Optional[Path], typer.Option(help="Microdata file (.csv, .parquet or a folder of parts).")] = None,
    from_qcew: Annotated[Optional[Path], typer.Option(help="A BLS QCEW file: suppress a state synthesized from it "
                                                         "and compare with the published suppression.")] = None,
    profile: Annotated[str, typer.Option(help="Built-in profile when neither --data nor --from-qcew is "
                                              "given.")] = DEFAULT_PROFILE,
    p: Annotated[float, typer.Option("--p", help="p of the p% rule.")] = SUPPRESSION_DEFAULTS["p"],
    min_estabs: Annotated[int, typer.Option(help="Cells with fewer establishments are "
                                                 "suppressed.")] = SUPPRESSION_DEFAULTS["min_estabs"],
    attributes: Annotated[str, typer.Option(help="Attributes the rule and the audit cover, "
                                                 "comma-separated.")] = ",".join(SUPPRESSION_DEFAULTS["attributes"]),
    audit: Annotated[bool, typer.Option("--audit/--no-audit", help="LP audit of every suppressed cell, with repair of "
                                                                   "failing primaries.")] = True,
    seed: Annotated[int, typer.Option(help="Seed of the synthesis with --from-qcew.")] = 1,
    every_lp: Annotated[bool, typer.Option("--every-lp", help="Final audit: solve both LPs of every cell, so the "
                                                              "audit file has each interval's ends (slower; same "
                                                              "verdicts).")] = False,
) -> None:
    """Cell suppression as the QCEW runs it, audited: what the published cells still reveal.

    The p% rule and a minimum count mark sensitive cells; secondary suppression over the industry
    and geography hierarchies protects them; an LP audit checks every suppressed cell."""
    from gedp.evaluation.baselines.suppression import SuppressionRule, check_microdata, suppress
    from gedp.evaluation.report import mark_confidentiality
    from gedp.evaluation.suppression_report import write_suppression
    from gedp.release.format import SUMMARY_FILE
    from gedp.release.writer import staged_directory

    start = time.perf_counter()
    with reported_errors():
        try:
            rule = SuppressionRule(p=p, min_estabs=min_estabs,
                                   attributes=tuple(a.strip() for a in attributes.split(",") if a.strip()))
        except ValueError as err:
            raise InputError(str(err)) from None
        microdata, label, published = _experiment_data(data, from_qcew, profile, seed)
        try:
            check_microdata(microdata, rule.attributes)
        except ValueError as err:
            raise InputError(str(err)) from None
        published_shares = None if published is None else published.suppressed_shares()
        with staged_directory(out, marker=SUMMARY_FILE) as staging:
            with progress_counts("auditing intervals") as (update, say):
                result = suppress(microdata, rule, audit=audit, on_round=say, progress=update, every_lp=every_lp)
            write_suppression(staging, microdata, result, data_label=label, published_shares=published_shares)
            summary = mark_confidentiality(staging, confidential=data is not None)
    table = Table("agglvl", "cells", "withheld", f"withheld {rule.attributes[0]}", "before audit repair",
                  *(["withheld by BLS"] if published_shares is not None else []), title="cell suppression")
    for row in summary["shares"]:
        table.add_row(str(row["agglvl"]), f"{row['cells']:,}", f"{row['suppressed_share']:.1%}",
                      f"{row[f'{rule.attributes[0]}_share']:.1%}", f"{row['before_repair_share']:.1%}",
                      *([f"{row['published_share']:.1%}"] if published_shares is not None else []))
    console.print(table)
    audited = ("no audit" if summary["failing_cells"] is None else
               f"audit: {summary['audited_intervals']:,} intervals, {summary['failing_cells']} primary cells failing "
               f"after {summary['repair_rounds']} repair round(s)")
    console.print(f"[bold]suppression[/] written to {out.resolve()}: {summary['suppressed']:,} of {summary['cells']:,} "
                  f"cells withheld ({summary['primary']:,} primary); {audited}; {time.perf_counter() - start:.0f}s")
    _say_if_confidential(summary)
    if summary["failing_cells"]:
        raise typer.Exit(1)


@app.command()
def audit(
    release: Annotated[Optional[Path], typer.Option(help="Audit this written release's bytes against its "
                                                         "manifest.")] = None,
    pipeline: Annotated[bool, typer.Option("--pipeline", help="Audit the release path: gedp protect run on two "
                                                              "neighbouring datasets many times.")] = False,
    runs: Annotated[int, typer.Option(help="With --pipeline: runs of gedp protect on each dataset.")] = 200,
    config: Annotated[str, typer.Option(help="With --pipeline: the plan protected (name or YAML).")] = "audit",
    broken: Annotated[bool, typer.Option("--broken", help="With --pipeline: audit a deliberately broken build (noise "
                                                          "sd halved, full sd claimed).")] = False,
    out: Annotated[Optional[Path], typer.Option(help="Also write the results as JSON here.")] = None,
    workers: Annotated[int, typer.Option(help="With --pipeline: processes the runs are spread over (1: this "
                                              "one).")] = 2,
) -> None:
    """Audit a written release (--release DIR) or the release path (--pipeline).

    --release checks the bytes: values on their grid, rows in release order, mu, sd, variances, tau and zeta recomputed from the released answers, no seed and no path; exits 2 naming each failed check.

    --pipeline bounds from below, per statistic of the written files, the mu that one establishment's psi-neighbour shows, and exits 1 if a bound exceeds the mu claimed.
    """  # noqa: E501 (one line per paragraph: the help wraps them)
    with reported_errors():
        if (release is None) == (not pipeline):
            raise InputError("give one of --release DIR or --pipeline")
        if runs < 20:
            raise InputError(f"--runs ({runs}) must be >= 20")
        if workers < 1:
            raise InputError(f"--workers ({workers}) must be >= 1")
        if out is not None:  # refused before the audit runs, not after
            check_output_file(out)
        rows = _audit_release(release) if release is not None else _audit_pipeline(runs, config, broken, workers)
    if out is not None:
        with reported_errors():
            write_atomically(out, lambda path: path.write_text(json.dumps(rows, indent=2) + "\n"))
    failed = [row for row in rows if not row["passed"]]
    if failed and release is not None:
        errors.print(f"[red]release audit failed[/]: {'; '.join(row['name'] for row in failed)}")
        raise typer.Exit(2)
    if failed:
        raise typer.Exit(1)


def _audit_release(release: Path) -> list[dict]:
    """Run and print the release audit; its checks as rows."""
    from gedp.audit.release import audit_release

    checks = audit_release(release)
    table = Table("check", "verdict", "what failed", title=f"Audit of the release in {release}")
    for check in checks:
        table.add_row(check.name, "[green]pass[/]" if check.passed else "[red]FAIL[/]", check.detail)
    console.print(table)
    console.print(f"{sum(c.passed for c in checks)} of {len(checks)} checks passed")
    return [dataclasses.asdict(check) for check in checks]


def _audit_pipeline(runs: int, config: str, broken: bool, workers: int) -> list[dict]:
    """Run and print the pipeline audit; its statistics as rows."""
    from gedp.audit.pipeline import PIPELINE_ALPHA, run_pipeline_audit

    with progress_steps(runs) as advance:
        results = run_pipeline_audit(config, runs=runs, noise_factor=0.5 if broken else 1.0, workers=workers,
                                     on_run=lambda: advance("protecting D1 and D2"))
    table = Table("statistic", "claimed mu", "audited lower bound", "runs", "verdict",
                  title="Pipeline audit" + (" of a broken build (noise sd halved)" if broken else ""))
    for r in results:
        table.add_row(r.statistic, f"{r.claimed_mu:.4g}", f"{r.audited_mu_low:.3f}", f"{r.runs:,}",
                      "[green]pass[/]" if r.passed else "[red]FAIL: leaks more than claimed[/]")
    console.print(table)
    console.print(f"the bounds hold together with probability >= {1 - PIPELINE_ALPHA:.2f} "
                  "(Clopper-Pearson, Bonferroni)")
    return [{"name": r.statistic, **r.row()} for r in results]


def _readable(value: float) -> str:
    """36,000 rather than 3.6e+04; four significant digits below 1,000."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def main() -> None:
    """Console entry point: usage errors (a bad option value, an unknown command), too, end in one
    line ``error: ...`` and exit status 2."""
    set_up_command_memory()
    stop_on_sigterm()  # SIGTERM stops a command as Ctrl-C does (exit 143, nothing left)
    try:
        code = app(standalone_mode=False)
    except click_errors.NoArgsIsHelpError:
        app(["--help"])
    except click_errors.ClickException as err:
        typer.echo(f"error: {_one_line(Exception(err.format_message()))}", err=True)
        sys.exit(err.exit_code)
    except typer.Abort:
        typer.echo("error: aborted", err=True)
        sys.exit(1)
    sys.exit(exit_status(code if isinstance(code, int) else 0))


def command() -> None:
    """The ``gedp`` executable and ``python -m gedp``: ``main``, then the process ends without the
    interpreter's teardown (``gedp.running.process.end_process``)."""
    try:
        main()
    except SystemExit as done:
        if done.code is not None and not isinstance(done.code, int):
            raise  # a message: Python prints it
        end_process(done.code or 0)


if __name__ == "__main__":
    command()
