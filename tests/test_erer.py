"""ER-EE privacy on job frames (measure/erer.py) against independent computations: the neighbor
definitions against enumeration of every property (set of worker categories), the sensitivities and
the composition rule against brute force over every neighbor of small job frames, the mechanisms'
noise by KS tests with power checks, unbiasedness by simulation.

Statistical checks use fixed seeds and reject at p < 1e-3 (false-failure rate 0.1% per check);
each is paired with a power check that rejects a wrong noise scale (x0.7 or x1.3). Mean checks
compare the mean error with 4 standard errors (false-failure rate 6e-5).
"""

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from gedp.errors import InputError
from gedp.evaluation.baselines.earlier import infusion_factors, quartic_cdf, smooth_sensitivity
from gedp.evaluation.baselines.erer import (
    blowfish_neighbors,
    job_log_laplace,
    job_marginal,
    job_noise_infusion,
    job_smooth_gamma,
    job_smooth_laplace,
    job_truncated_laplace,
    marginal_eps,
    strong_neighbors,
    weak_neighbors,
)

P = 1e-3
WORKPLACE = ("county", "sector")


# --- independent definitions, written from the papers' text ---------------------------------------
def subsets(k):
    return [s for r in range(1, k + 1) for s in itertools.combinations(range(k), r)]


def grows_brute(n, n2, alpha, sets):
    """E subset of E' and phi(E) <= phi(E') <= max((1 + alpha) phi(E), phi(E) + 1) for every phi in sets."""
    if any(b < a for a, b in zip(n, n2)) or list(n) == list(n2):
        return False
    return all(sum(n2[i] for i in s) <= max((1 + alpha) * sum(n[i] for i in s), sum(n[i] for i in s) + 1)
               for s in sets)


def brute_neighbors(n, n2, alpha, kind):
    k = len(n)
    if kind == "blowfish":
        def grows(a, b):
            return (all(y >= x for x, y in zip(a, b)) and list(a) != list(b)
                    and (sum(b) - sum(a) == 1 or all(y <= (1 + alpha) * x for x, y in zip(a, b))))
    else:
        sets = [tuple(range(k))] if kind == "strong" else subsets(k)

        def grows(a, b):
            return grows_brute(a, b, alpha, sets)
    return grows(n, n2) or grows(n2, n)


FUNCTIONS = {"strong": strong_neighbors, "weak": weak_neighbors, "blowfish": blowfish_neighbors}


@pytest.mark.parametrize("alpha", [0.1, 0.5, 1.0])
def test_neighbor_definitions_match_enumeration_of_every_property(alpha):
    vectors = list(itertools.product(range(5), repeat=3))
    found = {kind: set() for kind in FUNCTIONS}
    for n, n2 in itertools.product(vectors, repeat=2):
        for kind, function in FUNCTIONS.items():
            expected = brute_neighbors(n, n2, alpha, kind)
            assert function(n, n2, alpha) == expected, (kind, n, n2)
            if expected:
                found[kind].add((n, n2))
    # Def. 7.3 adds conditions to Def. 7.1; Blowfish's per-category growth implies them
    assert found["blowfish"] <= found["weak"] <= found["strong"]
    if alpha >= 0.5:  # power: with room to grow by more than one worker, the definitions really differ
        assert found["blowfish"] < found["weak"] < found["strong"]


def test_neighbor_definitions_refuse_non_counts():
    with pytest.raises(ValueError, match="whole numbers >= 0"):
        weak_neighbors([1.5, 2], [2, 2], 0.1)
    with pytest.raises(ValueError, match="one length"):
        strong_neighbors([1, 2], [1, 2, 3], 0.1)


