"""Wage priors of implicates against independent computations: the size-wage slope of the draws against
the slope of a simulated population (and the flat-within-band prior refused), the bootstrap replicates'
weights against the NPMLE optimality conditions, the size shift against its definition."""

import numpy as np
import pytest

from gedp.measure.neighbors import make_psi
from gedp.postprocess.implicates import PosteriorModel, StateAnswers
from gedp.postprocess.wage_priors import SIZE_EDGES, line, no_shift, size_shift


def simulated_state(slope: float, n: int, seed: int, month_sd: float = 0.05):
    """n establishments of whole employment E (log-uniform on 1..80, every month alike) whose log wage
    per employee is 7.5 + slope log E + N(0, 0.3^2), measured in sqrt scale with sd 0.05 (months) and
    25 (wages: 2 sd / sqrt(w), the wage's relative sd, is about 90% at one employee and 15% at 80)."""
    rng = np.random.default_rng(seed)
    employment = np.rint(np.exp(rng.uniform(0, np.log(80), n)))
    z = 7.5 + slope * np.log(employment) + 0.3 * rng.standard_normal(n)
    wage = employment * np.exp(z)
    months = np.sqrt(employment)[:, None] + month_sd * rng.standard_normal((n, 3))
    answers = StateAnswers(months, np.full(3, month_sd), np.sqrt(wage) + 25 * rng.standard_normal(n), 25.0,
                           np.zeros(n, dtype=int))
    return answers, employment, z


def slope_of(z: np.ndarray, employment: np.ndarray) -> float:
    """OLS slope of z on log E over finite z (a draw of w = 0, kept by the prior's atom, has none)."""
    kept = np.isfinite(z)
    assert kept.mean() > 0.99
    return float(np.polyfit(np.log(employment[kept]), z[kept], 1)[0])


def slope_within_bands(z: np.ndarray, employment: np.ndarray) -> float:
    """The same slope with a fixed effect per size band of the wage priors (z and log E centred in each)."""
    kept = np.isfinite(z)
    band = np.searchsorted(SIZE_EDGES, employment[kept])
    log_e = np.log(employment[kept])

    def centred(x: np.ndarray) -> np.ndarray:
        return x - (np.bincount(band, weights=x) / np.bincount(band))[band]

    x, y = centred(log_e), centred(z[kept])
    return float(x @ y / (x @ x))


@pytest.mark.parametrize("slope", [0.1, 0.6])
def test_drawn_wages_keep_the_size_wage_slope_within_bands(slope):
    answers, employment, z = simulated_state(slope, 20_000, seed=int(slope * 10))
    model = PosteriorModel(answers, make_psi("sqrt", a=0.0), np.random.default_rng(1))
    rows = np.arange(len(employment))
    rng = np.random.default_rng(2)
    months = np.column_stack([employment] * 3)
    with np.errstate(divide="ignore"):
        drawn = np.log(model.wages(rows, months, rng) / employment)
    # The slope's sampling sd at n = 20,000 (residual sd <= 0.6 with the posterior's spread, log E's sd
    # 1.26) is about 0.004; 0.03 is 7 of them, and 5-30% of the slopes tested. Within bands (log E's sd
    # there about 0.3) its sd is about 0.02; 0.1 is 5 of them.
    assert abs(slope_of(drawn, employment) - slope_of(z, employment)) < 0.03
    assert abs(slope_within_bands(drawn, employment) - slope_within_bands(z, employment)) < 0.1
    if slope < 0.5:
        return  # a slope of 0.1 within bands is too small (its sd is 0.02) to tell the flat fit apart
    # Power: the same fit flat within each size band (no shift) loses a fifth of the slope within bands
    # (measured 0.11 of 0.59, sd 0.02: 0.05 is 3 sds below that).
    model.priors.wage_shift = no_shift(1)
    model._fit_wages(rows, employment, rng)
    with np.errstate(divide="ignore"):
        flat = np.log(model.wages(rows, months, rng) / employment)
    assert slope_within_bands(z, employment) - slope_within_bands(flat, employment) > 0.05


