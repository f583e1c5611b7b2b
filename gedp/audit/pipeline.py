"""An audit of the release path: ``gedp protect`` run many times on two neighbouring datasets.

D1 is a small synthetic state; D2 moves one establishment's value of one attribute to the upper end
of its uncertainty interval (psi(x') - psi(x) = gamma exactly), so the two are psi-neighbours. Each
run is the library call ``gedp protect`` makes, with the secure generator releases use, written to a
folder and read back. Several statistics of the written files try to tell D1 from D2: that
establishment's identity answer, its group answers, both together (the likelihood-ratio statistic
of the Gaussian answers) and its protected value. Each is centred and scaled so that 0 is its
natural threshold; thresholds at -0.5, 0 and 0.5 are fixed before any
run, so every run counts towards the bound (``bounds.mu_lower_bound_at``). A statistic fails when
its lower bound exceeds the mu the manifest claims for what it reads. The likelihood ratios are
scaled to sd 1 and the protected value to the shift x' - x.

``broken_noise`` is the power check's deliberately broken build: every noise draw's sd scaled
down while the release still claims the full sd.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd

from gedp.api import load, synthesize
from gedp.audit.bounds import mu_lower_bound_at
from gedp.config import Config
from gedp.errors import held_stops
from gedp.measure import mechanisms
from gedp.measure.budget import compose
from gedp.measure.neighbors import NeighborFunction
from gedp.measure.queries import IDENTITY
from gedp.postprocess.cpus import usable_cpus
from gedp.release.format import MEASUREMENTS_FILE, PROTECTED_FILE
from gedp.release.reader import parse_query_name
from gedp.running.process import worker_signals
from gedp.running.recorded_release import protect_recorded
from gedp.running.state_pool import stop_workers
from gedp.waits import completed, result_of

#: Family-wise false-failure rate of a pipeline audit (all statistics and thresholds together).
PIPELINE_ALPHA = 0.01
#: Thresholds of every centred statistic, in units of the shift D2 causes.
THRESHOLDS = (-0.5, 0.0, 0.5)
STATISTICS = ("identity answer", "group answers", "likelihood ratio", "protected value")
#: Worker processes of a pipeline audit, and runs per task handed to one.
WORKERS = min(2, usable_cpus())
BATCH = 10
#: Columns of a release's measurements that may change from run to run (the others name the answer;
#: an answer's recorded mu can differ in its last bit between runs).
DRAWN_COLUMNS = ("released", "estimate", "variance", "sd", "grid", "mu")


#: Each statistic's scores of the runs on D1 and on D2.
Scores = dict[str, tuple[list[float], list[float]]]


@dataclass(frozen=True)
class Neighbours:
    """Two psi-neighbouring datasets differing in one establishment's ``attribute``."""

    d1: pd.DataFrame
    d2: pd.DataFrame
    estab_id: str
    attribute: str
    x1: float
    x2: float


@dataclass(frozen=True)
class StatisticResult:
    """One statistic's verdict: its lower bound on mu against the mu claimed for what it reads."""

    statistic: str
    claimed_mu: float
    audited_mu_low: float
    runs: int
    passed: bool

    def row(self) -> dict:
        return dict(self.__dict__)


def neighbours(config: Config, attribute: str, establishments: int = 30, seed: int = 1) -> Neighbours:
    """A synthetic state of ``establishments`` and its neighbour: the largest establishment's
    ``attribute`` (the one that dominates its groups, where group answers say most) moved up by
    gamma on the psi scale."""
    d1 = synthesize("small", establishments=establishments, seed=seed)
    row = int(np.argmax(d1[attribute].to_numpy()))
    psi, gamma = config.plan.psi, config.plan.gammas[attribute]
    x1 = float(d1[attribute].iloc[row])
    x2 = float(psi.inverse(psi(np.array([x1])) + gamma)[0])
    d2 = d1.copy()
    d2.loc[d2.index[row], attribute] = x2
    return Neighbours(d1, d2, str(d1["estab_id"].iloc[row]), attribute, x1, x2)


@contextlib.contextmanager
def broken_noise(factor: float) -> Iterator[None]:
    """A deliberately broken build: every mechanism's noise sd multiplied by ``factor`` (< 1), while
    the answers still record and the manifest still charges the full sd."""
    draw = mechanisms.rounded_gaussian

    def scaled(sd, grid, size, rng):
        return draw(np.asarray(sd, dtype=float) * factor, grid, size, rng)

    with mock.patch.object(mechanisms, "rounded_gaussian", scaled):
        yield