# --- a small job frame and every neighbor of it ---------------------------------------------------
#: Four fine worker categories (sex x education E1/E2) per establishment; three establishments in two
#: workplace cells.
CATEGORIES = [("1", "E1"), ("1", "E2"), ("2", "E1"), ("2", "E2")]
COUNTS = np.array([[3, 1, 0, 4], [1, 0, 2, 2], [6, 3, 4, 0]])
ESTABS = pd.DataFrame({"estab_id": ["a", "b", "c"], "county": ["001", "001", "003"], "sector": ["23", "23", "23"]})


def jobs_from(counts, estab_ids=("a", "b", "c")):
    rows = [(estab_ids[e], sex, edu) for e in range(len(counts)) for c, (sex, edu) in enumerate(CATEGORIES)
            for _ in range(int(counts[e][c]))]
    return pd.DataFrame(rows, columns=["estab_id", "sex", "education"])


def by_key(counts, worker_by, how):
    """Per cell key (county, sector, worker values): the sum ("total") or largest ("largest") over
    establishments of their jobs in the cell; for "strong", per workplace key (county, sector), the
    largest total of an establishment there (any worker cell of it can receive all added workers)."""
    out = {}
    for e, (county, sector) in enumerate(zip(ESTABS["county"], ESTABS["sector"])):
        if how == "strong":
            out[(county, sector)] = max(out.get((county, sector), 0), sum(counts[e]))
            continue
        mine = {}
        for c, (sex, education) in enumerate(CATEGORIES):
            key = (county, sector, *({"sex": sex, "education": education}[a] for a in worker_by))
            mine[key] = mine.get(key, 0) + counts[e][c]
        for key, value in mine.items():
            out[key] = out.get(key, 0) + value if how == "total" else max(out.get(key, 0), value)
    return out


def aligned(table, marginal):
    """``table`` in the order of the marginal's cells (keys absent: 0; workplace keys cover their cells)."""
    rows = [tuple(row) for row in marginal.grouping.keys.itertuples(index=False)]
    return np.array([table.get(row, table.get(row[:2], 0)) for row in rows], dtype=float)


def every_neighbor(counts, alpha, kind):
    """Every neighbor job table: one establishment's counts changed to any vector the definition allows."""
    for e in range(len(counts)):
        extra = int(alpha * counts[e].sum()) + 1
        for n2 in itertools.product(*(range(c + extra + 1) for c in counts[e])):
            if brute_neighbors(tuple(counts[e]), n2, alpha, kind):
                changed = counts.copy()
                changed[e] = n2
                yield changed


@pytest.mark.parametrize("worker_by", [(), ("sex",), ("sex", "education")])
@pytest.mark.parametrize("kind", ["strong", "weak", "blowfish"])
def test_smooth_sensitivity_bounds_every_neighbor_and_is_smooth(kind, worker_by):
    alpha = 0.5
    marginal = job_marginal(ESTABS, jobs_from(COUNTS), WORKPLACE, worker_by)
    privacy = "strong" if kind == "strong" else "weak"
    bound = smooth_sensitivity(marginal.contributions(privacy), marginal.grouping, alpha)
    truth = marginal.totals()
    np.testing.assert_array_equal(truth, aligned(by_key(COUNTS, worker_by, "total"), marginal))
    local = np.zeros_like(truth)
    how = "strong" if kind == "strong" else "largest"
    for neighbor in every_neighbor(COUNTS, alpha, kind):
        local = np.maximum(local, np.abs(aligned(by_key(neighbor, worker_by, "total"), marginal) - truth))
        # smoothness (Lemma 8.5): the bound changes by at most a factor 1 + alpha between neighbors
        moved = np.maximum(alpha * aligned(by_key(neighbor, worker_by, how), marginal), 1.0)
        assert (moved <= (1 + alpha) * bound + 1e-12).all() and (bound <= (1 + alpha) * moved + 1e-12).all()
    assert (local <= bound + 1e-12).all()
    if kind == "strong" or len(worker_by) == 2:
        # attained where alpha x_v is whole (for weak neighbors only on the finest cells: a coarser cell's
        # growth is also limited by each of its categories)
        assert (local == bound).any()
    if kind == "strong" and worker_by:
        weak_bound = smooth_sensitivity(marginal.contributions("weak"), marginal.grouping, alpha)
        assert (local > weak_bound).any()  # power: the weak sensitivity does not cover strong neighbors


