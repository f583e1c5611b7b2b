"""``gedp audit``: one of the two audits, its options checked before it runs, and its results as
rows (written as JSON with ``out``): the checks of a written release, or the pipeline's statistics."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gedp.errors import InputError
from gedp.release.format import check_outside
from gedp.tabulation.output_files import check_output_file, write_atomically

if TYPE_CHECKING:
    from gedp.audit.pipeline import StatisticResult
    from gedp.audit.release import Check

#: A progress display of a number of runs: yields the callback that advances it by one named step.
Steps = Callable[[int], AbstractContextManager[Callable[[str], None]]]


@dataclass(frozen=True)
class AuditResult:
    """The checks of a release audit, or the statistics of a pipeline audit, and both as rows
    (``name``, ``passed``, ...)."""

    checks: list[Check]
    statistics: list[StatisticResult]
    rows: list[dict]

    @property
    def failed(self) -> list[dict]:
        return [row for row in self.rows if not row["passed"]]


def run_audit(release: Path | None = None, *, pipeline: bool = False, runs: int = 200, config: str = "audit",
              broken: bool = False, workers: int = 2, out: Path | None = None,
              progress: Steps = lambda total: nullcontext(lambda step: None)) -> AuditResult:
    """Audit the written ``release``'s bytes against its manifest, or (``pipeline``) the release path
    by ``runs`` protections of two neighbouring datasets under ``config`` on ``workers`` processes
    (``broken``: with the noise sd halved and the full sd claimed); with ``out``, the rows as JSON."""
    if (release is None) == (not pipeline):
        raise InputError("give one of --release DIR or --pipeline")
    if runs < 20:
        raise InputError(f"--runs ({runs}) must be >= 20")
    if workers < 1:
        raise InputError(f"--workers ({workers}) must be >= 1")
    if out is not None:  # refused before the audit runs, not after
        check_output_file(out)
        if release is not None:
            check_outside(release, out)
    if release is not None:
        from gedp.audit.release import audit_release

        checks = audit_release(release)
        result = AuditResult(checks, [], [dataclasses.asdict(check) for check in checks])
    else:
        from gedp.audit.pipeline import run_pipeline_audit

        with progress(runs) as advance:
            statistics = run_pipeline_audit(config, runs=runs, noise_factor=0.5 if broken else 1.0, workers=workers,
                                            on_run=lambda: advance("protecting D1 and D2"))
        result = AuditResult([], statistics, [{"name": r.statistic, **r.row()} for r in statistics])
    if out is not None:
        write_atomically(out, lambda path: path.write_text(json.dumps(result.rows, indent=2) + "\n"))
    return result
