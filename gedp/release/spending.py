"""A release's stated spending checked against itself: each state's ledger charges (query, attribute,
mu) within the limits a ledger takes, the manifest's mu per query, per attribute and in total, and
its privacy statement, each recomputed from the charges (a panel's quarters composed by their
design); ``validation.checked_manifest`` refuses a manifest whose statements disagree."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path

from gedp.errors import InputError
from gedp.release.format import MANIFEST_FILE

#: Relative tolerance of a stated total recomputed from its charges (the writer composed the same floats).
MU_RTOL = 1e-9


def refuse_plan(release: str | Path, rule: str) -> InputError:
    return InputError(f"release '{release}': {MANIFEST_FILE}'s {rule} (an edited or damaged copy)")


def ledger_charges(release: str | Path, manifest: Mapping, state: str, where: str) -> dict[tuple[str, str], float]:
    """The answers the manifest's ledger of ``state`` charged: (query, attribute) -> mu, each once."""
    from gedp.accounting.mu_limits import MAX_STATED_MU

    section = manifest.get("per_state", {}).get(state) if isinstance(manifest.get("per_state"), dict) else None
    ledger = section.get("ledger") if isinstance(section, dict) else None
    if not isinstance(ledger, list):
        raise refuse_plan(release, f"states no ledger of {where}: its answers cannot be checked against its plan")
    charged: dict[tuple[str, str], float] = {}
    for entry in ledger:
        query, attribute, mu = (entry.get(key) if isinstance(entry, dict) else None
                                for key in ("query", "attribute", "mu"))
        if not (isinstance(query, str) and isinstance(attribute, str) and isinstance(mu, (int, float))
                and not isinstance(mu, bool) and 0 <= mu <= MAX_STATED_MU) or (query, attribute) in charged:
            raise refuse_plan(release, f"ledger of {where} holds a charge that is not one query on one attribute "
                                       f"once with its mu in [0, {MAX_STATED_MU:g}]")
        charged[query, attribute] = float(mu)
    return charged


def _composed(mus: Iterable[float]) -> float:
    """mu of the composition of mu-GDP mechanisms: sqrt(sum of mu^2) (``measure.budget.compose``)."""
    return math.sqrt(math.fsum(mu * mu for mu in mus))


def _close(found: object, expected: float) -> bool:
    return (isinstance(found, (int, float)) and not isinstance(found, bool)
            and math.isclose(found, expected, rel_tol=MU_RTOL, abs_tol=0.0))


def _stated_mu(ledgers: list[dict[tuple[str, str], float]]) -> dict[str, dict[str, float]]:
    """The mu per query and attribute (a job family's: its categories' composed) a release states: the
    largest its states' ``ledgers`` charged."""
    charged: dict[str, dict[str, float]] = {}
    for ledger in ledgers:
        composed: dict[tuple[str, str], list[float]] = {}
        for (query, attribute), mu in ledger.items():
            composed.setdefault((query, attribute.split("[", 1)[0]), []).append(mu)
        for (query, family), mus in composed.items():
            charged.setdefault(query, {})[family] = max(charged.get(query, {}).get(family, 0.0), _composed(mus))
    return charged


def _privacy_failures(privacy: object, mu_total: float, attributes: Mapping[str, float], where: str) -> list[str]:
    """The ``privacy`` block's mu (and rho = mu^2 / 2) in total and per attribute: those computed."""
    if not isinstance(privacy, dict) or not isinstance(privacy.get("attributes"), dict):
        return [f"'{where}privacy' must hold mu and its attributes'"]
    stated = privacy["attributes"]
    if sorted(stated) != sorted(attributes):
        return [f"'{where}privacy.attributes' names other attributes than its mu per query"]
    for name, block, mu in [("", privacy, mu_total), *((f".attributes.{a}", stated[a], attributes[a]) for a in stated)]:
        if not (isinstance(block, dict) and _close(block.get("mu"), mu) and _close(block.get("rho"), mu * mu / 2)):
            return [f"'{where}privacy{name}' does not state mu {mu:.6g} (rho {mu * mu / 2:.6g}), what its ledgers "
                    "charged composed"]
    return []