@pytest.mark.parametrize("kind", ["strong", "weak"])
def test_composition_over_worker_cells_brute_force(kind):
    """The largest sum over a marginal's cells of |change| / sensitivity, over all neighbors: at most 1
    for strong neighbors (the marginal costs one cell's eps, Thm. 7.5), up to the number of worker
    cells for weak ones (d * eps, Thm. 7.3)."""
    alpha = 1.0  # alpha n_c is whole for every count: each cell can move by its full sensitivity
    counts = np.array([[2, 1, 3, 1], [1, 1, 1, 1], [2, 2, 1, 4]])
    worker_by = ("sex", "education")
    marginal = job_marginal(ESTABS, jobs_from(counts), WORKPLACE, worker_by)
    privacy = "strong" if kind == "strong" else "weak"
    bound = smooth_sensitivity(marginal.contributions(privacy), marginal.grouping, alpha)
    truth = marginal.totals()
    worst = max(np.sum(np.abs(aligned(by_key(n, worker_by, "total"), marginal) - truth) / bound)
                for n in every_neighbor(counts, alpha, kind))
    d = marginal.worker_cells
    if kind == "strong":
        assert worst <= 1 + 1e-12
        assert marginal_eps(0.5, d, "strong") == 0.5
    else:
        assert len(CATEGORIES) <= worst <= d  # every occupied worker cell moves by its full sensitivity at once
        assert marginal_eps(0.5, d, "weak") == pytest.approx(0.5 * d)


def test_log_laplace_sensitivity_on_job_cells():
    """ln(n + 1/alpha) moves by at most ln(1 + alpha) under weak neighbors, not under strong ones."""
    alpha = 0.5
    worker_by = ("sex", "education")
    marginal = job_marginal(ESTABS, jobs_from(COUNTS), WORKPLACE, worker_by)
    log_truth = np.log(marginal.totals() + 1 / alpha)

    def largest_move(kind):
        return max(np.abs(np.log(aligned(by_key(n, worker_by, "total"), marginal) + 1 / alpha) - log_truth).max()
                   for n in every_neighbor(COUNTS, alpha, kind))

    assert largest_move("weak") <= math.log1p(alpha) + 1e-12
    assert largest_move("blowfish") <= math.log1p(alpha) + 1e-12
    assert largest_move("strong") > math.log1p(alpha) + 0.1  # power


def test_truncated_marginal_moves_less_than_theta_when_an_establishment_leaves():
    theta = 9.0
    marginal = job_marginal(ESTABS, jobs_from(COUNTS), WORKPLACE, ("sex", "education"))
    kept = np.where(marginal.establishment_jobs < theta, marginal.jobs, 0.0)
    truncated = marginal.grouping.sum(kept)
    for e in range(len(ESTABS)):
        without = COUNTS.copy()
        without[e] = 0  # node-DP neighbor: the establishment and its jobs gone (its public row kept)
        other = job_marginal(ESTABS, jobs_from(without), WORKPLACE, ("sex", "education"))
        moved = np.abs(other.grouping.sum(np.where(other.establishment_jobs < theta, other.jobs, 0.0)) - truncated)
        assert moved.sum() < theta
    assert COUNTS.sum(axis=1).max() >= theta  # power: one establishment is large enough to be dropped


