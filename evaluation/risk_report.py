"""The disclosure-risk report: report.md, risks.csv and summary.json from ``risk.compute_risk``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from gedp.evaluation.report import Report
from gedp.evaluation.risk import ATTACKER_KNOWS, CONFIDENCE, LINK_COLUMNS, PSI_WORDS, SIZE_CLASS_LABELS, RiskResult

GEDP = "gedp release"


def risk_table(result: RiskResult) -> pd.DataFrame:
    """One row per method and attack: success rates on training and control records, risk and interval."""
    return pd.DataFrame([{"method": method, "attack": attack, **risk.row()}
                         for method, risks in result.risks.items() for attack, risk in risks.items()])


def _figure(row: pd.Series) -> str:
    return f"{row['risk']:.2f} [{row['low']:.2f}, {row['high']:.2f}]"


def render_risk(result: RiskResult, out: Path) -> dict:
    """report.md, risks.csv and summary.json; returns the summary."""
    table = risk_table(result)
    table.to_csv(Path(out) / "risks.csv", index=False)
    report = Report(out, "Disclosure risk of released microdata")
    report.section(
        "Setup",
        f"{result.data_label}: {result.training:,} establishments used to make the release (training) and "
        f"{result.control:,} kept out (control); {result.release_label}. Each attack is run on up to "
        f"{result.attacks:,} training and as many control records (seed {result.seed}); risk = (training rate - "
        f"control rate) / (1 - control rate), with its {CONFIDENCE:.0%} interval (Wilson intervals on both "
        "rates, propagated). The attacker knows each target's " + ", ".join(ATTACKER_KNOWS) + " and the release.")
    gedp = table[(table["method"] == GEDP) & (table["attack"] == "size class")].iloc[0]
    report.section(
        "Size class",
        f"Knowing an establishment's id and public columns, an attacker reads its QCEW size class of month-1 "
        f"employment ({', '.join(SIZE_CLASS_LABELS)}) from the release correctly for {gedp['rate']:.0%} of the "
        f"establishments in it, against {gedp['control_rate']:.0%} for establishments not in it (the best guess "
        f"the release gives about anyone): risk {_figure(gedp)}. This is what the guarantee promises: {PSI_WORDS}. "
        "A release states an establishment's employment to within its noise, and the size classes are wider "
        "than that noise for most establishments.")
    rows = [[row["method"], row["attack"], f"{row['rate']:.3f}", f"{row['control_rate']:.3f}", _figure(row)]
            for _, row in table.iterrows()]
    report.section(
        "Every attack, beside noise infusion and rounding",
        "Wage decile: the decile of the quarter's wages (deciles of all records) read from the nearest released "
        "record. Singling out: a predicate (county, NAICS code, one attribute above or below a released value) "
        "that matches one released record, tried on the training and control records. Linkability: "
        f"{' + '.join(LINK_COLUMNS[0])} and {' + '.join(LINK_COLUMNS[1])} of one establishment linked through "
        "their nearest released records. Noise infusion and rounding are applied to the same training records; "
        "the attacker reads each released value as it stands (one who knows the rounding step guesses rounded size "
        "classes better). The same figures are in `risks.csv`.")
    report.table(["method", "attack", "training rate", "control rate", "risk [interval]"], rows)
    summary = {"experiment": "risk", "data": result.data_label, "release": result.release_label,
               "training": result.training, "control": result.control, "attacks": result.attacks,
               "seed": result.seed, "size_class_words": PSI_WORDS,
               "risks": {method: {attack: risk.row() for attack, risk in risks.items()}
                         for method, risks in result.risks.items()}}
    report.write(summary)
    return summary
