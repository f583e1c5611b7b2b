"""Shared fixtures: small synthetic states and the path of the shared public QCEW data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from synth.profiles import generate_profile, load_profile

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def small_state():
    """The small profile rescaled to 1,500 establishments (fixed seed): fast end-to-end solves."""
    return generate_profile(load_profile("small"), n_establishments=1_500, rng=np.random.default_rng(7))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, or a skip with the reason when it is absent (a user's machine)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared QCEW data not found at {SHARED_DATA} (present in CI only)")
    return SHARED_DATA
