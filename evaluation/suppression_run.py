"""``gedp suppress``: cell suppression as the QCEW runs it on an experiment's microdata, audited and
written as a report folder (cells, audit, shares, report and plot)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from gedp.errors import InputError
from gedp.evaluation.baselines.suppression import SuppressionRule, check_microdata, suppress
from gedp.evaluation.report import mark_confidentiality
from gedp.evaluation.suppression_report import write_suppression
from gedp.evaluation.synthetic_states import experiment_data
from gedp.release.format import SUMMARY_FILE, check_outside_releases
from gedp.release.writer import staged_directory

#: A progress display of the audit: yields callbacks ``(done, total)`` and ``(message)`` (a repair round).
AuditProgress = Callable[[], AbstractContextManager[tuple[Callable[[int, int], None], Callable[[str], None]]]]


@dataclass(frozen=True)
class SuppressionRun:
    """A written suppression report: its summary, the rule's first attribute and whether the
    published suppression was compared (``shares`` rows then have ``published_share``)."""

    summary: dict
    attribute: str
    published: bool


def _no_progress() -> AbstractContextManager[tuple[Callable[[int, int], None], Callable[[str], None]]]:
    return nullcontext((lambda done, total: None, lambda message: None))


def run_suppression(out: Path, *, data: Path | None, from_qcew: Path | None, profile: str, p: float,
                    min_estabs: int, attributes: str, audit: bool = True, seed: int = 1, every_lp: bool = False,
                    progress: AuditProgress = _no_progress) -> SuppressionRun:
    """Suppress the cells of ``data``, of a state synthesized from ``from_qcew`` (compared with its
    published suppression) or of ``profile``'s state by the p% rule and ``min_estabs``, over
    ``attributes`` (comma-separated); audit them by LP (``every_lp``: both LPs of every cell) unless
    ``audit`` is False, and write the report into the folder ``out`` (never into a release)."""
    check_outside_releases(out)
    try:
        rule = SuppressionRule(p=p, min_estabs=min_estabs,
                               attributes=tuple(a.strip() for a in attributes.split(",") if a.strip()))
    except ValueError as err:
        raise InputError(str(err)) from None
    microdata, label, published = experiment_data(data, from_qcew, profile, seed)
    try:
        check_microdata(microdata, rule.attributes)
    except ValueError as err:
        raise InputError(str(err)) from None
    published_shares = None if published is None else published.suppressed_shares()
    with staged_directory(out, marker=SUMMARY_FILE) as staging:
        with progress() as (update, say):
            result = suppress(microdata, rule, audit=audit, on_round=say, progress=update, every_lp=every_lp)
        write_suppression(staging, microdata, result, data_label=label, published_shares=published_shares)
        summary = mark_confidentiality(staging, confidential=data is not None)
    return SuppressionRun(summary, rule.attributes[0], published_shares is not None)
