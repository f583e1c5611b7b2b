"""Whether the whole-change model's one size distribution per band is what makes the smallest establishments'
no-change share high and their destruction low: the truth's sizes per month-1 level, and an oracle.

    python benchmarks/implicates_size_levels.py --qcew FILE --structure NAME[,NAME] [--seed 1] [--draws 4]
        [--oracle-level]

On a synthetic state (``implicates_utility.truth_frame``) the months' identity answers are drawn as the shipped
``recommended`` plan's (omega = sqrt(x) + N(0, IDENTITY_SD^2) per month; their law, not a release's bytes) and
the establishments whose month-1 answer is below psi(WHOLE_SIZE) are fitted as ``whole_changes`` does (month 1's
prior ``LevelFit``, bands below 2 and 2-5 employees by that answer, each change on its (omega_1, omega_k) pairs,
no cells' offsets). Printed:

* per true month-1 level 0..LEVELS (the truth, every establishment of that level): the share without a change,
  and among the changes the share of 1, 2, 3+ employees and up; per band the model's fitted w_0, sizes, q;
* each band's no-change weight fitted under six change laws given month 1 = n: "model" (the shipped NPMLE of
  sizes, one q), "band sizes" (the truth's size distribution pooled over the band's changes, q fitted),
  "level sizes" (the truth's size distribution at each level n, q fitted: the oracle of a size per level),
  "level direction" (the band's true sizes, the truth's P(up | n)), "level sizes, level direction" (both per
  level, independent) and "level law" (the truth's signed change distribution at each n); only w_0 (and q where
  it is not the truth's) are fitted (an NPMLE on the components no change, up, down), on the answers alone;
  and "full law", the truth's P(x_k | x_1 = n) with its no-change share at each n (nothing fitted: the draws'
  check, and what no model of one no-change weight per band can reach);
* the smallest establishments' no-change share (month 1 -> 2) and job creation and destruction (month 1 -> 3,
  employees) drawn exactly from each model's posterior, against the truth's.

With ``--oracle-level`` month 1's prior is the truth's shares of each level instead of ``LevelFit``'s.

A diagnostic (the truth is read): nothing ships from it. ``docs/evaluation/implicates-measurements.md`` reports a run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from gedp.measure.neighbors import make_psi
from gedp.postprocess.deconvolve import npmle_weights, pick_points
from gedp.postprocess.whole_changes import GRID_SDS, WHOLE_SIZE, LevelFit, WholeFit, month_log_likelihood, moves

sys.path.insert(0, str(Path(__file__).resolve().parent))
from implicates_atom_profile import IDENTITY_SD  # noqa: E402
from implicates_utility import truth_frame  # noqa: E402

#: Levels tabulated one by one; the truth's change law of a level with fewer than MIN_CHANGERS changes is that
#: of every level from it up (pooled).
LEVELS, MIN_CHANGERS = 10, 200
BANDS = ("< 2", "2-5")
VARIANTS = ("model", "band sizes", "level sizes", "level direction", "level sizes, level direction", "level law")


def level_laws(months: np.ndarray, k: int, top: int) -> tuple[np.ndarray, np.ndarray]:
    """The truth's law of month k given month 1 = n among the changes, T[x, n] = P(x_k = x | x_1 = n, x_k != n)
    ((top + 1) x (top + 1), months clipped to top), and the share without a change at each n; both pooled from
    the first level (1 or more) with fewer than MIN_CHANGERS changes up (the pooled changes as steps from n)."""
    first, later = np.minimum(months[:, 0], top).astype(int), np.minimum(months[:, k], top).astype(int)
    changed = later != first
    table = np.zeros((top + 1, top + 1))
    np.add.at(table, (later[changed], first[changed]), 1.0)
    counts = table.sum(axis=0)
    short = np.flatnonzero(counts < MIN_CHANGERS)
    pool_from = int(short[short >= 1].min()) if (short >= 1).any() else top + 1
    level_counts = np.bincount(first, minlength=top + 1).astype(float)
    stay = 1.0 - counts / np.maximum(level_counts, 1.0)
    stay[pool_from:] = 1.0 - changed[first >= pool_from].mean() if (first >= pool_from).any() else 1.0
    if pool_from <= top:  # the pooled levels' changes as signed steps from their level
        steps = np.bincount((later - first + top)[changed & (first >= pool_from)], minlength=2 * top + 1)
        for n in range(pool_from, top + 1):
            table[:, n] = 0.0
            for j in np.flatnonzero(steps):
                x = min(max(n + j - top, 0), top)  # a step clipped back onto n is no change
                if x != n:
                    table[x, n] += steps[j]
    return table / np.maximum(table.sum(axis=0, keepdims=True), 1e-300), stay


def size_laws(law: np.ndarray) -> np.ndarray:
    """Sizes by level from a signed law: S[s, n] = P(|x_k - n| = s | n), s = 0..top (row 0 empty)."""
    top = law.shape[0] - 1
    sizes = np.zeros_like(law)
    for n in range(top + 1):
        np.add.at(sizes[:, n], np.abs(np.arange(top + 1) - n), law[:, n])
    return sizes


def directed(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Up and down moves (x, n) of size laws by level (columns: n; ``whole_changes.moves`` per column)."""
    top = sizes.shape[0] - 1
    up, down = np.zeros_like(sizes), np.zeros_like(sizes)
    for n in range(top + 1):
        rise, fall = moves(sizes[:, n], top)
        up[:, n], down[:, n] = rise[:, n], fall[:, n]
    return up, down