def test_drawn_sizes_and_wages_keep_the_slope_when_sizes_are_noisy():
    """Months measured with the shipped plan's noise (sd 0.5 in sqrt scale: a size of 4 is known to
    about +-50%): the draws' sizes and wages jointly. A shift placed from drawn sizes (the division bias:
    a size drawn too large makes its wage per employee too small) would make this slope about 0.5 lower
    (the mean log size's reliability in the smallest bands is about 0.5)."""
    answers, employment, z = simulated_state(0.6, 20_000, seed=6, month_sd=0.5)
    model = PosteriorModel(answers, make_psi("sqrt", a=0.0), np.random.default_rng(1))
    rows, rng = np.arange(len(employment)), np.random.default_rng(2)
    months = next(model.months_chain(rows, rng, 8, 1))
    average = months.mean(axis=1)
    employing = average > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        drawn = np.log(model.wages(rows, months, rng) / average)
    # Sampling sd of the slope about 0.005; what is left is the joint draw's error, measured 0.05 (8%).
    assert abs(slope_of(drawn[employing], average[employing]) - slope_of(z, employment)) < 0.08


def sectors_in_supersectors(n: int, seed: int):
    """n establishments in 4 sectors, two to a supersector (sectors 0, 1 and 2, 3), whose log wage per
    employee is the sector's level + 0.3 log E + N(0, 0.3^2); within each supersector the sector of
    higher level has smaller establishments (E log-uniform on 1..40 against 3..200), so the sizes of the
    two overlap and a supersector's relation of wage to size (slope 0.16) is not a sector's (0.3).
    Measured as ``simulated_state`` with the shipped plan's month noise (sd 0.5 in sqrt scale)."""
    rng = np.random.default_rng(seed)
    sector = rng.integers(0, 4, n)
    low, high = np.log([1.0, 3.0, 1.0, 3.0])[sector], np.log([40.0, 200.0, 40.0, 200.0])[sector]
    employment = np.rint(np.exp(rng.uniform(low, high)))
    z = np.array([8.0, 7.2, 7.6, 6.9])[sector] + 0.3 * np.log(employment) + 0.3 * rng.standard_normal(n)
    months = np.sqrt(employment)[:, None] + 0.5 * rng.standard_normal((n, 3))
    wage_answers = np.sqrt(employment * np.exp(z)) + 25 * rng.standard_normal(n)
    return sector, employment, z, months, wage_answers


def implicate_slopes(answers: StateAnswers, effects: np.ndarray, m: int, seed: int) -> np.ndarray:
    """The slope of log wage per employee on log employment with a fixed effect per ``effects`` group
    (``microdata_stats.within_slope``) on each of m implicates drawn as ``release.implicates`` draws them
    (a draw of the priors each, the chain's months, wages given them) from ``answers``."""
    from gedp.evaluation.microdata_stats import within_slope
    from gedp.postprocess.implicates import BURN_IN

    model = PosteriorModel(answers, make_psi("sqrt", a=0.0), np.random.default_rng(seed))
    rows, rng = np.arange(len(effects)), np.random.default_rng(seed + 1)
    priors = [model.replicate(rng) for _ in range(m)]
    slopes = []
    for prior, drawn in zip(priors, model.months_chain(rows, rng, BURN_IN, m, priors=priors)):
        average, wages = drawn.mean(axis=1), model.wages(rows, drawn, rng, prior)
        kept = (average >= 1) & (wages > 0)  # the statistic's rows
        slopes.append(within_slope(np.log(average[kept]), np.log(wages[kept] / average[kept]), effects[kept])[0])
    return np.array(slopes)


