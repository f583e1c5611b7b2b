"""The months' smoothing and structured solves timed in process on inputs captured from `gedp protect`.

    python benchmarks/bench_months.py capture INPUT.parquet --work DIR   # once: pickles the inputs
    python benchmarks/bench_months.py time --work DIR [--repeat 5]       # CPU seconds, best of repeat

`capture` runs `gedp protect` (seed 1) and pickles the arguments of ``month_answers`` (as the models
call it) and of each ``solve_structured``. `time` reruns those calls with the gedp it imports (run it
with another environment's python to time another version) and writes a digest of their results, so
two versions' outputs can be compared bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def capture(source: str, work: Path) -> None:
    """Run `gedp protect` on ``source`` with hooks that pickle the timed functions' arguments."""
    from gedp import cli
    from gedp.postprocess import models, wls

    work.mkdir(parents=True, exist_ok=True)
    original_months, original_solve = models.month_answers, wls.solve_structured
    solves = []

    def months_hook(*args, **kwargs):
        (work / "month_answers.pkl").write_bytes(pickle.dumps((args, kwargs), protocol=5))
        return original_months(*args, **kwargs)

    def solve_hook(*args):
        solves.append(args)
        return original_solve(*args)

    models.month_answers, wls.solve_structured = months_hook, solve_hook
    with tempfile.TemporaryDirectory() as out:
        sys.argv = ["gedp", "protect", source, "--out", str(Path(out) / "release"), "--seed", "1",
                    "--not-for-publication"]
        try:
            cli.main()
        except SystemExit as stop:
            if stop.code:
                raise
    (work / "solve_structured.pkl").write_bytes(pickle.dumps(solves, protocol=5))


def _best_cpu(call, repeat: int):
    """The call's result and its smallest process CPU time over ``repeat`` runs."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.process_time()
        result = call()
        best = min(best, time.process_time() - start)
    return result, best


def _digest(arrays) -> str:
    sha = hashlib.sha256()
    for array in arrays:
        if array is not None:
            sha.update(np.ascontiguousarray(array).tobytes())
    return sha.hexdigest()[:16]


def time_calls(work: Path, repeat: int) -> None:
    """Time ``month_answers`` and the structured solves on the captured inputs; print CPU and digests."""
    from gedp.postprocess import months, wls

    args, kwargs = pickle.loads((work / "month_answers.pkl").read_bytes())
    turned, seconds = _best_cpu(lambda: months.month_answers(*args, **kwargs), repeat)
    answers = [a for attribute in sorted(turned) for a in turned[attribute]]
    print(f"month_answers      cpu {seconds:.3f} s  digest "
          f"{_digest([x for a in answers for x in (a.estimate, a.variance, a.variance_slope, a.pattern_loading)])}")
    solves = pickle.loads((work / "solve_structured.pkl").read_bytes())
    results, seconds = _best_cpu(lambda: [wls.solve_structured(*s) for s in solves], repeat)
    print(f"solve_structured x{len(solves)} cpu {seconds:.3f} s  digest {_digest([r.values for r in results])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["capture", "time"])
    parser.add_argument("source", nargs="?")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()
    if options.action == "capture":
        capture(options.source, options.work)
    else:
        time_calls(options.work, options.repeat)


if __name__ == "__main__":
    main()
