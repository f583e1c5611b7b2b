"""CPU time of ``release_order`` on one state's validated rows, in process: best of 5, for the rows
in the order read and for the same rows shuffled (an input in no particular order).

Run it with two installs to compare them, e.g.
``python benchmarks/bench_release_order.py /tmp/fast-work/state-1.4M.parquet`` (the input's first
state is read, as ``gedp protect`` reads it).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from gedp.release.format import release_order
from gedp.running.engine import input_states, read_state
from gedp.synth.schema import CONFIDENTIAL

REPEATS = 5


def main(path: str) -> None:
    inputs = input_states(path)
    state, stored = next(iter(inputs.codes.items()))
    microdata = read_state(path, state, CONFIDENTIAL, stored)
    shuffled = microdata.take(np.random.default_rng(0).permutation(len(microdata))).reset_index(drop=True)
    print(f"{len(microdata):,} rows of state {state}; release_order CPU seconds, best of {REPEATS}")
    for name, frame in (("as read", microdata), ("shuffled", shuffled)):
        best = float("inf")
        for _ in range(REPEATS):
            start = time.process_time()
            release_order(frame)
            best = min(best, time.process_time() - start)
        print(f"  {name:10s} {best:.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
