"""The identity wage answers the wage fit (``postprocess.wages``) reads: each held below what its
NAICS-5 group's released total allows (``held_by_group``)."""

from __future__ import annotations

import numpy as np

from gedp.measure.answers import NoisyAnswer
from gedp.measure.neighbors import NeighborFunction
from gedp.synth.schema import MAX_VALUE

#: How far (in sds of its own noise on the psi scale, and of its NAICS-5 group's total) an identity
#: wage answer may lie above its group's released total before the fit holds it there
#: (``held_by_group``): no establishment's wage exceeds its group's, so an honest answer lies that
#: far above with probability about Phi(-10) = 7.6e-24 each.
GROUP_BOUND_SDS = 10.0


def held_by_group(psi: NeighborFunction, identity: NoisyAnswer, identity_codes: np.ndarray, sd: np.ndarray,
                  rate_answer: NoisyAnswer, rate_codes: np.ndarray) -> np.ndarray:
    """Each establishment's identity wage estimate, held at most at that of an answer GROUP_BOUND_SDS
    of its noise sds above psi of its NAICS-5 group's largest plausible total (the group's released
    estimate, at least 0, plus GROUP_BOUND_SDS of its sds), and at most at MAX_VALUE (validated at
    protect time). An establishment's wage is at most its group's, so an honest answer is held with
    probability about Phi(-GROUP_BOUND_SDS): this holds only answers no mechanism draws, and keeps
    one such answer (an edited release's 1e13) from setting the state's rate, the scale of every
    cell's weight and floor (it had widened every county's wage margin 10-100x, or brought it to 0)."""
    spread = np.sqrt(np.maximum(rate_answer.variance, 0.0))
    group_high = np.maximum(rate_answer.estimate, 0.0) + GROUP_BOUND_SDS * spread
    ceiling = psi(np.minimum(group_high[rate_codes], MAX_VALUE)) + GROUP_BOUND_SDS * sd
    released = np.broadcast_to(identity.released, (int(identity_codes.max()) + 1,))[identity_codes]
    estimate = identity.estimate[identity_codes]
    held = released > ceiling
    if held.any():
        estimate = np.where(held, psi.unbiased_estimate(np.where(held, ceiling, 0.0), sd), estimate)
    return np.minimum(estimate, MAX_VALUE)