def fit_atom(u: np.ndarray, v: np.ndarray, laws: list[np.ndarray]) -> np.ndarray:
    """The NPMLE of the weights of no change and of each law (x, n) given the rows' month-1 terms ``u`` and month-k
    likelihoods ``v`` (rows x 0..top): component c's likelihood sum_n u(n) sum_x v(x) law_c[x, n]."""
    matrix = np.column_stack([np.einsum("in,in->i", u, v)] + [np.einsum("in,in->i", u, v @ law) for law in laws])
    return npmle_weights(matrix, np.ones(len(matrix)))


def transition(weights: np.ndarray, laws: list[np.ndarray]) -> np.ndarray:
    """P(x_k = x | x_1 = n): weights[0] on no change, weights[c] on law c."""
    top = laws[0].shape[0] - 1
    return weights[0] * np.eye(top + 1) + sum(w * law for w, law in zip(weights[1:], laws))


def drawn(rng: np.random.Generator, log_h: np.ndarray, like: list[np.ndarray], steps: list[np.ndarray],
          band: np.ndarray, draws: int) -> np.ndarray:
    """``draws`` exact posterior draws of (x_1, x_2, x_3) (draws x rows x 3) given the three months' likelihoods
    and each band's transitions ``steps[b][k - 1]`` (x, n)."""
    given = [np.empty_like(like[0]) for _ in (1, 2)]
    for b in np.unique(band):
        at = band == b
        for k in (1, 2):
            given[k - 1][at] = like[k][at] @ steps[b][k - 1]
    log_first = log_h[None, :] + np.log(np.maximum(like[0] * given[0] * given[1], 1e-300))
    out = np.empty((draws, len(band), 3), dtype=int)
    for d in range(draws):
        first = pick_points(np.ascontiguousarray(log_first.T), rng)
        out[d, :, 0] = first
        for k in (1, 2):
            chance = np.empty_like(like[k])
            for b in np.unique(band):
                at = band == b
                chance[at] = steps[b][k - 1][:, first[at]].T
            out[d, :, k] = pick_points(np.ascontiguousarray(np.log(np.maximum(chance * like[k], 1e-300)).T), rng)
    return out


