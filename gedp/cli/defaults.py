"""Option defaults of commands whose implementations are imported only when they run, written out
so that `gedp --help` imports none of them (tests/test_cli.py checks each against its source:
gedp.synth.profiles.DEFAULT_PROFILE and available_profiles, E3Setup, E5Setup and SuppressionRule)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

DEFAULT_PROFILE = "small"
E3_DEFAULTS: dict[str, Any] = {"counties": 100, "per_county": 2, "employees": 10.0, "gamma_sqrt": 0.5, "gamma_log": 0.1,
                               "mu": 1.0}
E5_DEFAULTS = {"infusion_s": 0.05, "infusion_t": 0.15, "delta": 1e-3}
SUPPRESSION_DEFAULTS: dict[str, Any] = {"p": 10.0, "min_estabs": 3, "attributes": ("m1emp", "wage")}


def available_profiles() -> list[str]:
    """Names of the built-in profiles (the JSON files of gedp.synth's profiles folder), found
    without importing gedp.synth."""
    spec = importlib.util.find_spec("gedp.synth")
    folders = spec.submodule_search_locations if spec is not None else None
    return sorted({p.stem for folder in folders or () for p in (Path(folder) / "profiles").glob("*.json")})