@pytest.mark.slow
def test_implicates_keep_the_slope_with_sector_effects_and_a_supersector_model_does_not():
    """The size-wage slope with sector effects of the population against Rubin's combined estimate over
    M = 10 implicates: for posterior draws (estimate - truth) / sqrt(T) is t with M - 1 degrees of
    freedom (u = 0: the slope of this population), so |t| above its 1 - 1e-3 two-sided quantile (4.8)
    is a false failure in 1 run in 1,000. Power: the wage model grouped by supersector (the former
    model) draws a small establishment's wage at its supersector's level for its size, which is a mix
    of the two sectors' levels; measured 8 sqrt(T) (18%) low at M = 5, 1 sqrt(T) (2%) with sectors."""
    from scipy import stats

    from gedp.evaluation.microdata_stats import within_slope
    from gedp.postprocess.combine import combine

    population = sectors_in_supersectors(20_000, seed=3)
    sector, employment, z = population[:3]
    truth = within_slope(np.log(employment), z, sector)[0]
    m = 10
    limit = stats.t.ppf(1 - 0.5e-3, m - 1)

    _, _, _, months, wage_answers = population

    def t_statistic(groups: np.ndarray) -> float:
        answers = StateAnswers(months, np.full(3, 0.5), wage_answers, 25.0, groups)
        combined = combine(implicate_slopes(answers, sector, m, seed=7))
        return float((combined.estimate - truth) / np.sqrt(combined.variance))

    assert abs(t_statistic(sector)) < limit
    assert abs(t_statistic(sector // 2)) > limit


def test_bootstrap_wage_priors_are_optimal_for_their_weights():
    answers, employment, _ = simulated_state(0.4, 4000, seed=5)
    model = PosteriorModel(answers, make_psi("sqrt", a=0.0), np.random.default_rng(3))
    rng = np.random.default_rng(4)
    counts = rng.exponential(size=len(model.wage_fit.likelihood))
    replicate = model.wage_fit.solve(counts, start=model.priors.wage_weights)
    for key, rows in model.wage_fit.rows.items():
        likelihood, c = model.wage_fit.likelihood[rows], counts[rows]
        w = replicate[key]
        # KKT of max sum c_i log(L_i . w) on the simplex: d_k = sum c_i L_ik / (L_i . w) / sum c <= 1 for
        # every point, and = 1 where w_k > 0; the certified gap of 0.01 nat bounds how far off 1 it is.
        gradient = likelihood.T @ (c / (likelihood @ w)) / c.sum()
        assert gradient.max() < 1.02
        assert np.all(np.abs(gradient[w > 1e-4] - 1) < 0.02)
        # Power: the fitted prior (for unit weights) is not optimal for these weights.
        fitted = model.priors.wage_weights[key]
        assert (likelihood.T @ (c / (likelihood @ fitted)) / c.sum()).max() > 1.0 + 1e-3


def test_size_shift_is_each_sectors_line_held_within_its_bounds():
    shift = (np.array([[0.5, 0.2], [-1.0, 0.6]]), np.array([0.0, np.log(100.0)]))
    average = np.array([0.5, 1.0, 10.0, 1000.0, 10.0])
    group = np.array([0, 0, 0, 1, 1])
    assert np.allclose(size_shift(average, group, shift),
                       [0.5, 0.5, 0.5 + 0.2 * np.log(10.0), -1.0 + 0.6 * np.log(100.0), -1.0 + 0.6 * np.log(10.0)])
    assert np.allclose(size_shift(average, group, no_shift(2)), 0.0)


def test_weighted_line_against_least_squares():
    rng = np.random.default_rng(3)
    x, y, w = rng.normal(size=20), rng.normal(size=20), rng.uniform(1, 5, 20)
    design = np.column_stack([np.ones(20), x]) * np.sqrt(w)[:, None]
    assert np.allclose(line(x, y, w), np.linalg.lstsq(design, y * np.sqrt(w), rcond=None)[0])
    assert np.allclose(line(np.ones(3), np.arange(3.0), np.ones(3)), [1.0, 0.0])


def exact_cell_posterior(omega, sd, average, shift_value, prior):
    """P(cell k | omega) over the z grid's cells and w = 0 (last), straight from the definition: prior
    weight times the normal density of omega at psi(E e^(s + z_k)) (sqrt scale), normalised."""
    from scipy import stats

    from gedp.postprocess.wage_priors import WAGE_Z

    points = np.append(np.sqrt(average * np.exp(shift_value + WAGE_Z)), 0.0)
    weight = prior * stats.norm.pdf(omega, points, sd)
    return weight / weight.sum()


@pytest.mark.parametrize("omega, average", [(170.0, 3.0), (40.0, 1.0), (900.0, 45.0), (5.0, 2.0)])
def test_wage_residual_draws_follow_the_exact_cell_posterior(omega, average):
    """draw_residuals (points x rows, in blocks, weights below e^-700 of the largest set to it) against
    the posterior computed from its definition: a chi-square test of the drawn cells (p < 1e-4: a false
    failure in fewer than 1 run in 10,000 per case), a uniform position within the cell (KS, p < 1e-4),
    and power: the same draws against the posterior of a wage sd 1.3x as large are refused."""
    from scipy import stats

    from gedp.postprocess.wage_priors import WAGE_Z, draw_residuals

    rng = np.random.default_rng(8)
    n, sd, groups, bands = 40_000, 68.0, 3, 4
    table = rng.dirichlet(np.full(len(WAGE_Z) + 1, 0.3), size=(groups, bands))
    shift = (np.array([[0.0, 0.1], [0.2, -0.05], [-0.3, 0.2]]), np.array([-1.0, 7.0]))
    group, band = np.full(n, 1), np.full(n, 2)
    r = draw_residuals(make_psi("sqrt", a=0.0), np.full(n, omega), sd, np.full(n, average), group, band, table,
                       shift, rng)
    step = WAGE_Z[1] - WAGE_Z[0]
    cell = np.where(np.isfinite(r), np.rint((np.where(np.isfinite(r), r, 0.0) - WAGE_Z[0]) / step), len(WAGE_Z))
    drawn = np.bincount(cell.astype(int), minlength=len(WAGE_Z) + 1)
    s = float(size_shift(np.array([average]), np.array([1]), shift)[0])

    def chi_square_p(probability):
        expected = n * probability
        big = expected >= 5
        observed = np.append(drawn[big], drawn[~big].sum())
        expected = np.append(expected[big], expected[~big].sum())
        keep = expected > 0
        return stats.chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum()).pvalue

    prior = table[1, 2]
    assert chi_square_p(exact_cell_posterior(omega, sd, average, s, prior)) > 1e-4
    within = (r[np.isfinite(r)] - WAGE_Z[cell[np.isfinite(r)].astype(int)]) / step + 0.5
    assert stats.kstest(within, "uniform").pvalue > 1e-4
    assert chi_square_p(exact_cell_posterior(omega, 1.3 * sd, average, s, prior)) < 1e-4


def cells_of_levels(n: int, seed: int):
    """n establishments in 1,000 county x NAICS-6 cells of two sectors. Each cell has a size scale mu
    (log-uniform on 1.5..60 employees: E = exp(mu + N(0, 0.8^2)), whole, at least 1) and a level that
    falls with it: log wage per employee = the sector's level - 0.5 mu + 0.25 N(0, 1) (the cell's) +
    0.6 log E + 0.3 N(0, 1). Within cells the slope is 0.6; across cells (with sector effects) about
    0.35: a prior that knows only the sector draws a small establishment at the level of its sector's
    small establishments, not its cell's. Measured with the shipped plan's noise (``sectors_in_supersectors``)."""
    rng = np.random.default_rng(seed)
    cells = 1000
    cell = rng.integers(0, cells, n)
    mu = rng.uniform(np.log(1.5), np.log(60.0), cells)
    level = np.array([7.6, 7.2])[np.arange(cells) % 2] - 0.5 * mu + 0.25 * rng.standard_normal(cells)
    employment = np.maximum(1.0, np.rint(np.exp(mu[cell] + 0.8 * rng.standard_normal(n))))
    z = level[cell] + 0.6 * np.log(employment) + 0.3 * rng.standard_normal(n)
    months = np.sqrt(employment)[:, None] + 0.5 * rng.standard_normal((n, 3))
    wage_answers = np.sqrt(employment * np.exp(z)) + 25 * rng.standard_normal(n)
    return cell % 2, cell, employment, z, months, wage_answers


@pytest.mark.slow
def test_implicates_keep_the_slope_within_cells_and_the_model_without_cell_offsets_does_not():
    """The size-wage slope within cells of the population against Rubin's combined estimate over M = 10
    implicates (u = 0): |estimate - truth| / sqrt(T) below t_9's 1 - 1e-3 two-sided quantile (4.8: a
    false failure in 1 run in 1,000 for posterior draws). Power: the wage model without the cells'
    offsets (each small establishment at its sector's level for its size) is refused."""
    from scipy import stats

    from gedp.evaluation.microdata_stats import within_slope
    from gedp.postprocess.combine import combine

    population = cells_of_levels(20_000, seed=4)
    sector, cell, employment, z, months, wage_answers = population
    truth = within_slope(np.log(employment), z, cell)[0]
    m = 10
    limit = stats.t.ppf(1 - 0.5e-3, m - 1)

    def t_statistic(cells: np.ndarray | None) -> float:
        """With the cells' offsets (``cells``) or without (None: the model before them)."""
        answers = StateAnswers(months, np.full(3, 0.5), wage_answers, 25.0, sector, cells)
        combined = combine(implicate_slopes(answers, cell, m, seed=7))
        return float((combined.estimate - truth) / np.sqrt(combined.variance))

    assert abs(t_statistic(cell)) < limit
    assert abs(t_statistic(None)) > limit


def test_offset_likelihood_is_the_prior_slid_along_the_answers_likelihood():
    """Each row's likelihood of its cell's offset c against the definition: sum over the residual
    prior's points of its weight times the normal density of the wage answer at psi(E e^(s + c + r))
    (and at w = 0), computed for each c directly; power: the prior slid the other way is refused."""
    from scipy import stats

    from gedp.postprocess.wage_priors import CELL_OFFSETS, WAGE_Z, WAGE_Z_CELLS, offset_likelihood

    rng = np.random.default_rng(5)
    psi = make_psi("sqrt", a=0.0)
    table = rng.dirichlet(np.full(len(WAGE_Z) + 1, 0.5), size=(2, 3))
    omega, average, s, sd = np.array([300.0, 60.0, 900.0]), np.array([4.0, 1.0, 60.0]), np.array([0.3, -0.2, 0.1]), 40.0
    group, band = np.array([0, 1, 1]), np.array([2, 0, 1])
    points = np.column_stack([psi(average[:, None] * np.exp(s[:, None] + WAGE_Z_CELLS[None, :])), np.zeros(3)])
    likelihood = stats.norm.pdf(omega[:, None], points, sd)
    got = offset_likelihood(likelihood, group, band, table)
    for i in range(3):
        prior = table[group[i], band[i]]
        expected = [prior[:-1] @ stats.norm.pdf(omega[i], psi(average[i] * np.exp(s[i] + c + WAGE_Z)), sd)
                    + prior[-1] * stats.norm.pdf(omega[i], 0.0, sd) for c in CELL_OFFSETS]
        assert np.allclose(got[i], expected, rtol=1e-9, atol=1e-300)
        reversed_ = [prior[:-1] @ stats.norm.pdf(omega[i], psi(average[i] * np.exp(s[i] - c + WAGE_Z)), sd)
                     + prior[-1] * stats.norm.pdf(omega[i], 0.0, sd) for c in CELL_OFFSETS]
        assert not np.allclose(got[i], reversed_, rtol=1e-3)


def test_pooled_plane_is_least_squares_with_a_level_per_sector():
    from gedp.postprocess.wage_priors import plane, pooled_plane

    rng = np.random.default_rng(6)
    n = 30
    x, size, y, w = rng.normal(size=n), rng.normal(size=n), rng.normal(size=n), rng.uniform(1, 4, n)
    sector = rng.integers(0, 3, n)
    dummies = (sector[:, None] == np.arange(3)[None, :]).astype(float)
    design = np.column_stack([dummies, x, size]) * np.sqrt(w)[:, None]
    coefficients = np.linalg.lstsq(design, y * np.sqrt(w), rcond=None)[0]
    fit = pooled_plane(x, size, y, w, sector)
    assert np.allclose(fit[1:], coefficients[3:])
    assert np.isclose(fit[0], w @ (y - x * coefficients[3] - size * coefficients[4]) / w.sum())
    design = np.column_stack([np.ones(n), x, size]) * np.sqrt(w)[:, None]
    assert np.allclose(plane(x, size, y, w), np.linalg.lstsq(design, y * np.sqrt(w), rcond=None)[0])
    assert np.allclose(plane(x, 2 * x, y, w), np.append(line(x, y, w), 0.0))  # collinear: the line


def test_cell_sizes_are_each_cells_mean_log_size():
    import pandas as pd

    from gedp.postprocess.wage_priors import cell_sizes

    average = np.array([1.0, 4.0, 0.0, 10.0, 0.0, 2.0])
    cell = np.array([0, 0, 0, 1, 2, 3])
    frame = pd.DataFrame({"cell": cell, "log": np.log(np.where(average > 0, average, np.nan))})
    expected = frame.groupby("cell")["log"].mean().to_numpy().copy()
    expected[2] = np.log(average[average > 0]).mean()  # no employing establishment: every one's mean
    assert np.allclose(cell_sizes(average, cell), expected)
