"""CPU time of reading, checking and ordering one state, in process: best of 5 per step.

Run it with two installs to compare them, e.g.
``python benchmarks/bench_read_sort.py /tmp/fast-work/state-1.4M.parquet`` (the input's first state
is read, as ``gedp protect`` reads it).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from gedp.release.format import RELEASE_ORDER
from gedp.running.engine import input_states, read_source, read_state
from gedp.synth.io import sorted_by
from gedp.synth.schema import CODE_WIDTHS, CONFIDENTIAL, normalize_code, validate_microdata

REPEATS = 5


def cpu_seconds(step: Callable[[], object]) -> float:
    """The least process time (all threads) of REPEATS calls of ``step``."""
    best = float("inf")
    for _ in range(REPEATS):
        start = time.process_time()
        step()
        best = min(best, time.process_time() - start)
    return best


def main(path: str) -> None:
    inputs = input_states(path)
    state, stored = next(iter(inputs.codes.items()))
    raw = read_source(path, where=("state", stored))
    microdata = validate_microdata(raw, CONFIDENTIAL)
    steps: dict[str, Callable[[], object]] = {
        "input_states": lambda: input_states(path),
        "read_source (one state)": lambda: read_source(path, where=("state", stored)),
        **{f"normalize_code {column}": (lambda column=column, width=width: normalize_code(raw, column, width))
           for column, width in CODE_WIDTHS.items()},
        "validate_microdata": lambda: validate_microdata(raw, CONFIDENTIAL),
        "read_state": lambda: read_state(path, state, CONFIDENTIAL, stored),
        "sorted_by (release order)": lambda: sorted_by(microdata, list(RELEASE_ORDER)),
    }
    print(f"{len(raw):,} rows of state {state}; CPU seconds, best of {REPEATS}")
    for name, step in steps.items():
        print(f"  {name:28s} {cpu_seconds(step):.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
