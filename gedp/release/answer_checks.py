"""A release's noisy answers checked against its own protected microdata (red team rt26 G1).

Each query's groups partition its state's establishments (the identity answers: one group per
establishment), so an answer's estimates sum to S, an unbiased estimate of the state's total of its
attribute with variance V (the sum of its stated variances), and the protected microdata, fitted to the
answers, total T over the same establishments. The fit's total is not unbiased (its values are held
non-negative, wages from a model): genuine releases' S / T run from 0.73 to 1.30 (at mu 0.05x the
recommended plan's, where S is mostly noise, from -1.9 to 2.4). The check is one-sided and allows
the fit any total of at least half the truth: z = (S - FIT_FACTOR T) / sqrt(V) is then at most the
answer's own noise (S - truth) / sqrt(V), above MAX_Z with probability at most MAX_FALSE_REFUSAL
under normal noise.

Every answer scaled by c, identity answers included (values x c, variances x c: each nesting z
unchanged, the budget restated mu / sqrt(c): rt26 G1's last forgery), moves S to c S while T stays:
z is about (c - 2) S / sqrt(c V), refused once c is over 2 by a few stated sd (tens of sd at c = 4, a
budget stated at half the one spent). A budget restated by less (c under about 2.3 on a 3,000
establishment state) and noise added to each answer within its stated variance leave S within reach
of T: those copies are not caught here.
"""

from __future__ import annotations

from collections.abc import Mapping

#: The fit's total of an attribute is taken to be at least 1 / FIT_FACTOR of the truth.
FIT_FACTOR = 2.0
#: A genuine answer's z exceeds MAX_Z with probability at most MAX_FALSE_REFUSAL (normal noise).
MAX_FALSE_REFUSAL = 1e-9
#: The standard normal's one-sided MAX_FALSE_REFUSAL point.
MAX_Z = 5.997807015


def answer_z(frame, numbers: Mapping, part, totals: Mapping) -> list[tuple[int, str, str, float, float]]:
    """(part, attribute, query, z, S / T) of each answer on an attribute ``totals`` holds: its
    estimates' sum S less FIT_FACTOR times the protected microdata's total T of that attribute in its
    part (``totals[part, attribute]``), over the root of its stated variances' sum."""
    import numpy as np

    keys = frame[["attribute", "query"]].assign(part=np.asarray(part), estimate=numbers["estimate"],
                                                variance=numbers["variance"])
    sums = keys.groupby(["part", "attribute", "query"], sort=True)[["estimate", "variance"]].sum()
    found = []
    for (number, attribute, query), estimate, variance in sums.itertuples(name=None):
        total = totals.get((int(number), attribute))
        if total is not None:
            with np.errstate(all="ignore"):
                z = (estimate - FIT_FACTOR * total) / np.sqrt(variance)
                ratio = np.divide(estimate, total)  # inf (not a ZeroDivisionError) for a microdata total of 0
            found.append((int(number), attribute, query, float(z), float(ratio)))
    return found


def protected_totals(release, parts, quarter: str | None, attributes) -> dict[tuple[int, str], float]:
    """The protected microdata's total of each of ``attributes`` it holds (a job frame's categories are
    not its columns), per part of ``parts`` (the part's state's)."""
    from gedp.release.reader import read_quarter
    from gedp.synth.columns import CARRIED
    from gedp.synth.schema import DERIVED

    protected = read_quarter(release, quarter, without=("estab_id", *DERIVED, *CARRIED))
    held = [name for name in attributes if name in protected.columns]
    by_state = protected.groupby(protected["state"].astype(str))[held].sum()
    return {(number, name): float(by_state[name].get(state, 0.0))
            for number, state in enumerate(parts.states) for name in held}


def check_answer_totals(release, frame, numbers: Mapping, parts, quarter: str | None) -> None:
    """Refuse ``release``'s measurements when an answer's total exceeds FIT_FACTOR times its protected
    microdata's by more than its stated noise allows (``answer_z`` above MAX_Z), naming the worst."""
    import numpy as np

    from gedp.release.measurement_checks import refuse_answers

    part = np.repeat(np.arange(len(parts.rows), dtype=np.int64), parts.rows)
    totals = protected_totals(release, parts, quarter, frame["attribute"].unique().tolist())
    bad = [each for each in answer_z(frame, numbers, part, totals) if not each[3] <= MAX_Z]
    if bad:
        number, attribute, query, z, ratio = max(bad, key=lambda each: np.nan_to_num(each[3], nan=np.inf))
        raise refuse_answers(release, f"hold {len(bad):,} answer(s) whose total exceeds {FIT_FACTOR:g} times the "
                                      f"protected microdata's by more than their stated noise allows (query "
                                      f"{query} on {attribute}, state {parts.states[number]}: {ratio:.2f} times "
                                      f"it, {z:.1f} stated sd above)")
