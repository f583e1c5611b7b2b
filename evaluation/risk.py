"""Disclosure risk of released microdata, measured as an attacker would measure it.

The attacks and the scores are those of anonymeter (Giomi et al., "A unified framework for quantifying
privacy risk in synthetic data", PoPETs 2023): each attack is run on records that were used to make
the release (training) and on records that were not (control), and the risk is the attacker's excess
success on training records, (rate - control) / (1 - control), with a Wilson interval on each rate
propagated to the risk. Released microdata keep ``estab_id`` and the public columns, so the attacker
is assumed to know them:

* **inference**: knowing a target's estab_id and public columns, take the nearest released record
  (Gower distance: the share of those columns that differ; ties at random) and guess the target's
  secret from it: its size class (QCEW size classes of m1emp) or its wage decile;
* **singling out**: a predicate made from a released record, its county and NAICS code and one
  protected attribute beyond its value (``>=`` above the attribute's median, ``<=`` otherwise), kept
  when it matches exactly one released record; it succeeds on a set of records when it matches
  exactly one of them;
* **linkability**: two datasets on the same establishments, one with months 1-2 of employment and one
  with month 3 and wages, linked through the released records nearest to each (Gower distance on the
  values scaled by their released range); a link succeeds when both name the same released record.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import stats

from gedp.errors import InputError

if TYPE_CHECKING:
    from gedp.config import Config

#: Lower ends of the QCEW size classes of month-1 employment, and their labels.
SIZE_CLASS_FLOORS = (0, 1, 5, 10, 20, 50, 100, 250, 500, 1000)
SIZE_CLASS_LABELS = ("0", "1-4", "5-9", "10-19", "20-49", "50-99", "100-249", "250-499", "500-999", "1000+")
#: What the size-class figures mean, in the words an agency is told.
PSI_WORDS = "psi = sqrt hides a value among its psi-neighbours, not its size class"
#: What the attacker knows of a target (those present in the microdata).
ATTACKER_KNOWS = ("estab_id", "county", "own", "naics", "naics5", "naics4", "naics3", "sector", "supersector",
                  "domain")
#: The two datasets of the linkability attack.
LINK_COLUMNS = (("m1emp", "m2emp"), ("m3emp", "wage"))
#: The cell and attributes of singling-out predicates.
CELL = ("county", "naics")
SINGLING_ATTRIBUTES = ("m1emp", "m2emp", "m3emp", "wage")
ATTACKS = 2000
CONFIDENCE = 0.95
#: Candidate predicates drawn per wanted singling-out predicate before giving up.
SINGLING_TRIES = 20


@dataclass(frozen=True)
class Rate:
    """Successes of one attack in ``attempts`` tries; ``value`` and ``error`` are the Wilson score
    estimate and the half-width of its interval (anonymeter's ``success_rate``)."""

    successes: int
    attempts: int
    confidence: float = CONFIDENCE

    @property
    def value(self) -> float:
        z2 = _probit(self.confidence) ** 2
        return (self.successes + z2 / 2) / (self.attempts + z2) if self.attempts else math.nan

    @property
    def error(self) -> float:
        z = _probit(self.confidence)
        if not self.attempts:
            return math.nan
        spread = self.successes * (self.attempts - self.successes) / self.attempts
        return z / (self.attempts + z * z) * math.sqrt(spread + z * z / 4)


@dataclass(frozen=True)
class Risk:
    """One attack on training records against the same attack on control records."""

    attack: Rate
    control: Rate

    def interval(self) -> tuple[float, float, float]:
        """The risk (rate - control) / (1 - control) and its interval, all clipped to [0, 1]; the
        error propagates both rates' errors to first order."""
        p, c = self.attack.value, self.control.value
        if not (math.isfinite(p) and math.isfinite(c)) or c >= 1:
            return math.nan, math.nan, math.nan
        risk = (p - c) / (1 - c)
        error = math.hypot(self.attack.error / (1 - c), self.control.error * (p - 1) / (1 - c) ** 2)
        return tuple(min(max(v, 0.0), 1.0) for v in (risk, risk - error, risk + error))  # type: ignore[return-value]

    def row(self) -> dict:
        risk, low, high = self.interval()
        return {"rate": self.attack.value, "control_rate": self.control.value, "risk": risk, "low": low,
                "high": high, "attacks": self.attack.attempts, "control_attacks": self.control.attempts}


def _probit(confidence: float) -> float:
    return float(stats.norm.ppf(0.5 * (1 + confidence)))


def size_class(m1emp: np.ndarray | pd.Series) -> np.ndarray:
    """Index into SIZE_CLASS_LABELS of each month-1 employment, rounded to whole employees first."""
    whole = np.rint(np.maximum(np.asarray(m1emp, dtype=float), 0.0))
    return np.searchsorted(np.array(SIZE_CLASS_FLOORS, dtype=float), whole, side="right") - 1


def decile_edges(values: np.ndarray | pd.Series) -> np.ndarray:
    """The distinct deciles of ``values`` (ties at zero merge the lowest deciles)."""
    return np.unique(np.quantile(np.asarray(values, dtype=float), np.arange(1, 10) / 10))


def decile(values: np.ndarray | pd.Series, edges: np.ndarray) -> np.ndarray:
    return np.searchsorted(edges, np.asarray(values, dtype=float), side="right")


def split_halves(truth: pd.DataFrame, rng: np.random.Generator) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A random half of the establishments (the training records a release is made from) and the
    other half (the control records), each in the input's order."""
    chosen = np.zeros(len(truth), dtype=bool)
    chosen[rng.permutation(len(truth))[: len(truth) // 2]] = True
    return truth[chosen].reset_index(drop=True), truth[~chosen].reset_index(drop=True)


def categorical_codes(frames: list[pd.DataFrame], columns: list[str]) -> list[np.ndarray]:
    """Integer codes of ``columns``, shared by all ``frames`` (equal values, equal codes)."""
    sizes = np.cumsum([0] + [len(f) for f in frames])
    codes = np.column_stack([pd.factorize(pd.concat([f[c].astype(str) for f in frames], ignore_index=True))[0]
                             for c in columns])
    return [codes[sizes[i]:sizes[i + 1]] for i in range(len(frames))]


def nearest(targets: np.ndarray, candidates: np.ndarray, *, categorical: bool, rng: np.random.Generator,
            chunk: int = 64) -> np.ndarray:
    """The candidate row nearest each target row by Gower distance (categorical: the number of columns
    that differ; numeric: the sum of absolute differences scaled by the candidates' range), ties broken
    uniformly at random for each target."""
    scale = np.ones(candidates.shape[1])
    if not categorical:
        spread = candidates.max(axis=0) - candidates.min(axis=0)
        scale = np.where(spread > 0, spread, 1.0)
    scaled = candidates if categorical else candidates / scale
    found = np.empty(len(targets), dtype=np.int64)
    distances = np.empty((chunk, len(candidates)), dtype=np.int16 if categorical else float)  # reused buffers
    terms = np.empty((chunk, len(candidates)), dtype=bool if categorical else float)
    for start in range(0, len(targets), chunk):
        block = targets[start:start + chunk]
        distance, term = distances[:len(block)], terms[:len(block)]
        distance[:] = 0
        for column in range(candidates.shape[1]):
            if categorical:
                np.not_equal(block[:, column, None], scaled[None, :, column], out=term)
            else:
                np.abs(np.subtract(block[:, column, None] / scale[column], scaled[None, :, column], out=term), out=term)
            distance += term
        closest = distance == distance.min(axis=1, keepdims=True)
        rank = np.cumsum(closest, axis=1, dtype=np.int32)
        pick = np.floor(rng.random(len(block)) * rank[:, -1]).astype(np.int32) + 1  # the pick-th closest
        found[start:start + chunk] = np.argmax(closest & (rank == pick[:, None]), axis=1)
    return found


@dataclass(frozen=True)
class Targets:
    """The attacked records with their true values: sampled training records and control records,
    and for each the released record the attacker's nearest-record search picks from what it knows."""

    training: pd.DataFrame
    control: pd.DataFrame
    training_match: np.ndarray  # row of the released microdata (in training order)
    control_match: np.ndarray


def sample_targets(training: pd.DataFrame, control: pd.DataFrame, attacks: int,
                   rng: np.random.Generator) -> Targets:
    """``attacks`` training and control records (all when fewer) and the released record nearest each
    on what the attacker knows (releases of ``training`` hold its records' public columns exactly)."""
    picked = [frame.iloc[rng.choice(len(frame), size=min(attacks, len(frame)), replace=False)]
              for frame in (training, control)]
    known = [c for c in ATTACKER_KNOWS if c in training.columns]
    released, *codes = categorical_codes([training, *picked], known)
    matches = [nearest(target_codes, released, categorical=True, rng=rng) for target_codes in codes]
    return Targets(picked[0], picked[1], matches[0], matches[1])


def inference(released: np.ndarray, targets: Targets, secret_of_training: np.ndarray,
              secret_of_control: np.ndarray) -> Risk:
    """Guess each target's secret as the secret shown by its nearest released record; ``released``
    holds the released secrets in training order, the others the targets' true secrets."""
    return Risk(Rate(int(np.sum(released[targets.training_match] == secret_of_training)), len(secret_of_training)),
                Rate(int(np.sum(released[targets.control_match] == secret_of_control)), len(secret_of_control)))


def linkability(released: pd.DataFrame, targets: Targets, rng: np.random.Generator) -> Risk:
    """Link each target's two column sets (LINK_COLUMNS) through their nearest released records."""
    rates = []
    for frame in (targets.training, targets.control):
        links = [nearest(frame[list(cols)].to_numpy(float), released[list(cols)].to_numpy(float),
                         categorical=False, rng=rng) for cols in LINK_COLUMNS]
        rates.append(Rate(int(np.sum(links[0] == links[1])), len(frame)))
    return Risk(*rates)


def _cell_codes(frames: list[pd.DataFrame]) -> list[np.ndarray]:
    """One integer code per (county, naics) cell, shared by ``frames``."""
    parts = categorical_codes(frames, list(CELL))
    width = max(int(p[:, 1].max(initial=0)) for p in parts) + 1
    return [p[:, 0].astype(np.int64) * width + p[:, 1] for p in parts]


def matching(cells: np.ndarray, values: np.ndarray, query_cells: np.ndarray, query_values: np.ndarray,
             upward: np.ndarray) -> np.ndarray:
    """How many records match each predicate "cell == query cell and value >= (upward) or <= query
    value": one sort and binary searches (values ranked on their joint grid, keyed within the cell)."""
    grid = np.unique(np.concatenate([values, query_values]))
    size = len(grid)
    keys = np.sort(cells * size + np.searchsorted(grid, values))
    base = query_cells * size
    at = base + np.searchsorted(grid, query_values)
    above = np.searchsorted(keys, base + size, "left") - np.searchsorted(keys, at, "left")
    below = np.searchsorted(keys, at, "right") - np.searchsorted(keys, base, "left")
    return np.where(upward, above, below)


def singling_out(released: pd.DataFrame, training: pd.DataFrame, control: pd.DataFrame, attacks: int,
                 rng: np.random.Generator) -> Risk:
    """Predicates that single out one released record (module docstring), tried on the training and
    control records: up to ``attacks`` distinct ones from ``attacks * SINGLING_TRIES`` candidates."""
    attributes = [a for a in SINGLING_ATTRIBUTES if a in released.columns and a in training.columns]
    cells = _cell_codes([released, training, control])
    rows = rng.integers(len(released), size=attacks * SINGLING_TRIES)
    chosen = rng.integers(len(attributes), size=len(rows))
    _, first = np.unique(chosen * len(released) + rows, return_index=True)
    rows, chosen = rows[np.sort(first)], chosen[np.sort(first)]
    single = np.zeros(len(rows), dtype=bool)
    found = {"training": np.zeros(len(rows), dtype=bool), "control": np.zeros(len(rows), dtype=bool)}
    for index, attribute in enumerate(attributes):
        mine = chosen == index
        values = released[attribute].to_numpy(float)
        query = (cells[0][rows[mine]], values[rows[mine]], values[rows[mine]] > np.median(values))
        single[mine] = matching(cells[0], values, *query) == 1
        for name, frame, frame_cells in (("training", training, cells[1]), ("control", control, cells[2])):
            found[name][mine] = matching(frame_cells, frame[attribute].to_numpy(float), *query) == 1
    kept = np.flatnonzero(single)[:attacks]
    return Risk(Rate(int(found["training"][kept].sum()), len(kept)), Rate(int(found["control"][kept].sum()), len(kept)))


#: The releases compared with gedp's: employment step and wage step of each rounding.
ROUNDINGS = ((5, 1_000), (10, 10_000))
EMPLOYMENT = ("m1emp", "m2emp", "m3emp")


@dataclass(frozen=True)
class RiskResult:
    """Each method's risks by attack, the size-class rates behind them and the setup."""

    risks: dict[str, dict[str, Risk]]  # method -> attack -> risk
    training: int
    control: int
    attacks: int
    seed: int
    data_label: str
    release_label: str


def infused(training: pd.DataFrame, s: float, t: float, rng: np.random.Generator) -> pd.DataFrame:
    """Input noise infusion as microdata: every attribute of an establishment times its one secret factor."""
    from gedp.evaluation.baselines.earlier import infusion_factors

    factors = infusion_factors(len(training), s=s, t=t, rng=rng)
    attributes = [a for a in SINGLING_ATTRIBUTES if a in training.columns]
    return training.assign(**{a: training[a].to_numpy(float) * factors for a in attributes})


def rounded(training: pd.DataFrame, employment_step: float, wage_step: float) -> pd.DataFrame:
    """Employment to the nearest ``employment_step``, wages to the nearest ``wage_step``."""
    steps = {**{a: employment_step for a in EMPLOYMENT}, "wage": wage_step}
    return training.assign(**{a: np.rint(training[a].to_numpy(float) / step) * step
                              for a, step in steps.items() if a in training.columns})


def in_training_order(released: pd.DataFrame, training: pd.DataFrame) -> pd.DataFrame:
    """The released records in the order of ``training`` (a release is sorted by its public keys)."""
    return released.set_index("estab_id").loc[training["estab_id"]].reset_index()


def attack_all(released: pd.DataFrame, training: pd.DataFrame, control: pd.DataFrame, targets: Targets,
               attacks: int, rng: np.random.Generator) -> dict[str, Risk]:
    """Every attack on one released microdata (in training order)."""
    def infer(column: str, secret: Callable[[pd.Series], np.ndarray]) -> Risk:
        return inference(secret(released[column]), targets, secret(targets.training[column]),
                         secret(targets.control[column]))

    risks = {"size class": infer("m1emp", size_class)}
    if "wage" in released.columns:
        edges = decile_edges(pd.concat([training["wage"], control["wage"]]))
        risks["wage decile"] = infer("wage", lambda wage: decile(wage, edges))
    risks["singling out"] = singling_out(released, training, control, attacks, rng)
    if all(c in released.columns for cols in LINK_COLUMNS for c in cols):
        risks["linkability"] = linkability(released, targets, rng)
    return risks


def protected_half(training: pd.DataFrame, config: Config, seed: int) -> pd.DataFrame:
    """A gedp release of the training records (``gedp.running.state_pipeline.protect``, PCG64 seeded: the stream
    ``gedp protect --seed`` gives a single state): its protected microdata."""
    from gedp.measure.rng import state_rng
    from gedp.running.state_pipeline import protect

    states = training["state"].unique()
    rng = state_rng(seed, str(states[0])) if len(states) == 1 else np.random.default_rng(seed)
    return protect(training, config, rng=rng).protected


def split_by_release(truth: pd.DataFrame, released: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The records of ``truth`` a release holds (training) and the others (control); InputError when
    the release holds records ``truth`` lacks or leaves no control record."""
    inside = truth["estab_id"].isin(released["estab_id"])
    missing = int((~released["estab_id"].isin(truth["estab_id"])).sum())
    if missing:
        raise InputError(f"the release holds {missing:,} establishments that --data lacks: it was not made from it")
    if inside.all():
        raise InputError("the release holds every establishment of --data, so none is left as a control: release "
                         "a random half (omit --release and gedp evaluate risk makes one)")
    return truth[inside].reset_index(drop=True), truth[~inside].reset_index(drop=True)


def compute_risk(truth: pd.DataFrame, *, released: pd.DataFrame | None = None, config: Config | None = None,
                 attacks: int = ATTACKS, seed: int = 1, infusion: tuple[float, float] = (0.05, 0.15),
                 data_label: str = "", release_label: str = "") -> RiskResult:
    """The risks of gedp's release of a training half of ``truth`` beside noise infusion and rounding
    of the same records. ``released``: the protected microdata of a release of part of ``truth``
    (the rest is the control); None: a random half is protected with ``config`` and seed ``seed``."""
    rng = np.random.default_rng(seed)
    if released is None:
        if config is None:
            raise ValueError("compute_risk needs a release or a config to make one")
        training, control = split_halves(truth, rng)
        released = protected_half(training, config, seed)
    else:
        training, control = split_by_release(truth, released)
    if "m1emp" not in released.columns:
        raise InputError("the release has no m1emp: the risk report infers size classes of month-1 employment")
    targets = sample_targets(training, control, attacks, rng)
    methods = {"gedp release": in_training_order(released, training),
               f"noise infusion (distortion {infusion[0]:g} to {infusion[1]:g})": infused(training, *infusion, rng)}
    for employment_step, wage_step in ROUNDINGS:
        methods[f"rounding (employment to {employment_step}, wages to ${wage_step:,})"] = rounded(
            training, employment_step, wage_step)
    risks = {name: attack_all(frame, training, control, targets, attacks, rng) for name, frame in methods.items()}
    return RiskResult(risks, len(training), len(control), attacks, seed, data_label, release_label)