def spending_failures(release: str | Path, manifest: Mapping, where: str = "") -> list[str]:
    """What a manifest of one quarter (a quarter of a panel: ``where``) states it spent, against what its
    states' ledgers charged (the one check of every reader and of ``gedp audit --release``): its mu per
    query and attribute the largest the ledgers charged; each state's ``mu_total`` its ledger's charges
    composed, sqrt(sum of mu^2); ``mu_total`` the largest state's (parallel composition across states)
    and at most ``mu_planned_total`` (no charge exceeds its plan); the ``privacy`` block those figures.
    A ledger that cannot be read is refused (InputError)."""
    per_state = manifest.get("per_state")
    if not isinstance(per_state, dict) or not per_state:
        return [f"'{where}per_state' must state each state's ledger"]
    ledgers = {state: ledger_charges(release, manifest, state, f"state {state}") for state in per_state}
    charged = _stated_mu(list(ledgers.values()))
    stated = manifest.get("mu")
    if not (isinstance(stated, dict) and stated.keys() == charged.keys() and all(
            isinstance(stated[query], dict) and stated[query].keys() == by.keys()
            and all(_close(stated[query][family], mu) for family, mu in by.items()) for query, by in charged.items())):
        return [f"mu per query and attribute{f' ({where[:-1]})' if where else ''} is not what its states' ledgers "
                "charged"]
    totals = {state: _composed(ledger.values()) for state, ledger in ledgers.items()}
    for state, total in totals.items():
        if not _close(per_state[state].get("mu_total"), total):
            return [f"'{where}per_state.{state}.mu_total' is not its ledger's charges composed ({total:.6g})"]
    mu_total = max(totals.values())
    if not _close(manifest.get("mu_total"), mu_total):
        return [f"'{where}mu_total' is not the largest of its states' charges composed ({mu_total:.6g})"]
    planned = manifest.get("mu_planned_total", math.inf)
    if isinstance(planned, (int, float)) and planned < mu_total * (1 - MU_RTOL):
        return [f"'{where}mu_planned_total' is less than it spent ({mu_total:.6g}), more than any plan allows"]
    by_attribute: dict[str, list[float]] = {}
    for by in charged.values():
        for attribute, mu in by.items():
            by_attribute.setdefault(attribute, []).append(mu)
    return _privacy_failures(manifest.get("privacy"), mu_total, {a: _composed(mus) for a, mus in by_attribute.items()},
                             where)


def checked_privacy(release: str | Path, manifest: Mapping) -> dict:
    """The manifest's ``privacy`` block (its mu and rho checked by ``read_manifest``) once its epsilons
    are those its mu give (``measure.conversions.privacy_statement``, at the same deltas): what the API
    hands out. The commands state epsilon computed from ``mu_total``, so only this reader computes them."""
    from gedp.measure.conversions import privacy_statement

    privacy = manifest["privacy"]
    expected = privacy_statement(privacy["mu"], {name: block["mu"] for name, block in privacy["attributes"].items()})
    blocks = [("", privacy, expected),
              *((f".attributes.{name}", privacy["attributes"][name], expected["attributes"][name])
                for name in privacy["attributes"])]
    for name, block, computed in blocks:
        stated = block.get("epsilon")
        if not (isinstance(stated, dict) and stated.keys() == computed["epsilon"].keys()
                and all(_close(stated[delta], value) for delta, value in computed["epsilon"].items())):
            raise refuse_plan(release, f"'privacy{name}.epsilon' is not the epsilon of its mu {block['mu']:.6g}")
    return privacy


def panel_spending_failures(manifest: Mapping) -> list[str]:
    """A panel's ``mu_quarter`` the most a quarter spent, its ``mu_total`` and ``privacy`` those of its
    design over its quarters (``measure.design``: independent quarters, sqrt(quarters) times a quarter's)."""
    from gedp.measure.design import quarter_design

    design = manifest.get("design")
    try:
        panel_mu = quarter_design(design.get("name") if isinstance(design, dict) else None).panel_mu
    except (ValueError, TypeError):
        return ["'design' must name a design of quarters gedp knows"]
    quarters = list(manifest["per_quarter"].values())
    count = len(quarters)
    mu_quarter = max(float(section["mu_total"]) for section in quarters)
    if not _close(manifest.get("mu_quarter"), mu_quarter):
        return [f"'mu_quarter' is not the most a quarter spent ({mu_quarter:.6g})"]
    if not _close(manifest.get("mu_total"), panel_mu(mu_quarter, count)):
        return [f"'mu_total' is not what {count} quarters of mu {mu_quarter:.6g} spend "
                f"({panel_mu(mu_quarter, count):.6g})"]
    names = [sorted(section["privacy"]["attributes"]) for section in quarters]  # each checked: its mu's
    if any(held != names[0] for held in names):
        return ["'privacy.attributes' of the quarters name other attributes"]
    attributes = {attribute: panel_mu(max(float(section["privacy"]["attributes"][attribute]["mu"])
                                          for section in quarters), count)
                  for attribute in names[0]}
    return _privacy_failures(manifest.get("privacy"), panel_mu(mu_quarter, count), attributes, "")
