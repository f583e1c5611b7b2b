"""CPU time of normalizing and deriving the industry codes of one state, in process: best of 5 per step.

Run it with two installs to compare them, e.g.
``python benchmarks/bench_codes.py /tmp/fast-work/state-1.4M.parquet`` (the input's first state is
read, as ``gedp protect`` reads it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from bench_read_sort import REPEATS, cpu_seconds

from gedp.running.engine import input_states, read_source
from gedp.synth.hierarchy import derive_industry_codes
from gedp.synth.schema import CODE_WIDTHS, CONFIDENTIAL, normalize_code, validate_microdata


def main(path: str) -> None:
    state, stored = next(iter(input_states(path).codes.items()))
    raw = read_source(path, where=("state", stored))
    naics = normalize_code(raw, "naics", CODE_WIDTHS["naics"])
    steps: dict[str, Callable[[], object]] = {
        **{f"normalize_code {column}": (lambda column=column, width=width: normalize_code(raw, column, width))
           for column, width in {**CODE_WIDTHS, "own": 1}.items() if column in raw.columns},
        "derive_industry_codes": lambda: derive_industry_codes(naics),
        "validate_microdata": lambda: validate_microdata(raw, CONFIDENTIAL),
    }
    print(f"{len(raw):,} rows of state {state}; CPU seconds, best of {REPEATS}")
    for name, step in steps.items():
        print(f"  {name:28s} {cpu_seconds(step):.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