def released_files(data: pd.DataFrame, config: Config, folder: Path, seed: int | None = None
                   ) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """One run of the release path (``gedp protect``'s library call, secure generator; with ``seed``,
    PCG64 seeded as ``gedp protect --seed``): the release's measurements, protected microdata and
    manifest, read back from its files. The QCEW tables, which no statistic reads (a function of the
    protected microdata), are not built: half of a run's time on the audit's 30 establishments."""
    manifest, _ = protect_recorded(data, config, folder, ledger=None, seed=seed, engine="local", tables=False)
    return pd.read_parquet(folder / MEASUREMENTS_FILE), pd.read_parquet(folder / PROTECTED_FILE), manifest


def _means(pair: Neighbours, psi: NeighborFunction, measurements: pd.DataFrame) -> pd.DataFrame:
    """The target's answers on its attribute, indexed by their rows in ``measurements``, with their
    expected values under D1 and D2 (group sums of the true values, on the psi scale for psi-mechanism
    answers; pnc clipping, which happens with probability below zeta, is ignored)."""
    target = pair.d1.loc[pair.d1["estab_id"] == pair.estab_id].iloc[0]
    rows = measurements[measurements["attribute"] == pair.attribute]
    picked = []
    for name, answers in rows.groupby("query", sort=False):
        by = parse_query_name(str(name))
        if by == IDENTITY:
            mine = answers[answers["estab_id"] == pair.estab_id]
            sums = (pair.x1, pair.x2)
        else:
            mine = answers[np.logical_and.reduce([answers[c] == target[c] for c in by]) if by else slice(None)]
            inside = np.logical_and.reduce([pair.d1[c] == target[c] for c in by]) if by else slice(None)
            total = math.fsum(pair.d1.loc[inside, pair.attribute])
            sums = (total, total - pair.x1 + pair.x2)
        on_psi = mine["mechanism"].iloc[0] == "psi"
        means = [float(psi(np.array([s]))[0]) if on_psi else s for s in sums]
        picked.append(mine.assign(mean_1=means[0], mean_2=means[1], identity=by == IDENTITY))
    return pd.concat(picked)


def _likelihood_ratio(answers: dict[str, np.ndarray], rows: np.ndarray) -> float:
    """The log-likelihood ratio of D2 against D1 given independent Gaussian answers (the ``rows`` of
    ``answers``' columns), divided by its sd m: N(-m / 2, 1) under D1 and N(m / 2, 1) under D2 for an
    honest mechanism."""
    released, sd, mean_1, mean_2 = (answers[c][rows] for c in ("released", "sd", "mean_1", "mean_2"))
    shift = (mean_2 - mean_1) / sd
    centred = (released - (mean_1 + mean_2) / 2) / sd
    spread = math.sqrt(float(np.sum(shift**2)))
    return float(np.sum(centred * shift)) / spread if spread > 0 else 0.0


def target_answers(pair: Neighbours, psi: NeighborFunction, measurements: pd.DataFrame,
                   located: pd.DataFrame | None = None) -> pd.DataFrame:
    """The target's answers of one run with their expected values. ``located``: a previous run's (the
    measurements' rows and their order are fixed by the public columns, so the target's answers sit in
    the same rows); it is reused when those rows still hold the same queries and keys, else rebuilt."""
    if located is not None and located.index.max() < len(measurements):
        rows = measurements.loc[located.index]
        naming = [c for c in measurements.columns if c not in DRAWN_COLUMNS]
        if all(rows[column].equals(located[column]) for column in naming):
            return located.assign(**{c: rows[c] for c in DRAWN_COLUMNS if c in rows.columns})
    return _means(pair, psi, measurements)


def statistics(pair: Neighbours, answers: pd.DataFrame, protected: pd.DataFrame) -> dict[str, float]:
    """The centred statistics of one run's files (the target's ``answers``, from ``target_answers``,
    and the protected microdata), 0 halfway between D1 and D2 and larger under D2: likelihood ratios
    of the Gaussian answers in units of their sd, the protected value in units of the shift x' - x."""
    value = float(protected[pair.attribute].to_numpy()[protected["estab_id"].to_numpy() == pair.estab_id][0])
    columns = {c: answers[c].to_numpy(dtype=float) for c in ("released", "sd", "mean_1", "mean_2")}
    identity = answers["identity"].to_numpy(dtype=bool)
    return {
        "identity answer": _likelihood_ratio(columns, identity),
        "group answers": _likelihood_ratio(columns, ~identity),
        "likelihood ratio": _likelihood_ratio(columns, np.ones(len(identity), dtype=bool)),
        "protected value": (value - (pair.x1 + pair.x2) / 2) / (pair.x2 - pair.x1),
    }


def claims(manifest: dict, attribute: str) -> dict[str, float]:
    """The mu the manifest claims for what each statistic reads: the identity query's for the
    identity answer; every query's on the attribute, composed, for anything else (pnc's group
    answers are clipped at levels computed from the identity answers)."""
    per_query = {query: by_attribute[attribute] for query, by_attribute in manifest["mu"].items()
                 if attribute in by_attribute}
    attribute_total = compose(per_query.values())
    return {"identity answer": per_query["identity"], "group answers": attribute_total,
            "likelihood ratio": attribute_total, "protected value": attribute_total}


