"""Employer-employee (ER-EE) privacy on a job frame, and the earlier mechanisms on job marginals.

A job frame has one row per job: the establishment (``estab_id``) and the worker's attributes (QWI
codes). A *job marginal* counts jobs by public workplace attributes (county, sector, ownership, ...)
and worker attributes (sex, education, ...). Its *units* are the pairs (establishment, worker cell):
every establishment crossed with every combination of the marginal's worker attributes, zeros
included, because which worker cells of a workplace cell are empty is itself confidential (Haney et
al. 2017, Section 5.2: input noise infusion leaves zeros at zero and so reveals them).

Neighbors (Haney, Machanavajjhala, Abowd, Graham, Kutzbach & Vilhuber, SIGMOD 2017, Section 7; the
LODES paper's Blowfish policy, Section 4.2). One establishment's workforce E becomes E', E a subset
of E' (or the reverse), with n and n' its job counts by worker category (the full cross product of
the attributes that distinguish workers):

* strong alpha-neighbors (Def. 7.1): |E| <= |E'| <= max((1 + alpha) |E|, |E| + 1);
* weak alpha-neighbors (Def. 7.3): the same bound for every property phi of workers, phi(E) <=
  phi(E') <= max((1 + alpha) phi(E), phi(E) + 1). phi ranges over sets of worker categories (a
  property of a worker's attributes; a phi naming individual new workers would collapse the
  definition to one added worker, which is not what Section 7.1 describes);
* Blowfish (LODES, Eq. 4): one worker added, or every category grows by at most a factor 1 + alpha
  (alpha-closeness read as growth: the text's bound h(S')[v] <= (1 + alpha) h(S)[v] alone would let
  a workforce vanish, contradicting its Lemma 5.5).

Sensitivities (Lemma 8.5; LODES Lemma 5.5): the local sensitivity of a cell is at most
max(alpha x_v, 1) and that bound is (1 + alpha)-smooth, x_v the largest contribution one
establishment can make to the cell: its jobs in the cell under weak neighbors and Blowfish, its
total jobs under strong neighbors (every added worker may land in the one cell). For marginals over
workplace attributes only the two coincide.

Composition (Theorems 7.3-7.5): costs add up (7.3); cells over disjoint establishments compose in
parallel (7.4), so a marginal over workplace attributes costs one cell's eps. Cells that split one
establishment's workers by worker attributes do not compose in parallel under weak privacy (7.5):
one weak neighbor can move every worker cell of an establishment by its full sensitivity at once,
so a marginal with d worker cells answered at eps per cell costs d * eps (Section 8). The LODES
paper claims parallel composition across worker-attribute values for its policy; the same
counterexample applies to Blowfish's per-category growth, so we charge d * eps there too.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from gedp.errors import InputError
from gedp.evaluation.baselines.earlier import CellRelease, log_laplace, noise_infusion, smooth_gamma, smooth_laplace
from gedp.evaluation.baselines.earlier import truncated_laplace as _truncated_laplace
from gedp.measure.queries import Grouping, group_establishments
from gedp.synth.jobs import WORKER_DOMAINS

Privacy = Literal["strong", "weak", "blowfish"]
PRIVACY = ("strong", "weak", "blowfish")


# --- neighbor definitions, on one establishment's job counts by worker category -------------------
def _counts(n: Sequence[float], n2: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    n, n2 = np.asarray(n, dtype=float), np.asarray(n2, dtype=float)
    if n.shape != n2.shape or n.ndim != 1:
        raise ValueError(f"job counts by category must be two vectors of one length; got {n.shape} and {n2.shape}")
    if not all(np.isfinite(v).all() and (v >= 0).all() and (v == np.round(v)).all() for v in (n, n2)):
        raise ValueError("job counts by category must be whole numbers >= 0")
    return n, n2


def _grows(n: np.ndarray, n2: np.ndarray, alpha: float, *, per_category: bool) -> bool:
    """Whether n2 is n plus added workers within the bound (on the total or on every set of categories)."""
    if not (n2 >= n).all() or (n2 == n).all():
        return False
    added = n2 - n
    if not per_category:
        return added.sum() <= max(alpha * n.sum(), 1.0)
    # Every set A of categories: added_A <= max(alpha n_A, 1). Sets adding at most one worker pass;
    # among the others the worst is the one maximizing the excess added_A - alpha n_A.
    excess = added - alpha * n
    positive = excess > 0
    if added[positive].sum() > 1:
        return False  # the categories with positive excess, together, break the bound
    if not positive.any():
        return True
    # One category c with a single added worker has positive excess; joining it with the best other
    # category that gained workers gives the worst set of two or more added workers.
    others = (added > 0) & ~positive
    return not (others.any() and excess[positive].sum() + excess[others].max() > 0)


def strong_neighbors(n: Sequence[float], n2: Sequence[float], alpha: float) -> bool:
    """Strong alpha-neighbors (Def. 7.1): one workforce contains the other and the larger has at most
    max((1 + alpha) |E|, |E| + 1) workers."""
    n, n2 = _counts(n, n2)
    return _grows(n, n2, alpha, per_category=False) or _grows(n2, n, alpha, per_category=False)


def weak_neighbors(n: Sequence[float], n2: Sequence[float], alpha: float) -> bool:
    """Weak alpha-neighbors (Def. 7.3): the bound of Def. 7.1 for every set of worker categories."""
    n, n2 = _counts(n, n2)
    return _grows(n, n2, alpha, per_category=True) or _grows(n2, n, alpha, per_category=True)


def blowfish_neighbors(n: Sequence[float], n2: Sequence[float], alpha: float) -> bool:
    """LODES Blowfish policy (Eq. 4): one worker added or removed, or every category grown by at most
    a factor 1 + alpha."""
    n, n2 = _counts(n, n2)
    small, large = (n, n2) if n2.sum() >= n.sum() else (n2, n)
    if not (large >= small).all() or (large == small).all():
        return False
    return bool(large.sum() - small.sum() == 1 or (large <= (1 + alpha) * small).all())


NEIGHBORS = {"strong": strong_neighbors, "weak": weak_neighbors, "blowfish": blowfish_neighbors}


def marginal_eps(cell_eps: float, worker_cells: int, privacy: Privacy) -> float:
    """Total eps of a marginal answered at ``cell_eps`` per cell with ``worker_cells`` worker cells per
    workplace cell: parallel composition over establishments (Thm. 7.4) and, under strong privacy,
    over disjoint workers of one establishment (Thm. 7.5); otherwise sequential (Thm. 7.3)."""
    _check_privacy(privacy)
    return cell_eps if privacy == "strong" or worker_cells == 1 else worker_cells * cell_eps


def _check_privacy(privacy: str) -> None:
    if privacy not in PRIVACY:
        raise ValueError(f"privacy {privacy!r} is unknown; choose one of {', '.join(PRIVACY)}")


# --- job marginals ----------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class JobMarginal:
    """Units (establishment x worker cell, zeros included) of one marginal and the cells they fall in.

    Attributes:
        workplace_by: public workplace columns of the marginal.
        worker_by: worker attributes of the marginal (() for employment by workplace only).
        grouping: the cells; keys sorted by workplace columns, then worker attributes.
        jobs: jobs of each unit.
        establishment: each unit's row in the establishment table.
        establishment_jobs: each unit's establishment's total jobs.
    """

    workplace_by: tuple[str, ...]
    worker_by: tuple[str, ...]
    grouping: Grouping
    jobs: np.ndarray
    establishment: np.ndarray
    establishment_jobs: np.ndarray

    @property
    def worker_cells(self) -> int:
        """d: the worker cells of each workplace cell (the product of the worker domains)."""
        return math.prod(len(WORKER_DOMAINS[a]) for a in self.worker_by)

    def totals(self) -> np.ndarray:
        """True job count of every cell."""
        return self.grouping.sum(self.jobs)

    def contributions(self, privacy: Privacy) -> np.ndarray:
        """Per unit, the most its establishment can add to the unit's cell in one neighbor step, up to the
        factor alpha: the unit's jobs (weak, Blowfish) or the establishment's jobs (strong)."""
        _check_privacy(privacy)
        return self.establishment_jobs if privacy == "strong" else self.jobs


def worker_codes(jobs: pd.DataFrame, attribute: str) -> np.ndarray:
    """Position of every job's value in ``WORKER_DOMAINS[attribute]``; InputError for an unknown code."""
    if attribute not in WORKER_DOMAINS:
        raise InputError(f"'{attribute}' is not a worker attribute; choose from {', '.join(WORKER_DOMAINS)}")
    if attribute not in jobs.columns:
        raise InputError(f"the job table has no column '{attribute}'")
    codes = pd.Index(WORKER_DOMAINS[attribute]).get_indexer(jobs[attribute].astype(str))
    bad = codes < 0
    if bad.any():
        first = int(np.argmax(bad))
        raise InputError(f"column '{attribute}': codes must be one of {', '.join(WORKER_DOMAINS[attribute])}; "
                         f"first at row {first + 1}")  # never a count of jobs: what ER-EE privacy protects
    return codes.astype(np.int64)


