"""Scale: the structured solver against cvxpy and one group-sum pass, and `gedp protect` end to end
up to a national-size multi-state input. Results are appended to benchmarks/RESULTS.md.

    python benchmarks/bench_scale.py [--solver-sizes 25000,251987,1400000,9400000]
        [--cvxpy-max 251987] [--protect-sizes 1400000] [--national-states 37] [--label TEXT]
        [--repeat 3] [--before GEDP] [--work DIR] [--protect-options '--processes 1']

`gedp protect` runs as an agency runs it: secure generator, release for publication.

Inputs are synthetic: the `large` profile (New Jersey-like) rescaled to each size; the national
input is 37 states of the large profile (about 254,000 establishments each, 9.4 million in all),
each state under its own FIPS code, written as a folder of per-state Parquet parts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from gedp.config import load_config
from gedp.measure.queries import group_establishments
from gedp.measure.workflows import measure
from gedp.postprocess.structured import cell_to_group_matrix, solve_nested
from gedp.postprocess.wls import build_system, kkt_residual, solve_wls
from gedp.synth.profiles import generate_profile, load_profile
from gedp.synth.schema import public_columns

RESULTS = Path(__file__).with_name("RESULTS.md")
#: FIPS codes of the national input's states (37 states of ~254k establishments = 9.4M).
NATIONAL_STATES = ["01", "02", "04", "05", "06", "08", "09", "10", "12", "13", "15", "16", "17", "18", "19",
                   "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31", "32", "33", "34",
                   "35", "36", "37", "38", "39", "40", "41"]


def state_of_size(n: int, seed: int = 1):
    return generate_profile(load_profile("large"), n_establishments=n, rng=np.random.default_rng(seed))


def solver_rows(sizes: list[int], cvxpy_max: dict[str, int]) -> list[str]:
    plan = load_config("baseline").plan
    rows = []
    for n in sizes:
        microdata = state_of_size(n)
        answers = measure(microdata, plan, rng=np.random.default_rng(2)).for_attribute("m1emp")
        public = microdata[public_columns(microdata)]
        start = time.perf_counter()
        system = build_system(answers, public, [a.variance for a in answers])
        cells = group_establishments(public, ["state", "county", "naics5"]).codes
        c = cell_to_group_matrix(system.matrix[n:], cells, int(cells.max()) + 1)
        setup = time.perf_counter() - start
        arguments = (answers[0].estimate, answers[0].variance, cells, c, system.b[n:], system.v[n:])
        solve = min(_timed(lambda: solve_nested(*arguments)) for _ in range(3))
        solution, iterations = solve_nested(*arguments)
        structured = SimpleNamespace(iterations=iterations, kkt_residual=kkt_residual(system, solution),
                                     objective=float(np.sum((system.matrix @ solution - system.b) ** 2 / system.v)))
        values = microdata["m1emp"].to_numpy()
        floor = min(_timed(lambda: np.bincount(cells, weights=values)) for _ in range(20))
        line = (f"| {n:,} | {setup:.2f} | {solve:.3f} | {structured.iterations} | {structured.kkt_residual:.1e} | "
                f"{floor * 1e3:.1f} ms | {solve / floor:.0f}x |")
        for solver in ("clarabel", "osqp"):
            if n <= cvxpy_max[solver]:
                start = time.perf_counter()
                reference = solve_wls(system, solver=solver)
                seconds = time.perf_counter() - start
                gap = abs(structured.objective - reference.objective) / reference.objective
                line += f" {seconds:.1f} s ({seconds / solve:.0f}x slower, objective gap {gap:.1e}) |"
            else:
                line += " not run |"
        print(line, flush=True)
        rows.append(line)
    return rows


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def make_inputs(sizes: list[int], national_states: int, work: Path) -> list[tuple[str, Path]]:
    """The inputs of ``protect_rows`` in ``work``: one state of each size and the national folder of
    ``national_states`` parts; an input already there (from an earlier run with ``--work``) is reused."""
    inputs = []
    for n in sizes:
        path = work / f"state-{n}.parquet"
        if not path.exists():
            state_of_size(n).to_parquet(path, index=False)
        inputs.append((f"{n:,} establishments, 1 state", path))
    if national_states:
        folder = work / f"national-{national_states}.parquet"
        folder.mkdir(exist_ok=True)
        for index, state in enumerate(NATIONAL_STATES[:national_states]):
            part = folder / f"part-{state}.parquet"
            if not part.exists():
                frame = state_of_size(254_000, seed=index)
                frame["state"] = state
                frame["estab_id"] = state + "-" + frame["estab_id"]
                frame.to_parquet(part.with_suffix(".tmp"), index=False)
                part.with_suffix(".tmp").rename(part)
        inputs.append((f"{national_states * 254_000:,} establishments, {national_states} states (national)", folder))
    return inputs


def protect_rows(sizes: list[int], national_states: int, work: Path, repeat: int = 1, before: str = "",
                 extra: list[str] | None = None) -> list[str]:
    """`gedp protect` of each input, ``repeat`` times (alternating with the ``before`` executable when
    given), beside its I/O floor (bench_cli.protect_floor): median and best wall seconds, median processor
    seconds (user + sys, worker processes included), floor, peak memory of the largest process, and the
    range of the load average (1 min) before each run. ``extra``: options given to every protect."""
    from bench_cli import protect_floor, timed_run

    versions = {"": [shutil.which("gedp") or sys.executable, *(["-m", "gedp"] if not shutil.which("gedp") else [])]}
    if before:
        versions = {" (before)": [before], " (after)": versions[""]}
    rows = []
    for label, path in make_inputs(sizes, national_states, work):
        release = work / f"release-{path.stem}"
        runs: dict[str, list[tuple[float, float, float]]] = {version: [] for version in versions}
        floors, loads = [], []
        for _ in range(repeat):
            for version, command in versions.items():  # alternate: both see the same load
                loads.append(os.getloadavg()[0])
                runs[version].append(timed_run([*command, "protect", str(path), "--out", str(release),
                                                *(extra or [])], work))
            scratch = work / "floor"
            scratch.mkdir(exist_ok=True)
            floors.append(protect_floor(path, release, scratch))
        for version, measured in runs.items():
            seconds, cpu = sorted(run[0] for run in measured), sorted(run[2] for run in measured)
            best, floor = seconds[0], min(floors)
            line = (f"| gedp protect, {label}, recommended plan{version} | {seconds[len(seconds) // 2]:.1f} | "
                    f"{best:.1f} | {cpu[len(cpu) // 2]:.1f} | {floor:.2f} | {best / floor:.1f}x | "
                    f"{max(run[1] for run in measured):,.0f} | {min(loads):.1f}-{max(loads):.1f} |")
            print(line, flush=True)
            rows.append(line)
    return rows


#: Whole processes that measure start-up: Python alone, with the floor's pyarrow, with what
#: `gedp protect` imports before it reads its input.
STARTUPS = {"python": "pass", "python + pyarrow (the floor's start-up)": "import pyarrow.parquet",
            "python + gedp protect's imports": "import gedp.cli, gedp.api, gedp.running.engine, "
                                                 "gedp.running.recorded_release, gedp.running.state_pipeline"}


def startup_line(repeat: int = 5) -> str:
    """The start-up of each of ``STARTUPS`` (wall seconds of a whole process, best of ``repeat``)."""
    import subprocess

    best = {}
    for label, code in STARTUPS.items():
        best[label] = min(_timed(lambda: subprocess.run([sys.executable, "-c", code], check=True))
                          for _ in range(repeat))
    return "Start-up, whole process, best of {}: {}.\n".format(
        repeat, "; ".join(f"{label} {seconds:.2f} s" for label, seconds in best.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--solver-sizes", default="25000,251987,1400000,9400000")
    parser.add_argument("--cvxpy-max", type=int, default=251_987, help="largest size also solved with Clarabel")
    parser.add_argument("--osqp-max", type=int, default=25_000,
                        help="largest size also solved with OSQP (at the project's 1e-9 tolerances it is slow)")
    parser.add_argument("--protect-sizes", default="1400000")
    parser.add_argument("--national-states", type=int, default=37)
    parser.add_argument("--label", default="", help="added to the heading, e.g. the commit measured")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each `gedp protect` (median and best shown)")
    parser.add_argument("--before", default="", help="another gedp executable to run every protect with too")
    parser.add_argument("--work", default="", help="folder where the inputs are made once and reused by later "
                                                   "runs (default: a temporary folder)")
    parser.add_argument("--protect-options", default="", help="options added to every `gedp protect`, e.g. "
                                                              "'--processes 1'")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    sizes = [int(s) for s in args.solver_sizes.split(",") if s]
    solver = solver_rows(sizes, {"clarabel": args.cvxpy_max, "osqp": args.osqp_max})
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        protect = protect_rows([int(s) for s in args.protect_sizes.split(",") if s], args.national_states, work,
                               args.repeat, args.before, args.protect_options.split())
    from bench_cli import machine

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    label = f" ({args.label})" if args.label else ""
    solver_table = [
        "Solver alone on month-1 employment, baseline plan (pnc): the pivoting on the nested inputs (best of 3); "
        "setup = stacking the query rows and the cells x groups matrix; floor = one np.bincount over the "
        "establishments (best of 20); KKT residual in employees.\n",
        "| establishments | setup s | structured s | pivots | KKT residual | floor | structured / floor | "
        "cvxpy + Clarabel | cvxpy + OSQP |", "|---|---|---|---|---|---|---|---|---|", *solver, ""]
    lines = [f"\n## {stamp}: solver and scale (one attribute for the solver; four for protect){label}\n",
             f"Machine: {machine()}\n", *(solver_table if solver else []),
             f"Whole process, {args.repeat} run(s) each; I/O floor = a Python process that imports pyarrow, reads "
             "the input and writes files of the release's size once (bench_cli.protect_floor; best of the runs). "
             f"Load average (1 min) at the start: {load_before:.1f}, at the end: {os.getloadavg()[0]:.1f}.\n",
             "| whole process | median s | best s | median CPU s (user + sys) | I/O floor s | best / floor | "
             "peak memory MiB | load (1 min) before the runs |",
             "|---|---|---|---|---|---|---|---|", *protect, "", startup_line()]
    with RESULTS.open("a") as handle:
        handle.write("\n".join(lines) + "\n")
    print(f"recorded in {RESULTS}")


if __name__ == "__main__":
    main()
