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
#: A group answer's estimate above its group's microdata sum by more than this many stated sd is refused.
MAX_RESIDUAL_Z = 8.5


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


def group_residuals(frame, numbers: Mapping, part, protected, states) -> list[tuple[int, str, str, float]]:
    """(part, attribute, query, z) of each group answer on an attribute ``protected`` holds, z the largest
    over its groups of (estimate - the microdata's sum over the group) / stated sd, the microdata of the
    part's state (``states[part]``); a group no establishment is in sums to 0."""
    import numpy as np
    import pandas as pd

    grouped = (frame["query"] != "identity").to_numpy() & frame["attribute"].isin(protected.columns).to_numpy()
    rows = frame.loc[grouped, ["query", "attribute"]].assign(
        part=np.asarray(part)[grouped], estimate=numbers["estimate"][grouped], variance=numbers["variance"][grouped])
    state = protected["state"].astype(str)
    found = []
    for (number, query), answers in rows.groupby(["part", "query"], sort=True):
        keys = [] if query == "total" else str(query).split(",")
        here = protected.loc[(state == states[number]).to_numpy()]
        names = sorted(answers["attribute"].unique())
        if keys:
            sums = here.groupby([here[key].astype(str) for key in keys])[names].sum()
            labels = frame.loc[answers.index, keys].astype(str)
            index = pd.MultiIndex.from_frame(labels) if len(keys) > 1 else pd.Index(labels[keys[0]])
            held = sums.reindex(index, fill_value=0.0)
        else:
            held = pd.DataFrame([here[names].sum()] * len(answers))
        column = pd.Index(names).get_indexer(answers["attribute"])
        total = held.to_numpy(dtype=np.float64)[np.arange(len(answers)), column]
        with np.errstate(all="ignore"):
            z = (answers["estimate"].to_numpy() - total) / np.sqrt(answers["variance"].to_numpy())
        for k, attribute in enumerate(names):
            mine = column == k
            found.append((int(number), str(attribute), str(query), float(np.nanmax(z[mine], initial=-np.inf))))
    return sorted(found, key=lambda each: (each[0], each[2], each[1]))


def read_answered(release, quarter: str | None, keys=()):
    """The protected microdata's columns the answers are checked against: codes (of the derived ones, the
    ``keys`` only: the group queries' columns) and attributes."""
    from gedp.release.reader import read_quarter
    from gedp.synth.columns import CARRIED
    from gedp.synth.schema import DERIVED

    return read_quarter(release, quarter, without=("estab_id", *CARRIED, *(name for name in DERIVED
                                                                          if name not in keys)))


def protected_totals(release, parts, quarter: str | None, attributes, protected=None) -> dict[tuple[int, str], float]:
    """The protected microdata's total of each of ``attributes`` it holds (a job frame's categories are
    not its columns), per part of ``parts`` (the part's state's); ``protected``: as ``read_answered``
    gives them (read when None)."""
    if protected is None:
        protected = read_answered(release, quarter)
    held = [name for name in attributes if name in protected.columns]
    by_state = protected.groupby(protected["state"].astype(str))[held].sum()
    return {(number, name): float(by_state[name].get(state, 0.0))
            for number, state in enumerate(parts.states) for name in held}


def check_answer_totals(release, frame, numbers: Mapping, parts, quarter: str | None) -> None:
    """Refuse ``release``'s measurements when an answer's total exceeds FIT_FACTOR times its protected
    microdata's by more than its stated noise allows (``answer_z`` above MAX_Z), or a group answer its
    group's microdata sum (``group_residuals`` above MAX_RESIDUAL_Z), naming the worst."""
    import numpy as np

    from gedp.release.measurement_checks import refuse_answers

    part = np.repeat(np.arange(len(parts.rows), dtype=np.int64), parts.rows)
    queries = [str(query) for query in frame["query"].unique() if query not in ("identity", "total")]
    protected = read_answered(release, quarter, {key for query in queries for key in query.split(",")})
    totals = protected_totals(release, parts, quarter, frame["attribute"].unique().tolist(), protected)
    bad = [each for each in answer_z(frame, numbers, part, totals) if not each[3] <= MAX_Z]
    if bad:
        number, attribute, query, z, ratio = max(bad, key=lambda each: np.nan_to_num(each[3], nan=np.inf))
        raise refuse_answers(release, f"hold {len(bad):,} answer(s) whose total exceeds {FIT_FACTOR:g} times the "
                                      f"protected microdata's by more than their stated noise allows (query "
                                      f"{query} on {attribute}, state {parts.states[number]}: {ratio:.2f} times "
                                      f"it, {z:.1f} stated sd above)")
    moved = [each for each in group_residuals(frame, numbers, part, protected, parts.states)
             if not each[3] <= MAX_RESIDUAL_Z]
    if moved:
        number, attribute, query, z = max(moved, key=lambda each: np.nan_to_num(each[3], nan=np.inf))
        raise refuse_answers(release, f"hold {len(moved):,} answer(s) with a group whose protected microdata sum "
                                      f"lies below the answer by more than its stated noise allows (query {query} "
                                      f"on {attribute}, state {parts.states[number]}: {z:.1f} stated sd): the "
                                      "microdata are not the fit of these answers")
