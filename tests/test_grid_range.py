"""pnc's clipped group sums are exact at any size: a large state with one very large establishment
is accepted, and its sums equal exact integer arithmetic on the grid."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from gedp.measure.grid import MAX_GRID_UNITS, VALUE_GRID, exact_unit_sums, rounded_gaussian
from gedp.measure.mechanisms import pnc_mechanism, pnc_released_sensitivity
from gedp.measure.neighbors import SqrtPsi
from gedp.measure.queries import Grouping


def exact_released(values, codes, clip, n_groups, noise_units):
    """Released values by exact arithmetic: sum over the group of round(min(v, u*) / g) (half to even,
    as the grid rounds) in Python integers, plus the noise units, times g, rounded once to a float. g
    is a power of two, so min(v, u*) / g is exact in double precision and Python's round() of it is
    the exact half-to-even integer: what Fraction arithmetic gives (``test_the_units_are_fraction_
    arithmetics``), about 10x faster over 1.6M values."""
    assert math.frexp(VALUE_GRID)[0] == 0.5  # a power of two
    grid, clip = Fraction(VALUE_GRID), [float(c) for c in clip]
    sums = [0] * n_groups
    for value, code in zip(values.tolist(), codes.tolist()):
        sums[code] += round(min(value, clip[code]) / VALUE_GRID)
    return np.array([float((total + int(noise)) * grid) for total, noise in zip(sums, noise_units)])


def test_the_units_are_fraction_arithmetics():
    """``exact_released``'s units against Fraction arithmetic (round(Fraction(min(v, u*)) / g)): whole
    values, fractions of the grid, ties at half a unit (both ways), values above their clip and
    doubles of 53 significant bits."""
    rng = np.random.default_rng(11)
    values = np.concatenate([np.rint(rng.gamma(0.6, 150_000, 2_000)), rng.uniform(0, 1e13, 2_000),
                             (np.arange(-20, 20) + 0.5) * VALUE_GRID, rng.integers(0, 1024, 100) / 2048.0,
                             [1.4e9, 2.0**52 + 1, 1e13 + 0.5]])
    codes = rng.integers(0, 3, len(values))
    clip = np.array([9e12, 1e13, 5e11])
    noise = np.array([3, -5, 0])
    grid, sums = Fraction(VALUE_GRID), [0, 0, 0]
    for value, code in zip(values.tolist(), codes.tolist()):
        sums[code] += round(Fraction(min(value, clip[code])) / grid)
    expected = np.array([float((total + int(n)) * grid) for total, n in zip(sums, noise)])
    assert exact_released(values, codes, clip, 3, noise).tolist() == expected.tolist()


def test_one_headquarters_among_many_establishments_is_accepted_and_exact():
    """1.6M establishments, one with $1.4B of quarterly wages: (establishments x largest clip) /
    grid is 2.3e18 >= 2^61, which the old range check refused."""
    n = 1_600_000
    rng = np.random.default_rng(3)
    values = np.rint(rng.gamma(0.6, 150_000, n))
    values[12_345] = 1.4e9
    clip = values * 1.01 + 10  # upper bounds above every value (as pnc's hold with 1 - zeta)
    grouping = Grouping(("state",), np.zeros(n, dtype=np.int64), pd.DataFrame(index=range(1)))
    assert n * clip.max() / VALUE_GRID >= MAX_GRID_UNITS / 2
    answer = pnc_mechanism(values, grouping, clip, attribute="wage", psi=SqrtPsi(), gamma=50, mu=0.15,
                           rng=np.random.default_rng(9))
    sd = pnc_released_sensitivity(np.array([clip.max()]), SqrtPsi(), 50) / 0.15
    noise = rounded_gaussian(sd, VALUE_GRID, 1, np.random.default_rng(9))
    expected = exact_released(values, grouping.codes, [clip.max()], 1, noise)
    assert answer.released.tolist() == expected.tolist()


def test_wide_sums_match_fractions_bit_for_bit():
    """Groups whose unit sums pass 2^63 (beyond int64): fractional values clipped at public levels."""
    rng = np.random.default_rng(5)
    n, groups = 5_000, 3
    codes = rng.integers(0, groups, n)
    values = rng.uniform(0, 1e13, n) + rng.integers(0, 1024, n) / 1024  # not whole numbers
    clip = np.array([9e12, 1e13, 5e11])
    grouping = Grouping(("county",), codes, pd.DataFrame({"county": ["001", "003", "005"]}))
    upper = clip[codes]
    answer = pnc_mechanism(values, grouping, upper, attribute="wage", psi=SqrtPsi(), gamma=50, mu=0.5,
                           rng=np.random.default_rng(2))
    sd = pnc_released_sensitivity(clip, SqrtPsi(), 50) / 0.5
    noise = rounded_gaussian(sd, VALUE_GRID, groups, np.random.default_rng(2))
    assert answer.released.tolist() == exact_released(values, codes, clip, groups, noise).tolist()
    assert max(np.bincount(codes)) * clip.max() / VALUE_GRID > 2.0**63  # the sums do not fit int64


@pytest.mark.parametrize("largest_sum", [0.0, MAX_GRID_UNITS])  # the int64 path and the wide path
def test_unit_sums_equal_python_integer_sums(largest_sum):
    rng = np.random.default_rng(7)
    units = rng.integers(0, 2**62, 3_000, dtype=np.int64)
    codes = rng.integers(0, 4, 3_000)
    if largest_sum == 0.0:
        units >>= 20  # small enough for int64 sums
    sums = exact_unit_sums(units, codes, 4, largest_sum)
    assert [int(s) for s in sums] == [sum(int(u) for u, c in zip(units, codes) if c == g) for g in range(4)]


def test_a_release_whose_group_sums_pass_int64_is_read_back(tmp_path):
    """A release gedp writes is one its readers take: 480 establishments of one county x NAICS-6 cell
    paid the input maximum ($1e13 each) make the state's wage sum 4.9e18 grid steps, past 2^62 (the
    red team of cellwage18: protect wrote it, every reader of its answers refused it). A released
    value past the sums' own range (600 establishments at the input maximum, plus the noise's room) is
    still refused."""
    import gedp
    from gedp.errors import InputError
    from gedp.measure.grid import largest_sum_units
    from gedp.release.reader import read_answers
    from gedp.synth.profiles import generate_profile, load_profile
    from gedp.synth.schema import MAX_VALUE

    frame = generate_profile(load_profile("small"), n_establishments=600, rng=np.random.default_rng(4))
    frame.loc[frame.index[:480], ["county", "naics", "wage"]] = [frame["county"].iloc[0], frame["naics"].iloc[0],
                                                                 MAX_VALUE]
    assert 480 * MAX_VALUE / VALUE_GRID > MAX_GRID_UNITS
    folder = tmp_path / "release"
    gedp.protect(frame, seed=5, not_for_publication=True).write(folder)
    state_wage = next(a for a in read_answers(folder)["wage"] if a.query.by == ("state",))
    assert abs(state_wage.released[0]) / VALUE_GRID > MAX_GRID_UNITS  # read back, past int64's range
    assert len(gedp.Release(folder).implicates(1, seed=1)) == 600

    measurements = next((folder / "measurements.parquet").iterdir())
    table = pd.read_parquet(measurements)
    state_rows = (table["query"] == "state") & (table["attribute"] == "wage")
    table.loc[state_rows, "released"] = largest_sum_units(600) * VALUE_GRID
    table.loc[state_rows, "estimate"] = largest_sum_units(600) * VALUE_GRID
    table.to_parquet(measurements, index=False)
    with pytest.raises(InputError, match="within the grid's range"):
        read_answers(folder)