# --- job marginals -----------------------------------------------------------------------------------
def test_job_marginal_cells_against_groupby():
    jobs = jobs_from(COUNTS)
    marginal = job_marginal(ESTABS, jobs, WORKPLACE, ("sex", "education"))
    merged = jobs.merge(ESTABS, on="estab_id")
    expected = merged.groupby([*WORKPLACE, "sex", "education"]).size()
    keys = marginal.grouping.keys
    assert len(keys) == ESTABS.groupby(list(WORKPLACE)).ngroups * 2 * 5  # every worker cell, zeros included
    got = pd.Series(marginal.totals(), index=pd.MultiIndex.from_frame(keys))
    assert got[got > 0].to_dict() == {k: float(v) for k, v in expected.items()}
    assert got.sum() == len(jobs)
    np.testing.assert_array_equal(np.unique(marginal.establishment_jobs[marginal.establishment == 2]),
                                  [COUNTS[2].sum()])


def test_job_marginal_refuses_unknown_establishments_and_codes():
    jobs = jobs_from(COUNTS)
    with pytest.raises(InputError,
                       match="'estab_id': values must be an estab_id of the establishment table; first at row 3$"):
        job_marginal(ESTABS, jobs.assign(estab_id=jobs["estab_id"].where(jobs.index != 2, "zz")), WORKPLACE)
    with pytest.raises(InputError, match="'education': codes must be one of E1, E2, E3, E4, E5; first at row 1$"):
        job_marginal(ESTABS, jobs.assign(education=jobs["education"].where(jobs.index > 1, "E9")), WORKPLACE,
                     ("education",))


# --- the mechanisms' noise -------------------------------------------------------------------------
def repeated_frame(copies):
    """``copies`` workplace cells, each with two establishments holding the jobs of COUNTS[0] and COUNTS[1]."""
    estabs = pd.DataFrame({"estab_id": np.arange(2 * copies), "county": np.repeat(np.arange(copies), 2),
                           "sector": "23"})
    one = jobs_from(COUNTS[:2], estab_ids=(0, 1))
    shift = np.repeat(2 * np.arange(copies), len(one))
    jobs = pd.DataFrame({"estab_id": np.tile(one["estab_id"].to_numpy(), copies) + shift,
                         "sex": np.tile(one["sex"].to_numpy(), copies),
                         "education": np.tile(one["education"].to_numpy(), copies)})
    return estabs, jobs


@pytest.fixture(scope="module")
def repeated():
    estabs, jobs = repeated_frame(20_000)
    return job_marginal(estabs, jobs, WORKPLACE, ("sex", "education"))


def cell_noise(release, marginal, sex, education):
    keys = marginal.grouping.keys
    chosen = ((keys["sex"] == sex) & (keys["education"] == education)).to_numpy()
    return (release.released - marginal.totals())[chosen]


def laplace_p(noise, scale):
    return stats.kstest(noise, "laplace", args=(0, scale)).pvalue


@pytest.mark.parametrize("privacy", ["weak", "strong"])
def test_job_smooth_laplace_scale_per_cell(repeated, privacy):
    """Cell (sex 2, E2) holds the last category of both establishments; cell (sex 2, E3) none."""
    eps, alpha, delta = 4.0, 0.25, 0.05
    release = job_smooth_laplace(repeated, eps=eps, alpha=alpha, delta=delta, privacy=privacy,
                                 rng=np.random.default_rng(1))
    largest_total = COUNTS[:2].sum(axis=1).max()
    largest = COUNTS[:2, 3].max() if privacy == "weak" else largest_total
    noise = cell_noise(release, repeated, "2", "E2")
    scale = max(alpha * largest, 1) / (eps / 2)
    assert laplace_p(noise, scale) > P
    assert laplace_p(noise, 0.7 * scale) < P and laplace_p(noise, 1.3 * scale) < P
    assert abs(noise.mean()) < 4 * noise.std() / math.sqrt(noise.size)  # unbiased
    empty = cell_noise(release, repeated, "2", "E3")  # no jobs: sensitivity 1 (weak), alpha x total (strong)
    empty_scale = max(1.0 if privacy == "weak" else alpha * largest_total, 1.0) / (eps / 2)
    assert laplace_p(empty, empty_scale) > P and laplace_p(empty, 1.3 * empty_scale) < P