def job_marginal(establishments: pd.DataFrame, jobs: pd.DataFrame, workplace_by: Sequence[str],
                 worker_by: Sequence[str] = ()) -> JobMarginal:
    """The units and cells of the marginal ``workplace_by`` x ``worker_by`` of a job frame."""
    workplace_by, worker_by = tuple(workplace_by), tuple(worker_by)
    position = pd.Index(establishments["estab_id"]).get_indexer(jobs["estab_id"])
    if (position < 0).any():
        first = int(np.argmax(position < 0))
        raise InputError("column 'estab_id': values must be an estab_id of the establishment table; "
                         f"first at row {first + 1}")  # never a count of jobs
    sizes = [len(WORKER_DOMAINS[a]) for a in worker_by]
    d = math.prod(sizes)
    category = np.zeros(len(jobs), dtype=np.int64)
    for attribute, size in zip(worker_by, sizes):
        category = category * size + worker_codes(jobs, attribute)
    n = len(establishments)
    counts = np.bincount(position * d + category, minlength=n * d).astype(float)
    units = establishments[list(workplace_by)].iloc[np.repeat(np.arange(n), d)].reset_index(drop=True)
    for attribute, column in zip(worker_by, zip(*itertools.product(*(WORKER_DOMAINS[a] for a in worker_by)))):
        units[attribute] = np.tile(np.asarray(column), n)
    totals = np.bincount(position, minlength=n).astype(float)
    return JobMarginal(workplace_by, worker_by, group_establishments(units, workplace_by + worker_by), counts,
                       np.repeat(np.arange(n), d), np.repeat(totals, d))


