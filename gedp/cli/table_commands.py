"""The commands of data users, which read releases and spend no privacy budget: ``tabulate``,
``serve``, ``implicates``, ``report``; and ``interval``, how far a value is hidden."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

import gedp
from gedp.cli.command_line import app, console, errors, plain, printable, progress_counts, readable, reported_errors

if TYPE_CHECKING:
    from gedp.release.implicates import TaskMap
    from gedp.tabulation.request import Tabulation

#: Rows shown on a terminal; a pipe or --out gets the whole table as CSV.
SHOWN_ROWS = 25

Release = Annotated[Path, typer.Argument(help="A release directory.")]
# gedp tabulate
Microdata = Annotated[Path, typer.Argument(help="A release directory, or a microdata file (.csv, .parquet) "
                                                              "or folder of Parquet parts.")]
By = Annotated[Optional[str], typer.Option(help="Public columns, comma-separated ('total' for the total); county keys "
                                                "always carry the state; size_class (BLS size codes 1-9) is estimated "
                                                "over implicates.")]
Agglvl = Annotated[Optional[int], typer.Option(help="A QCEW aggregation level (50-58, 70-78; 50 and 70 total over "
                                                    "ownerships) instead of --by.")]
Where = Annotated[Optional[str], typer.Option(help="Keep establishments matching this filter of columns, comparisons, "
                                                   "in [..] and and/or/not (never run as code), e.g. \"sector == "
                                                   "'31-33'\".")]
Moe = Annotated[bool, typer.Option("--moe", help="Add margins of error (needs a release directory).")]
Level = Annotated[float, typer.Option(help="Confidence level of the margins of error.")]
TableFormat = Annotated[Optional[str], typer.Option("--format", help="csv, parquet, qcew (a level ready to publish) or "
                                                                     "xlsx (levels and notes); default from --out.")]
Titles = Annotated[Optional[Path], typer.Option(help="A published QCEW CSV file whose area and industry titles "
                                                     "--format qcew/xlsx carry (default: lists shipped with gedp).")]
TableOut = Annotated[Optional[Path], typer.Option(help="Write the table to this file (without it: CSV on stdout when "
                                                       "piped, the first rows on a terminal).")]
Quarter = Annotated[Optional[str], typer.Option(help="A panel release: the quarter tabulated, e.g. 2017Q1.")]
Change = Annotated[Optional[str], typer.Option(help="A panel release: the change FIRST:SECOND of every cell, e.g. "
                                                    "2016Q1:2017Q1 (<attribute>_chg, _chg_moe, _pct_chg).")]
Unprotected = Annotated[bool, typer.Option("--unprotected", help="Allow --format qcew or xlsx of confidential "
                                                                 "microdata (not a release): every row's "
                                                                 "disclosure_code then says NOT PROTECTED.")]
DrawnFolder = Annotated[Optional[Path], typer.Option("--implicates", help="With --by ...,size_class: combine over the "
                                                                      "implicates in this folder (gedp implicates "
                                                                      "RELEASE --out DIR: drawn once, every table "
                                                                      "of it from the same draws) instead of "
                                                                      "drawing 20; checked to be this release's.")]
GainsLosses = Annotated[Optional[str], typer.Option(help="FROM:TO quarters (e.g. 2016Q1:2016Q2) of a panel release or "
                                                         "panel microdata: gross job gains and losses of month-3 "
                                                         "employment by --by instead of levels (of a release: "
                                                         "corrected sums, and margins with --moe).")]
# gedp serve
Releases = Annotated[list[Path], typer.Argument(help="Release directories to serve (each loaded once).")]
Host = Annotated[str, typer.Option(help="Address to listen on (loopback unless told: 0.0.0.0 exposes the server to "
                                        "the network).")]
Port = Annotated[int, typer.Option(help="Port to listen on (0: a free one, printed).")]
MaxRows = Annotated[int, typer.Option(help="Most rows a table answered may have.")]
Timeout = Annotated[float, typer.Option(help="Most seconds a request may compute.")]
AnswerCache = Annotated[bool, typer.Option("--cache/--no-cache", help="Keep answers for requests asked again "
                                                                      "(--no-cache: every answer computed, so its "
                                                                      "time does not tell whether it was asked "
                                                                      "before).")]
# gedp implicates
ImplicatesOut = Annotated[Path, typer.Option(help="The folder of implicates to write (one Parquet file per implicate; "
                                                  "pandas.read_parquet(OUT) reads them all).")]
Count = Annotated[int, typer.Option("--n", help="Number of implicates M.")]
LevelPrior = Annotated[str, typer.Option(help="The size prior's level: month1 (default) or quarter (the months' "
                                              "mean: job destruction nearer the truth, job creation and size "
                                              "classes under 10 employees shifted; docs/method/implicates.md).")]
ChangePrior = Annotated[str, typer.Option(help="The month-to-month changes' prior: independent (default) or joint "
                                                "(one 2-D prior of the two changes per size band; "
                                                "docs/method/implicates.md).")]
WagePrior = Annotated[str, typer.Option(help="The wage priors' levels: sector (default) or cells (each county x "
                                             "NAICS-6 cell's own level: the size-wage slope within cells kept; "
                                             "docs/method/implicates.md).")]
DrawSeed = Annotated[Optional[int], typer.Option(help="Seed the draws (reproducible; default: the secure generator).")]
DrawnQuarter = Annotated[Optional[str], typer.Option(help="A panel release: the quarter drawn, e.g. 2016Q1.")]
DrawProcesses = Annotated[Optional[int], typer.Option(help="Draw on this many worker processes, each implicate's "
                                                           "priors and each block of establishments from a stream of "
                                                           "its own: the same implicates for any number (1: this "
                                                           "process; at most the CPUs this process may use), not "
                                                           "the bits drawn without it (default: one stream, this "
                                                           "process).")]
# gedp report
ReportOut = Annotated[Path, typer.Option(help="The HTML page to write (one self-contained file); its summary JSON is "
                                              "written beside it (OUT.json).")]
Published = Annotated[Optional[Path], typer.Option(help="The agency's published QCEW file (BLS layout) of the same "
                                                        "state and quarter: the release beside its numbers and its "
                                                        "cell suppression.")]
# gedp interval
Values = Annotated[list[float], typer.Argument(help="Values x to show I(x) for.")]
Psi = Annotated[str, typer.Option(help="sqrt, log, linear or sqrt-linear.")]
Gamma = Annotated[Optional[float], typer.Option(help="Distance parameter gamma (default 0.5; 1 for sqrt-linear).")]
Offset = Annotated[Optional[float], typer.Option(help="Offset a of sqrt(x + a) or log(x + a).")]
PersonBound = Annotated[Optional[float], typer.Option(help="Person-level bound d of linear and sqrt-linear.")]
GammaSqrt = Annotated[Optional[float], typer.Option(help="gamma of the sqrt part of sqrt-linear.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


@app.command(name="tabulate")
def tabulate_command(
    microdata: Microdata, by: By = None, agglvl: Agglvl = None, where: Where = None, moe: Moe = False,
    level: Level = 0.95, table_format: TableFormat = None, titles: Titles = None, out: TableOut = None,
    quarter: Quarter = None, change: Change = None, unprotected: Unprotected = False, gains_losses: GainsLosses = None,
    implicates: DrawnFolder = None,
) -> None:
    """Tabulate microdata by any public columns or a QCEW level, optionally with margins of error.

    Margins of error come from the release's weighted least squares covariance: no new privacy
    budget is spent and no confidential data is read.
    """
    from gedp.tabulation.request import TabulationRequest, tabulate_request

    with reported_errors():
        request = TabulationRequest(microdata, by=by, agglvl=agglvl, where=where, moe=moe, level=level,
                                    format=table_format, titles=titles, out=out, quarter=quarter, change=change,
                                    gains_losses=gains_losses, unprotected=unprotected, implicates=implicates)
        answer = tabulate_request(request, frame=out is None and sys.stdout.isatty())
        for said in answer.warnings:
            typer.echo(f"warning: {readable(said)}", err=True)
        if out is not None:
            answer.write()
    _show_tabulation(answer, out, request.margins_note + _drawn_note(answer))


def _drawn_note(answer: Tabulation) -> str:
    """What a summary line adds about the folder of implicates a size-class table was combined over."""
    from gedp.synth.columns import count

    drawn = answer.drawn
    if drawn is None:
        return ""
    return f"; combined over {count(drawn['count'], 'implicate')} from {printable(drawn['folder'])}"


def _show_tabulation(answer: Tabulation, out: Optional[Path], margins: str) -> None:
    """Say where the table went; without --out, the whole table as CSV to a pipe, or its first rows
    to a terminal."""
    from gedp.synth.columns import count

    if out is not None:
        console.print(f"{count(answer.n_rows, 'row')} written to {printable(out)}{margins}")
    elif not sys.stdout.isatty():
        answer.write_csv(sys.stdout)
        errors.print(f"{count(answer.n_rows, 'row')} written as CSV to standard output{margins}")
    else:
        table = answer.frame()
        typer.echo(table.head(SHOWN_ROWS).to_string(index=False, float_format=lambda v: f"{v:,.1f}"))
        shown = (f" (the first {SHOWN_ROWS} shown; --out FILE or a pipe gives them all as CSV)"
                 if len(table) > SHOWN_ROWS else "")
        console.print(f"{count(len(table), 'row')}{shown}{margins}")


@app.command(name="serve")
def serve_command(releases: Releases, host: Host = "127.0.0.1", port: Port = 8000, max_rows: MaxRows = 100_000,
                  timeout: Timeout = 30.0, cache: AnswerCache = True) -> None:
    """Serve releases to data users: a web page and a JSON API of tabulations with margins of error.

    The page shows tables with margins and quality flags, charts, and CSV and xlsx downloads; the
    API answers /api/tabulate, /api/releases and /api/openapi.json. Every number is the one gedp
    tabulate gives for the same request; tables are computed from the releases alone, so they spend
    no further privacy budget.
    """
    from gedp.serve.server import LOOPBACK, open_server

    started = time.perf_counter()
    with reported_errors():
        server = open_server(releases, host=host, port=port, max_rows=max_rows, timeout=timeout, cache=cache,
                             status=errors.status)
    if host not in LOOPBACK:
        errors.print(f"warning: listening on {host}: anyone who can reach this address can use the server")
    console.print(f"Serving {', '.join(map(plain, server.served))} at "
                  f"http://{'[' + host + ']' if ':' in host else host}:{server.port}/ "
                  f"(loaded in {time.perf_counter() - started:.1f} s; Ctrl-C stops)", highlight=False)
    try:
        server.run()
    finally:  # its computations still running are of requests answered or given up: not waited for
        from gedp.running.process import threads_abandoned

        threads_abandoned()


@app.command(name="implicates")
def implicates_command(release: Release, out: ImplicatesOut, n: Count = 10, seed: DrawSeed = None,
                       quarter: DrawnQuarter = None, level_prior: LevelPrior = "month1",
                       change_prior: ChangePrior = "independent", wage_prior: WagePrior = "sector",
                       processes: DrawProcesses = None) -> None:
    """Draw M complete microdata files from the posterior of the confidential values given a release.

    Reads the release's files only, spends no privacy budget and changes nothing in the release;
    combine a statistic computed on each implicate with gedp.combine (Rubin's rules).
    """
    from gedp.release.implicates import write_implicates

    with reported_errors():
        start = time.perf_counter()
        map_tasks = None if processes is None else worker_map(processes)
        with progress_counts("drawing implicates") as (update, say):
            write_implicates(release, n, out, seed=seed, quarter=quarter, progress=update, note=say,
                             level_prior=level_prior, change_prior=change_prior, wage_prior=wage_prior,
                             map_tasks=map_tasks)
    console.print(f"[bold]{n} implicates[/] written to {printable(out)} in {time.perf_counter() - start:.0f} s "
                  "(pandas.read_parquet reads them with an implicate column)")


def worker_map(processes: int) -> TaskMap:
    """Tasks run on ``processes`` forked worker processes (1: this one), at most the CPUs this process may
    use (the draws are the same for any number; ``--processes 1000 --n 1000`` forked 1,000 workers, ~8 MiB
    each on 3,000 establishments: red team rt28 J4), results told in order, a few held at once."""
    from gedp.errors import InputError
    from gedp.planning.workers import parallel_map, usable_cpus

    if processes < 1:
        raise InputError(f"--processes ({processes}) must be a whole number of at least 1")
    workers = min(processes, usable_cpus())
    return lambda task, shared, items, tell: parallel_map(task, shared, items, on_result=tell, workers=workers,
                                                          keep=False, stopped="no implicates were written")


@app.command(name="report")
def report_command(release: Release, out: ReportOut = Path("report.html"), published: Published = None) -> None:
    """Write one self-contained HTML page a manager reads about a release.

    The privacy statement in plain words, the cells published against cell suppression, the margins
    of error, and the release beside the agency's published numbers. Reads only the release and the
    public published file, never confidential data.
    """
    with reported_errors(), errors.status(f"reporting on {plain(release)}"):
        page = gedp.report(release, out, published=published)
    console.print(f"[bold]report[/] written to {printable(out)} ({len(page.html) / 1e6:.1f} MB, one self-contained "
                  f"file) and {plain(out.name)}.json")


@app.command()
def interval(values: Values, psi: Psi = "sqrt", gamma: Gamma = None, a: Offset = None, d: PersonBound = None,
             gamma_sqrt: GammaSqrt = None, as_json: AsJson = False) -> None:
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


def _readable(value: float) -> str:
    """36,000 rather than 3.6e+04; four significant digits below 1,000."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