def flows(x: np.ndarray) -> tuple[float, float, float]:
    """No-change share (month 1 -> 2), creation and destruction (month 1 -> 3, employees) of months (.. x 3)."""
    return (float(np.mean(x[..., 1] == x[..., 0])), float(np.maximum(x[..., 2] - x[..., 0], 0).sum(axis=-1).mean()),
            float(np.maximum(x[..., 0] - x[..., 2], 0).sum(axis=-1).mean()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--qcew", type=Path, required=True)
    parser.add_argument("--structure", default="none")
    parser.add_argument("--seed", type=int, default=1, help="the answers' noise")
    parser.add_argument("--draws", type=int, default=4)
    parser.add_argument("--oracle-level", action="store_true", help="month 1's prior the truth's shares")
    args = parser.parse_args()
    truth = truth_frame(args.qcew, [] if args.structure == "none" else args.structure.split(","))
    months = np.rint(truth[["m1emp", "m2emp", "m3emp"]].to_numpy(float)).astype(int)
    psi, sd, rng = make_psi("sqrt"), IDENTITY_SD, np.random.default_rng(args.seed)
    omega = psi(months.astype(float)) + sd * rng.standard_normal(months.shape)
    cut, edge = (float(psi(np.array([x]))[0]) for x in (WHOLE_SIZE, 2.0))
    small = omega[:, 0] < cut
    top = int(np.ceil(float(psi.inverse(np.array([omega[small].max() + GRID_SDS * sd]))[0])))
    level = LevelFit.of(omega[small, 0], sd, psi, cut)
    log_h = level.log_prior(level.weights, top)
    if args.oracle_level:  # month 1's prior the truth's shares (a diagnosis of the fitted prior's part)
        with np.errstate(divide="ignore"):
            log_h = np.log(np.bincount(np.minimum(months[:, 0], top), minlength=top + 1) / len(months))
    rows = np.flatnonzero(small)
    band = (omega[rows, 0] >= edge).astype(int)
    like = [np.exp(month_log_likelihood(omega[rows, k], sd, psi, top)) for k in range(3)]
    print(f"{args.structure}: {len(months):,} establishments, {len(rows):,} with a month-1 answer below psi(5), "
          f"grid 0..{top}")

    print("\ntruth by month-1 level | establishments (small) | month k | no change | changes of 1 / 2 / 3+ | up")
    laws, stays = zip(*(level_laws(months, k, top) for k in (1, 2)))
    first = months[:, 0]
    for n in range(LEVELS + 1):
        at = first == n
        for k in (1, 2):
            j = months[at, k] - n
            moved = j[j != 0]
            size = np.abs(moved)
            shares = [np.mean(size == 1), np.mean(size == 2), np.mean(size >= 3)] if len(moved) else [np.nan] * 3
            print(f"{n} | {at.sum():,} ({(at & small).sum():,}) | {k + 1} | {np.mean(j == 0):.3f} | "
                  + " / ".join(f"{s:.3f}" for s in shares) + f" | {np.mean(moved > 0) if len(moved) else np.nan:.3f}")

    print("\nband | month | truth: no change, sizes 1 / 2 / 3+, up | model: w_0, sizes, q | w_0 under "
          + ", ".join(VARIANTS[1:]))
    steps: dict[str, list[list[np.ndarray]]] = {m: [] for m in VARIANTS + ("full law",)}
    for b in (0, 1):
        at = band == b
        x = months[rows[at]]
        u = np.exp(month_log_likelihood(omega[rows[at], 0], sd, psi, top) + log_h[None, :])
        for name in steps:
            steps[name].append([])
        for k in (1, 2):
            v = like[k][at]
            fit = WholeFit.of(omega[rows[at], 0], omega[rows[at], k], (sd, sd), log_h, psi, np.zeros(int(at.sum())))
            w, q = fit.weights, float(fit.up()[0])
            rise, fall = moves(w / (1 - w[0]), top)
            steps["model"][b].append(transition(np.array([w[0], 1 - w[0]]), [q * rise + (1 - q) * fall]))
            sizes = size_laws(laws[k - 1])
            steps["full law"][b].append(stays[k - 1][None, :] * np.eye(top + 1) + (1 - stays[k - 1])[None, :]
                                        * laws[k - 1])
            j = x[:, k] - x[:, 0]
            pooled = np.bincount(np.minimum(np.abs(j[j != 0]), top), minlength=top + 1).astype(float)
            band_up, band_down = moves(pooled / pooled.sum(), top)
            level_up, level_down = directed(sizes)
            fits = {}
            q_n = np.tril(laws[k - 1], -1).sum(axis=0)[None, :]  # the truth's P(up | a change, n)
            for name, parts in (("band sizes", [band_up, band_down]), ("level sizes", [level_up, level_down]),
                                ("level direction", [q_n * band_up + (1 - q_n) * band_down]),
                                ("level sizes, level direction", [q_n * level_up + (1 - q_n) * level_down]),
                                ("level law", [laws[k - 1]])):
                weights = fit_atom(u, v, parts)
                steps[name][b].append(transition(weights, parts))
                fits[name] = weights
            size = np.abs(j[j != 0])
            truth_sizes = " / ".join(f"{np.mean(c):.3f}" for c in (size == 1, size == 2, size >= 3))
            model_sizes = " / ".join(f"{s:.3f}" for s in (w[1] / (1 - w[0]), w[2] / (1 - w[0]),
                                                          w[3:].sum() / (1 - w[0])))
            print(f"{BANDS[b]} | {k + 1} | {np.mean(j == 0):.3f}, {truth_sizes}, {np.mean(j[j != 0] > 0):.3f} | "
                  f"{w[0]:.3f}, {model_sizes}, {q:.3f} | "
                  + ", ".join(f"{fits[n][0]:.3f}" for n in VARIANTS[1:]), flush=True)

    print("\nthe smallest establishments (month-1 answer below psi(5)): no change (1 -> 2) | creation | destruction "
          "(1 -> 3, employees)")
    no_change, creation, destruction = flows(months[rows])
    print(f"truth | {no_change:.3f} | {creation:,.0f} | {destruction:,.0f}")
    all_flows = flows(months)
    print(f"(the whole state's truth: {all_flows[0]:.3f} | {all_flows[1]:,.0f} | {all_flows[2]:,.0f})")
    draw_rng = np.random.default_rng(args.seed + 1000)
    for name, model_steps in steps.items():
        x = drawn(draw_rng, log_h, like, model_steps, band, args.draws)
        a, c, d = flows(x)
        print(f"{name} | {a:.3f} ({a - no_change:+.3f}) | {c:,.0f} ({c / creation - 1:+.1%}) | "
              f"{d:,.0f} ({d / destruction - 1:+.1%})", flush=True)


if __name__ == "__main__":
    main()
