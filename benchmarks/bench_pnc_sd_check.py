"""What the readers' tie of each pnc answer's sd to its stated mu (``pnc_checks.check_pnc_sd``) adds
to a reader of a release's answers: one process reads and checks the measurements (``read_measurements``,
wall time), stating the part spent in the check and in loading ``measure.mechanisms`` (scipy.special)
for it, and its peak memory. ``--without`` runs the same read with the check removed (the reader
before it). Usage: python benchmarks/bench_pnc_sd_check.py RELEASE [--without]"""
import resource
import sys
import time

import gedp.release.pnc_checks as checks

spent = {"import": 0.0, "check": 0.0}
check = checks.check_pnc_sd


def timed(*arguments):
    started = time.perf_counter()
    import gedp.measure.mechanisms  # noqa: F401 (what the check loads)
    spent["import"] = time.perf_counter() - started
    started = time.perf_counter()
    check(*arguments)
    spent["check"] = time.perf_counter() - started


checks.check_pnc_sd = (lambda *arguments: None) if "--without" in sys.argv else timed
from gedp.release.reader import read_measurements  # noqa: E402

started = time.perf_counter()
frame = read_measurements(sys.argv[1])
wall = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
parts = "without the check" if "--without" in sys.argv else \
    f"check {spent['check']:.2f} s, import {spent['import']:.2f} s"
print(f"{sys.argv[1]}: {len(frame):,} rows, read_measurements {wall:.2f} s ({parts}), peak {peak:.0f} MB")
