"""The readers' check of pnc answers' noise against the budget the manifest states: each answer's
largest sd the noise of its state's largest upper bound over its stated mu (tau from zeta and the
identity answers), and every group's sd the noise of one of those upper bounds, so a mu, tau or zeta
stated lower than the noise drawn is refused (``measurement_checks.checked_measurements`` calls it)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gedp.release.measurement_checks import ANSWER_RTOL, refuse_rows
from gedp.release.spending import refuse_plan

if TYPE_CHECKING:
    from gedp.release.measurement_checks import MeasurementParts


def check_pnc_sd(release: str | Path, frame, numbers: dict, psi_rows, attributes, gamma, manifest: Mapping,
                 parts: MeasurementParts) -> None:
    """Each pnc answer's noise tied to its stated mu and its state's tau (``measure.mechanisms.pnc_mechanism``):
    tau the one zeta gives for its state's bounds (``pnc_tau`` of ``zeta_per_state``, 1 - (1 - zeta)^(1 /
    states), over one bound per identity answer); group g's sd the rounded noise sd of Delta(u*_g) / mu
    (``pnc_released_sensitivity``), u*_g the largest upper bound psi^-1(omega_j + s_j tau + g_j) of the
    group's identity answers. The group holding the state's largest upper bound U has u*_g = U and the
    others no more (Delta grows with u*), so each answer's largest sd is exactly that of U over its mu,
    computed from the identity answers alone: a mu (or tau, or zeta) stated lower than the noise drawn
    is refused."""
    import numpy as np
    import pandas as pd

    from gedp.measure.grid import VALUE_GRID, rounded_noise_sd
    from gedp.measure.mechanisms import MAX_ZETA, MIN_ZETA, pnc_tau  # loads scipy.special: pnc releases only
    from gedp.measure.neighbors import make_psi

    pnc = ~psi_rows
    if not pnc.any():
        return
    part = np.repeat(np.arange(len(parts.rows), dtype=np.int64), parts.rows)
    identity = (frame["query"] == "identity").to_numpy() & psi_rows
    width = int(attributes.max(initial=0)) + 1
    slot = part * width + attributes
    held = np.zeros(len(parts.rows) * width, dtype=bool)
    held[slot[identity]] = True
    refuse_rows(release, frame, pnc & ~held[slot], "pnc answer has no identity answer of its attribute in its state "
                                              "(the upper bounds that clip it)")
    taus = manifest.get("tau") if isinstance(manifest.get("tau"), dict) else {}
    zeta, whole, states = manifest.get("zeta_per_state"), manifest.get("zeta"), len(manifest["states"])
    if not (isinstance(whole, float) and MIN_ZETA <= whole <= MAX_ZETA):
        raise refuse_plan(release, f"zeta is not in [{MIN_ZETA:g}, {MAX_ZETA:g}], where a config's zeta lies")
    if not (isinstance(zeta, float) and isinstance(whole, float) and whole < 1  # numbers >= 0 (``validation``)
            and math.isclose(zeta, -math.expm1(math.log1p(-whole) / states), rel_tol=ANSWER_RTOL)):
        raise refuse_plan(release, f"zeta_per_state is not 1 - (1 - zeta)^(1/{states}) of its zeta")
    tau = np.zeros(len(parts.rows))
    for number, state in enumerate(parts.states):
        stated, bounds = taus.get(state), int(np.count_nonzero(identity & (part == number)))
        try:
            due = pnc_tau(zeta, bounds) if isinstance(zeta, float) else math.nan
        except ValueError:  # zeta outside (0, 1), or no identity answers
            due = math.nan
        if not (isinstance(stated, float) and math.isclose(stated, due, rel_tol=ANSWER_RTOL)):
            raise refuse_plan(release, f"tau of state {state} is not the one its zeta_per_state gives over its "
                                       f"{bounds:,} upper bounds (one per identity answer)")
        tau[number] = stated
    psi = make_psi(**manifest["psi"])
    upper = np.full(len(parts.rows) * width, -np.inf)
    with np.errstate(all="ignore"):
        bounds = psi.inverse(numbers["released"][identity] + numbers["sd"][identity] * tau[part[identity]]
                             + numbers["grid"][identity])
    np.maximum.at(upper, slot[identity], bounds)
    queries = pd.factorize(frame["query"], use_na_sentinel=False)[0]
    code = queries[pnc] * len(upper) + slot[pnc]
    answers, answer_of_row = np.unique(code, return_inverse=True)
    largest = np.full(len(answers), -np.inf)
    np.maximum.at(largest, answer_of_row, numbers["sd"][pnc])
    first = np.zeros(len(answers), dtype=np.int64)
    first[answer_of_row[::-1]] = np.arange(len(answer_of_row))[::-1]
    clip = upper[answers % len(upper)]
    mu, answer_gamma = numbers["mu"][pnc][first], gamma[pnc][first]
    sensitivity = _pnc_sensitivities(clip, answer_gamma, psi)
    with np.errstate(all="ignore"):  # mu 0: no noise, only where no group has a clip level (sensitivity 0)
        expected = np.where(sensitivity == 0, 0.0, rounded_noise_sd(sensitivity / mu, VALUE_GRID))
    wrong = ~np.isclose(largest, expected, rtol=ANSWER_RTOL, atol=0)
    bad = np.zeros(len(frame), dtype=bool)
    bad[np.flatnonzero(pnc)] = wrong[answer_of_row]
    refuse_rows(release, frame, bad, "pnc sd is not the noise its stated mu and tau give (the largest of each answer: "
                                "Delta(u*) / mu, u* its state's largest upper bound)")
    _check_pnc_groups(release, frame, numbers, pnc, slot, identity, bounds, psi, gamma)


def _pnc_sensitivities(bounds, gammas, psi):
    """pnc's released sensitivity Delta(u) of each clip level ``bounds`` under its attribute's gamma."""
    import numpy as np

    from gedp.measure.mechanisms import pnc_released_sensitivity

    sensitivity = np.full(len(bounds), np.nan)
    for value in np.unique(gammas):  # the mechanism's sensitivity takes one gamma
        chosen = gammas == value
        sensitivity[chosen] = pnc_released_sensitivity(bounds[chosen], psi, float(value))
    return sensitivity


def _check_pnc_groups(release: str | Path, frame, numbers: dict, pnc, slot, identity, bounds, psi, gamma) -> None:
    """Every pnc group's sd, not only each answer's largest, the noise of one of the upper bounds of its
    attribute in its state over its stated mu: a group's clip level u*_g is the largest bound of its
    members, so its sd is rounded_noise_sd(Delta(u_j) / mu) of some identity answer j (0: u_j = 0). A
    budget restated through tau (zeta) or the identity answers, the sds kept, fits each answer's largest
    sd but not its other groups' (red team rt23 F1)."""
    import numpy as np

    from gedp.measure.grid import VALUE_GRID, rounded_noise_sd

    known, held_slot = _pnc_sensitivities(bounds, gamma[identity], psi), slot[identity]
    rows = np.flatnonzero(pnc)
    found = np.zeros(len(rows), dtype=bool)
    for value in np.unique(slot[rows]):  # each state's attribute: its bounds' sensitivities, sorted
        mine = rows[slot[rows] == value]
        held = np.sort(known[held_slot == value])
        sd, mu = numbers["sd"][mine], numbers["mu"][mine]
        with np.errstate(all="ignore"):  # the sensitivity each sd is the noise of, near which its bound lies
            needed = mu * np.sqrt(np.maximum(sd * sd - VALUE_GRID**2 / 12, 0.0))
        position = np.searchsorted(held, needed)
        matched = np.zeros(len(mine), dtype=bool)
        for shift in (-2, -1, 0, 1):  # the bounds beside the sensitivity needed (its sqrt rounds)
            candidate = position + shift
            inside = (candidate >= 0) & (candidate < len(held))
            sensitivity = held[np.clip(candidate, 0, len(held) - 1)]
            with np.errstate(all="ignore"):
                expected = np.where(sensitivity == 0, 0.0, rounded_noise_sd(sensitivity / mu, VALUE_GRID))
            matched |= inside & np.isclose(sd, expected, rtol=ANSWER_RTOL, atol=0)
        found[slot[rows] == value] = matched
    bad = np.zeros(len(frame), dtype=bool)
    bad[rows] = ~found
    refuse_rows(release, frame, bad, "pnc sd is not the noise of any upper bound of its attribute over its stated mu "
                                "(a group's clip level is one of its members' bounds)")