def audit_runs(config: Config, pair: Neighbours, runs: int, noise_factor: float = 1.0,
               seeds: list[int] | None = None, within: str | None = None) -> tuple[Scores, dict]:
    """``runs`` runs of the release path on D1 and D2 in this process: each statistic's scores by side
    (D1, D2) and the last manifest. ``noise_factor`` < 1 runs the broken build (``broken_noise``);
    ``seeds``: one per run and side, in that order (None: the secure generator). The runs' folders are
    written in a temporary folder, made inside ``within`` when given (a worker's: the audit's own folder,
    which the main process removes once its workers are stopped)."""
    scores: Scores = {name: ([], []) for name in STATISTICS}
    manifest: dict = {}
    located = None
    patched = broken_noise(noise_factor) if noise_factor != 1.0 else contextlib.nullcontext()
    with patched, tempfile.TemporaryDirectory(prefix="gedp-audit-", dir=within) as scratch:
        for run in range(runs):
            for side, data in enumerate((pair.d1, pair.d2)):
                folder = Path(scratch) / f"run-{run}-{side}"
                seed = None if seeds is None else seeds[2 * run + side]
                measurements, protected, manifest = released_files(data, config, folder, seed)
                shutil.rmtree(folder)
                located = target_answers(pair, config.plan.psi, measurements, located)
                for name, score in statistics(pair, located, protected).items():
                    scores[name][side].append(score)
    return scores, manifest


def _batches(runs: int) -> list[int]:
    return [BATCH] * (runs // BATCH) + ([runs % BATCH] if runs % BATCH else [])


def _batch_seeds(seed: int | None, batch: int, size: int) -> list[int] | None:
    """The protect seeds of one batch's runs and sides, from ``seed`` and the batch's index (the same
    wherever the batch runs), or None for the secure generator."""
    if seed is None:
        return None
    return [int(word) for word in np.random.SeedSequence([seed, batch]).generate_state(2 * size, np.uint64) >> 1]


def run_pipeline_audit(config: str | Config = "baseline", *, attribute: str = "m1emp", runs: int = 300,
                       noise_factor: float = 1.0, alpha: float = PIPELINE_ALPHA, workers: int = WORKERS,
                       on_run: Callable[[], None] | None = None, seed: int | None = None) -> list[StatisticResult]:
    """Protect D1 and D2 ``runs`` times each and bound, per statistic, the mu the outputs show.

    ``noise_factor`` < 1 audits the broken build (``broken_noise``). The runs are independent, so
    they are spread over ``workers`` processes in batches of BATCH (1: all in this process). Each
    statistic's bound holds with probability >= 1 - alpha / len(STATISTICS), so an honest release
    path passes every statistic with probability >= 1 - alpha. ``seed``: every run seeded from it
    (PCG64, as ``gedp protect --seed``: a reproducible audit, for tests); None: the secure generator.
    """
    loaded = load(config) if isinstance(config, str) else config
    pair = neighbours(loaded, attribute)
    scores: Scores = {name: ([], []) for name in STATISTICS}
    manifest: dict = {}
    with contextlib.ExitStack() as stack:
        if workers > 1:
            # the workers' folders inside this process's: removed however the audit ends (a stopped worker
            # removes nothing), once the workers are stopped (the stack's callbacks run last to first)
            within = stack.enter_context(tempfile.TemporaryDirectory(prefix="gedp-audit-"))
            # workers that ignore Ctrl-C, stopped however the audit ends (gedp.running.process.worker_signals)
            pool = stack.enter_context(ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                                           initializer=worker_signals))
            stack.callback(stop_workers, pool)
            with held_stops():
                futures = [pool.submit(audit_runs, loaded, pair, size, noise_factor, _batch_seeds(seed, batch, size),
                                       within) for batch, size in enumerate(_batches(runs))]
            done = (result_of(future) for future in completed(futures))
        else:
            done = (audit_runs(loaded, pair, size, noise_factor, _batch_seeds(seed, batch, size))
                    for batch, size in enumerate(_batches(runs)))
        for batch, manifest in done:
            for name in STATISTICS:
                for side in (0, 1):
                    scores[name][side].extend(batch[name][side])
            for _ in batch[STATISTICS[0]][0]:
                if on_run is not None:
                    on_run()
    claimed = claims(manifest, attribute)
    results = []
    for name in STATISTICS:
        low = mu_lower_bound_at(np.array(scores[name][0]), np.array(scores[name][1]), THRESHOLDS,
                                alpha / len(STATISTICS))
        results.append(StatisticResult(name, claimed[name], low, len(scores[name][1]), low <= claimed[name]))
    return results
