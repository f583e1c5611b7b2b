"""Every reader's re-solve check: a release's protected microdata are the postprocessing of its
answers, checked once per release and remembered by the digest of the files it read.

The checks of the answers alone (``measurement_checks``) cannot see answers that are not there: a
copy with whole queries deleted from its answers and its plan states a smaller budget with the same
tables, and every answer left is genuine. The protected microdata were fitted to *all* the answers,
so they are not the fit of the ones left; neither are microdata moved after the fit, nor answers
drawn again. On a checked read (``reader.read_measurements``) each state's protected microdata are
solved again from its answers and public columns (``refit``, what ``gedp audit --release`` does bit
for bit) and compared within ``RTOL`` of each attribute's largest value: OpenBLAS picks its kernels
by CPU family, which moves low bits (relative <= 1e-10 measured), never a value.

The verdict is kept in the private margin cache (``margins.margins_folder``: owned by the user, not
writable by others) under ``.verdicts/``, in a file named by the SHA-256 of the release's digest
(``margins.release_digest``: its manifest, measurements and protected microdata, every byte) and the
quarter, holding both; a later read of the same bytes pays only the digest. A verdict file is used
only when it is a regular file of the user's, not writable by group or others, holding that digest
and quarter; anything else is ignored and the release solved again. Only a passed check is kept (the
``KEPT_VERDICTS`` most recent).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from gedp.errors import InputError, SolverError

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pandas as pd

    from gedp.release.measurement_checks import MeasurementParts

#: Bumped whenever what the check compares changes (a kept verdict of another format is not used).
VERDICT_FORMAT = 1
VERDICTS_FOLDER = ".verdicts"
#: Verdicts kept at most (the least recently written removed first).
KEPT_VERDICTS = 256
#: Largest difference allowed between a protected value and its re-solved value, relative to the
#: attribute's largest re-solved value in the state: 1e-8, 100 times the CPU families' 1e-10.
RTOL = 1e-8


def refit(manifest: Mapping, protected: pd.DataFrame, measurements: pd.DataFrame, label: str) -> pd.DataFrame:
    """One state's protected microdata recomputed as the release computed them: its noisy answers
    (``measurements``) postprocessed (``protect_microdata``, the models and options of the manifest's
    config, each attribute rounded as solved in an integer release) over its public columns."""
    from gedp.config import parse_config
    from gedp.measure.queries import Groupings
    from gedp.postprocess.models import PostprocessOptions
    from gedp.postprocess.protect import protect_microdata
    from gedp.postprocess.rounding import Rounder
    from gedp.release.reader import answers_of_frame
    from gedp.synth.schema import public_columns

    config = parse_config(manifest["config"], "manifest config", allow_large_mu=True).with_integer(
        bool(manifest["integer"]))
    public = protected[public_columns(protected)]
    answers = answers_of_frame(label, measurements)
    rounder = Rounder(public) if config.integer else None
    solved, _ = protect_microdata({attribute: answers[attribute] for attribute in config.attributes}, public,
                                  PostprocessOptions.from_config(config), finish=rounder, groupings=Groupings(public))
    return solved


def resolve_failures(manifest: Mapping, protected: pd.DataFrame, measurements: pd.DataFrame,
                     parts: MeasurementParts) -> list[str]:
    """Each state's protected attributes whose values are not, within ``RTOL``, the postprocessing of
    the state's answers (``measurements``: the parts' rows in order; ``protected``: of every state)."""
    import numpy as np

    from gedp.synth.schema import public_columns

    failures = []
    ends = np.cumsum(parts.rows)
    if len(parts.rows) and ends[-1] != len(measurements):
        return [f"{len(measurements):,} answers read, the parts hold {int(ends[-1]):,}"]
    states = protected["state"].astype(str).to_numpy()
    for state, end, rows in zip(parts.states, ends, parts.rows):
        rows_of = protected[states == state].reset_index(drop=True)
        answers = measurements.iloc[end - rows:end].reset_index(drop=True)
        try:
            solved = refit(manifest, rows_of, answers, f"state {state}")
        except (InputError, SolverError):
            raise  # gedp's own one-line errors: the answers refused, or a solve that does not finish
        except Exception as err:  # noqa: BLE001 (untrusted files: whatever else stops the solve fails the check)
            failures.append(f"state {state}: the answers cannot be postprocessed again ({type(err).__name__})")
            continue
        for attribute in solved.columns.drop(public_columns(rows_of)):
            expected = solved[attribute].to_numpy(dtype=np.float64)
            found = rows_of[attribute].to_numpy(dtype=np.float64) if attribute in rows_of else np.full_like(
                expected, np.nan)
            allowed = RTOL * max(float(np.abs(expected).max(initial=0.0)), 1.0)
            differ = int((~(np.abs(found - expected) <= allowed)).sum())
            if differ:
                failures.append(f"state {state} {attribute}: {differ:,} of {len(expected):,} values")
    return failures


def check_resolved(release: str | Path, measurements: pd.DataFrame, manifest: Mapping, parts: MeasurementParts,
                   quarter: str | None = None) -> None:
    """Refuse a release (of one ``quarter`` of a panel) whose protected microdata are not the
    postprocessing of its answers (``resolve_failures``), unless a verdict kept for the digest of its
    files says the check held; keep the verdict when it holds."""
    from gedp.release.reader import read_quarter

    name, content = _verdict(release, quarter)
    if _kept(name, content):
        return
    protected = read_quarter(release, quarter)
    failures = resolve_failures(manifest if quarter is None else manifest["per_quarter"][quarter], protected,
                                measurements, parts)
    if failures:
        where = "" if quarter is None else f" (quarter {quarter})"
        raise InputError(f"release '{release}'{where}: its protected microdata are not the postprocessing of its "
                         f"answers ({failures[0]}{'' if len(failures) == 1 else f'; {len(failures) - 1} more'}): "
                         f"an edited copy, which does not hold the guarantee its manifest states; `gedp audit "
                         f"--release` gives the detail")
    _keep(name, content)


def _verdict(release: str | Path, quarter: str | None) -> tuple[Path, dict]:
    """The file a passed check of these files is kept in, and what it holds."""
    from gedp.release.margins import margins_folder, release_digest

    content = {"format": VERDICT_FORMAT, "digest": release_digest(release), "quarter": quarter, "resolved": True}
    name = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
    return margins_folder() / VERDICTS_FOLDER / name, content


def _kept(path: Path, content: dict) -> bool:
    """Whether ``path`` is a kept verdict of ours (a regular file of the user's, not writable by group
    or others, in a folder that is neither) holding ``content``."""
    try:
        for entry in (path.parent, path):
            status = entry.lstat()
            if status.st_uid != os.geteuid() or status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return False
        if not stat.S_ISREG(path.lstat().st_mode) or not stat.S_ISDIR(path.parent.lstat().st_mode):
            return False
        return json.loads(path.read_text(encoding="utf-8")) == content
    except (OSError, ValueError):
        return False


def _keep(path: Path, content: dict) -> None:
    """Keep a verdict in the private cache (``margins.write_kept``: atomically, mode 0600), with the
    ``KEPT_VERDICTS`` most recent."""
    from gedp.release.margins import write_kept

    write_kept(path, json.dumps(content, sort_keys=True), KEPT_VERDICTS)
