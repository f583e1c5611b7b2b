"""What the wage margins' sandwich leaves out by holding the rates fixed (run on demand, not a test).

The margins add g' K^-1 diag(eps) K^-1 g (K the cells' precision at fixed rates, eps = e / vd^2:
``wages._noise_excess`` over the cells' variances squared). The joint sandwich puts the Hessian H
over cells and rates in place of K (the noise excess also moves the rates). Both are computed
densely here, on the tests' small state (1,500 establishments, profile seed 7, release seed 5), for
tabulations by county, county x NAICS-4, NAICS-3 and state: per plan, the fixed-rates term over the
stated variance without it, and (joint - fixed) over the stated variance.

    python benchmarks/wage_sandwich_rates.py
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import scipy.sparse as sp

import gedp
from gedp.postprocess import wages
from gedp.release.reader import read_release
from gedp.synth.profiles import generate_profile, load_profile


def main() -> None:
    state = generate_profile(load_profile("small"), n_establishments=1_500, rng=np.random.default_rng(7))
    for plan in ("baseline", "recommended"):
        release = gedp.protect(state, plan, seed=5, not_for_publication=True)
        protected, answers = read_release(release.folder)
        fit = wages.fit_wages(answers, protected, gedp.load(plan).plan.psi)
        free = ~fit.fixed_cells
        n_free = int(free.sum())
        c = fit.groups.toarray()[:, free]
        cells = np.diag(1 / fit.cell_variance[free]) + c.T @ np.diag(1 / fit.group_variance) @ c
        links = fit.rates.links.toarray()[free]
        joint = np.linalg.inv(np.block([[cells, -links], [-links.T, fit.rates.precision.toarray()]]))[:n_free, :n_free]
        fixed = np.linalg.inv(cells)
        eps = fit.noise_excess[free] / fit.cell_variance[free] ** 2
        total = fit.totals[fit.cell_codes]
        share = np.where(total > 0, fit.values / np.maximum(total, 1e-300), 0.0)
        for by in (["county"], ["county", "naics4"], ["naics3"], ["state"]):
            codes = pd.MultiIndex.from_frame(protected[by]).factorize()[0]
            shape = (len(fit.totals), codes.max() + 1)
            g = sp.csr_matrix((share, (fit.cell_codes, codes)), shape=shape).toarray()[free]
            g = g[:, g.sum(axis=0) > 0]
            base = np.einsum("ji,jk,ki->i", g, joint, g)
            h_fixed, h_joint = fixed @ g, joint @ g
            term_fixed = np.einsum("ji,j,ji->i", h_fixed, eps, h_fixed)
            term_joint = np.einsum("ji,j,ji->i", h_joint, eps, h_joint)
            left_out = (term_joint - term_fixed) / (base + term_fixed)
            print(f"{plan:>11} {'x'.join(by):>13} ({g.shape[1]:3d} cells): fixed-rates term / variance median "
                  f"{np.median(term_fixed / base):+.4f}; left out / variance median {np.median(np.abs(left_out)):.4f}, "
                  f"5-95% {np.quantile(left_out, 0.05):+.4f} to {np.quantile(left_out, 0.95):+.4f}, "
                  f"largest {left_out[np.argmax(np.abs(left_out))]:+.4f}, wider in {np.mean(left_out > 0):.0%}")


if __name__ == "__main__":
    main()