# --- the earlier mechanisms on job marginals --------------------------------------------------------
def job_log_laplace(marginal: JobMarginal, *, eps: float, alpha: float, rng: np.random.Generator) -> CellRelease:
    """Log-Laplace on every cell: (alpha, eps)-ER-EE private per cell for workplace-only marginals,
    weak (alpha, eps)-ER-EE private per cell otherwise (Thm. 8.1); a weak neighbor moves ln(n + 1/alpha)
    by at most ln(1 + alpha), a strong one may not when the cell holds part of a workforce."""
    return log_laplace(marginal.jobs, marginal.grouping, attribute="jobs", eps=eps, alpha=alpha, rng=rng)


def job_smooth_laplace(marginal: JobMarginal, *, eps: float, alpha: float, delta: float, rng: np.random.Generator,
                       privacy: Privacy = "weak", worker_eps: float | None = None) -> CellRelease:
    """Smooth Laplace per cell with the sensitivity of ``privacy`` ((alpha, eps, delta)-ER-EE privacy of
    that kind per cell, Lemma 9.2; with ``worker_eps`` the LODES variant)."""
    return smooth_laplace(marginal.jobs, marginal.grouping, attribute="jobs", eps=eps, alpha=alpha, delta=delta,
                          rng=rng, worker_eps=worker_eps, contributions=marginal.contributions(privacy))


def job_smooth_gamma(marginal: JobMarginal, *, eps: float, alpha: float, rng: np.random.Generator,
                     privacy: Privacy = "weak") -> CellRelease:
    """Smooth Gamma per cell with the sensitivity of ``privacy`` (pure (alpha, eps)-ER-EE privacy of that
    kind per cell, Lemma 8.7)."""
    return smooth_gamma(marginal.jobs, marginal.grouping, attribute="jobs", eps=eps, alpha=alpha, rng=rng,
                        contributions=marginal.contributions(privacy))


def job_truncated_laplace(marginal: JobMarginal, *, eps: float, theta: float,
                          rng: np.random.Generator) -> CellRelease:
    """Truncated Laplace: establishments with theta or more jobs leave every cell; Laplace(theta / eps)
    per cell. eps-node-DP for the whole marginal: the cells of one kept establishment sum to less
    than theta, so adding or removing it moves the marginal by less than theta in L1."""
    return _truncated_laplace(marginal.jobs, marginal.grouping, attribute="jobs", eps=eps, theta=theta, rng=rng,
                              employment=marginal.establishment_jobs)


def job_noise_infusion(marginal: JobMarginal, factors: np.ndarray, *, rng: np.random.Generator) -> CellRelease:
    """Input noise infusion as QWI and LODES apply it: each establishment's one secret factor (``factors``,
    one per establishment row) multiplies all its cells; small cells redrawn, zeros kept."""
    factors = np.asarray(factors, dtype=float)
    if factors.ndim != 1 or (marginal.establishment.size and factors.size <= marginal.establishment.max()):
        raise ValueError(f"{factors.size} factors for {int(marginal.establishment.max()) + 1} establishments")
    return noise_infusion(marginal.jobs, marginal.grouping, factors[marginal.establishment], attribute="jobs",
                          rng=rng)
