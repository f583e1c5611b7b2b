"""Do the changes' sizes grow with the level within the change priors' bands? (A diagnosis; the truth is read.)

    python benchmarks/implicates_change_scale.py --qcew FILE --structure NAME[,NAME] [--seed 1] [--out FILE.json]

Per change band of the implicates' model (of the answers' mean) and month (2, 3), the establishments split by
their TRUE month-1 level into quartiles within the band: the share that changes, and among those the median of
|delta| = |psi(m_k) - psi(m_1)| (psi scale, where the band's one change prior lives) and of |m_k - m_1| / m_1; the
truth's slope of log |delta| on log m_1 over the changers (one size per band: 0; a change relative to the
headcount: about 1/2 in psi = sqrt). Then, from the release's answers alone (``change_scale.band_scales``), each
band's profile log-likelihood at SCALE_POWERS less its value at beta = 0 (the shipped model): a scale that grows
with the level fits where the profile rises toward beta > 0. ``docs/evaluation/implicates-measurements.md``
(change sizes relative to the level) reports runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.postprocess.change_scale import SCALE_POWERS, band_scales

sys.path.insert(0, str(Path(__file__).resolve().parent))
from implicates_utility import diagnostic_arguments, seeded_draws  # noqa: E402

MONTHS = ["m1emp", "m2emp", "m3emp"]


def truth_table(model, true_months: np.ndarray) -> pd.DataFrame:
    """Per band, month and quartile of the true month-1 level within the band: the true changes' sizes."""
    edges, band, _ = model.change_bands()
    sizes = np.concatenate([[0.0], model.psi.inverse(edges), [np.inf]])
    theta = model.psi(true_months)
    rows = []
    for b in range(len(edges) + 1):
        inside = band == b
        m1 = true_months[inside, 0]
        quartile = np.searchsorted(np.quantile(m1, [0.25, 0.5, 0.75]), m1, side="right")
        for k in (1, 2):
            delta = theta[inside, k] - theta[inside, 0]
            changed = true_months[inside, k] != m1
            mover = changed & (m1 > 0)
            slope = (np.polyfit(np.log(m1[mover]), np.log(np.abs(delta[mover])), 1)[0]
                     if mover.sum() > 10 and np.ptp(np.log(m1[mover])) > 0 else np.nan)
            for q in range(4):
                here = quartile == q
                moved = here & changed
                relative = np.abs(true_months[inside, k] - m1)[moved & (m1 > 0)] / m1[moved & (m1 > 0)]
                rows.append({"band": f"{sizes[b]:g}-{sizes[b + 1]:g}", "month": k + 1, "quartile": q + 1,
                             "m1_median": float(np.median(m1[here])) if here.any() else np.nan,
                             "estabs": int(here.sum()),
                             "changed": float(changed[here].mean()) if here.any() else np.nan,
                             "abs_delta_median": float(np.median(np.abs(delta[moved]))) if moved.any() else np.nan,
                             "relative_median": float(np.median(relative)) if relative.size else np.nan,
                             "slope_log_delta_on_log_m1": float(slope)})
    return pd.DataFrame(rows)


def main() -> None:
    parser = diagnostic_arguments(__doc__)
    parser.add_argument("--out", type=Path, default=None, help="the tables as JSON")
    args = parser.parse_args()
    truth, draws, _ = seeded_draws(args)
    pd.set_option("display.width", 200)
    out = {}
    for state, (rows, model) in enumerate(draws.models):
        table = truth_table(model, truth[MONTHS].to_numpy(float)[rows])
        scales = band_scales(model.answers.months, model.answers.month_sd, model.psi, *model.change_bands())
        zero = SCALE_POWERS.index(0.0)
        gain = scales.profiles - scales.profiles[:, :, zero:zero + 1]
        print("truth: the changes' sizes by month-1 quartile within each band\n", table.round(3).to_string())
        print("answers: profile log-likelihood less beta = 0's, per band (rows) and month (2, 3), beta =",
              SCALE_POWERS)
        for b, pair in enumerate(gain):
            print(b, [[round(float(v), 1) for v in g] for g in pair])
        print("chosen beta per band (months 2, 3):", scales.beta.tolist())
        out[state] = {"truth": table.to_dict(orient="records"), "powers": list(SCALE_POWERS),
                      "profile_gain": gain.round(2).tolist(), "beta": scales.beta.tolist()}
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
