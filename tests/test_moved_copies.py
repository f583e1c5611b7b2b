"""Red team rt28 J2's copies (the protected microdata moved, every table changed and the answers untouched;
every answer scaled slightly) are refused by every reader: the re-solve (gedp/release/resolved.py) finds
microdata that are not the postprocessing of the answers. rt28's own check of each group answer against its
group's microdata sum was withdrawn for it: it refused a genuine release whose wages sit at the input maximum
(tests/test_grid_range.py: the fit, held at that bound, lies 3,537 stated sd below a county x NAICS-5 answer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_answer_checks import psi_release, scaled
from test_psi_totals import refused_by_every_reader

import gedp
from gedp.errors import InputError
from gedp.release import resolved

MOVED = "its protected microdata are not the postprocessing of its answers"
ATTRIBUTES = ("m1emp", "m2emp", "m3emp", "wage")


def moved(folder: Path, tmp_path: Path, share: float = 0.5) -> Path:
    """The forgery: ``share`` of every value of the largest county's establishments moved onto the other
    counties' (in proportion to their values: the state's totals kept), answers and manifest untouched."""
    import shutil

    copy = tmp_path / "moved"
    shutil.copytree(folder, copy)
    for part in (copy / "protected.parquet").glob("*.parquet"):
        protected = pd.read_parquet(part)
        county = protected["county"].astype(str)
        here = (county == county.value_counts().index[0]).to_numpy()
        for name in ATTRIBUTES:
            values = protected[name].to_numpy(dtype=np.float64).copy()
            taken = values[here] * share
            values[here] -= taken
            values[~here] += taken.sum() * values[~here] / values[~here].sum()
            protected[name] = values
        protected.to_parquet(part, index=False)
    return copy


def test_moved_microdata_are_refused_by_every_reader(tmp_path, monkeypatch):
    """Power: with the re-solve off, the copy whose largest county's values were half moved onto the others
    is read (every other check passes it: the state's totals are kept); with it, every reader refuses it in
    one line."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    release = psi_release(tmp_path, 1, "pnc")
    copy = moved(release, tmp_path)
    with monkeypatch.context() as unchecked:
        unchecked.setattr(resolved, "check_resolved", lambda *args: None)
        unchecked.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache-unchecked"))
        assert gedp.read_release(copy).privacy["mu"] > 0
    refused_by_every_reader(copy, tmp_path, MOVED)


def test_every_answer_scaled_up_slightly_is_refused(tmp_path, monkeypatch):
    """claim27's open gap: every answer of a psi release scaled by 1 / 0.9^2 (the budget stated 0.9 times
    the one spent) passes its totals check (S / T 1.23, below its factor 2) but not the re-solve. Power: with
    the re-solve off the copy is read."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    release = psi_release(tmp_path, 1)
    spent = gedp.read_release(release).privacy["mu"]
    copy = scaled(release, tmp_path, 0.9)
    with monkeypatch.context() as unchecked:
        unchecked.setattr(resolved, "check_resolved", lambda *args: None)
        unchecked.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache-unchecked"))
        assert gedp.read_release(copy).privacy["mu"] < 0.91 * spent
    with pytest.raises(InputError, match=MOVED):
        _ = gedp.read_release(copy).privacy