def test_job_smooth_gamma_scale_and_unbiased(repeated):
    eps, alpha = 4.0, 0.1
    eps1 = eps - 5 * math.log1p(alpha)
    release = job_smooth_gamma(repeated, eps=eps, alpha=alpha, rng=np.random.default_rng(2))
    z = cell_noise(release, repeated, "1", "E1") / (max(alpha * COUNTS[:2, 0].max(), 1) / (eps1 / 5))
    assert stats.kstest(z, quartic_cdf).pvalue > P
    assert stats.kstest(z * 0.7, quartic_cdf).pvalue < P and stats.kstest(z * 1.3, quartic_cdf).pvalue < P
    assert abs(z.mean()) < 4 * z.std() / math.sqrt(z.size)


def test_job_log_laplace_noise_on_the_log_scale(repeated):
    eps, alpha = 2.0, 0.2
    release = job_log_laplace(repeated, eps=eps, alpha=alpha, rng=np.random.default_rng(3))
    truth = repeated.totals()
    eta = np.log(release.released + 1 / alpha) - np.log(truth + 1 / alpha)
    lam = 2 * math.log1p(alpha) / eps
    assert laplace_p(eta, lam) > P and laplace_p(eta, 0.7 * lam) < P and laplace_p(eta, 1.3 * lam) < P


def test_job_truncated_laplace_drops_by_establishment_total(repeated):
    """theta between the two establishments' totals: the larger leaves every cell, even those where it
    has fewer than theta jobs."""
    eps = 1.0
    theta = COUNTS[:2].sum(axis=1).min() + 1.0
    release = job_truncated_laplace(repeated, eps=eps, theta=theta, rng=np.random.default_rng(4))
    keys = repeated.grouping.keys
    chosen = ((keys["sex"] == "1") & (keys["education"] == "E1")).to_numpy()
    kept = COUNTS[np.argmin(COUNTS[:2].sum(axis=1)), 0]
    assert laplace_p(release.released[chosen] - kept, theta / eps) > P
    assert laplace_p(release.released[chosen] - COUNTS[:2, 0].sum(), theta / eps) < P  # power: the rest is gone


def test_job_noise_infusion_one_factor_per_establishment_reveals_the_shape():
    """Section 5.2: a workplace cell with one establishment publishes its shape exactly (all cells times f)."""
    estabs = pd.DataFrame({"estab_id": ["a", "b", "c"], "county": ["001", "001", "003"], "sector": "23"})
    marginal = job_marginal(estabs, jobs_from(COUNTS), WORKPLACE, ("sex", "education"))
    factors = infusion_factors(3, s=0.05, t=0.15, rng=np.random.default_rng(5))
    release = job_noise_infusion(marginal, factors, rng=np.random.default_rng(6))
    truth = marginal.totals()
    keys = marginal.grouping.keys
    alone = (keys["county"] == "003").to_numpy() & (truth >= 2.5)
    np.testing.assert_allclose(release.released[alone] / truth[alone], factors[2])
    assert (release.released[truth == 0] == 0).all()
    small = (truth > 0) & (truth < 2.5)
    assert set(release.released[small]) <= {1.0, 2.0}
    shared = (keys["county"] == "001").to_numpy() & (truth >= 2.5)
    expected = marginal.grouping.sum(marginal.jobs * factors[marginal.establishment])[shared]
    np.testing.assert_allclose(release.released[shared], expected)


def test_job_noise_infusion_is_unbiased_above_the_small_cell_limit(repeated):
    means = []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        factors = infusion_factors(40_000, s=0.05, t=0.15, rng=rng)
        means.append(cell_noise(job_noise_infusion(repeated, factors, rng=rng), repeated, "2", "E2"))
    noise = np.concatenate(means)
    assert abs(noise.mean()) < 4 * noise.std() / math.sqrt(noise.size)
    assert noise.std() > 0.05 * COUNTS[:2, 3].max()  # power: every cell is distorted by at least s
