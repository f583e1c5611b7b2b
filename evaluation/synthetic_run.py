"""``gedp run``: protect a synthetic state (a built-in profile) and measure the release's accuracy
against its truth, which may be shown because the input is synthetic."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gedp.config import Config, resolve_config
from gedp.errors import run_started
from gedp.evaluation.compare import compare_tabulations, error_summary
from gedp.evaluation.synthetic_states import DEFAULT_STATE_SEED
from gedp.release.format import ACCURACY_FILE, PROTECTED_FILE
from gedp.release.writer import check_output_directory
from gedp.running.engine import protect_input
from gedp.synth.profiles import generate_profile, load_profile
from gedp.synth.schema import CONFIDENTIAL

#: Tabulations whose accuracy `gedp run` reports (its input is synthetic, so truth may be shown).
ACCURACY_CHECKS = {
    "state total": ["state"],
    "county": ["state", "county"],
    "state x NAICS-5": ["state", "naics5"],
    "county x NAICS-5": ["state", "county", "naics5"],
    "county x NAICS-6 (unmeasured)": ["state", "county", "naics"],
}


@dataclass(frozen=True)
class SyntheticRun:
    """A written release of a synthetic state: its manifest, the accuracy file written with it
    (tabulation label -> attribute -> error summary), the profile's name and the config's attributes."""

    manifest: dict
    accuracy: dict
    profile: str
    attributes: tuple[str, ...]


@run_started()  # a SIGTERM an earlier run of this process survived does not stop this one
def protect_synthetic(out: Path, config: str, *, profile: str, establishments: int | None = None,
                      seed: int | None = None, rng: str | None = None, workflow: str | None = None,
                      on_state: Callable[[str], None] = lambda state: None) -> SyntheticRun:
    """Protect the state of ``profile`` (``establishments`` rescales it; drawn with
    ``DEFAULT_STATE_SEED``, synthetic jobs too when the config has job families) into ``out``, with
    its accuracy against the truth (``ACCURACY_CHECKS``) written beside the release."""
    cfg = resolve_config(config, workflow)
    check_output_directory(out.resolve())
    spec = load_profile(profile)
    truth = generate_profile(spec, n_establishments=establishments, rng=np.random.default_rng(DEFAULT_STATE_SEED))
    truth = truth.drop(columns=[c for c in CONFIDENTIAL if c not in cfg.attributes])
    jobs = None
    if cfg.jobs is not None:
        from gedp.synth.jobs import synthesize_jobs

        jobs = synthesize_jobs(truth, rng=np.random.default_rng(DEFAULT_STATE_SEED))
    manifest = protect_input(truth, cfg, out, seed=seed, rng=rng, jobs=jobs, on_state=on_state,
                             extra_files=lambda staging: {ACCURACY_FILE: _accuracy(truth, staging, cfg)})
    accuracy = json.loads((out.resolve() / ACCURACY_FILE).read_text())
    return SyntheticRun(manifest, accuracy, spec["name"], tuple(cfg.attributes))


def _accuracy(truth: pd.DataFrame, release: Path, config: Config) -> dict:
    """Error summaries of the release's tabulations against the synthetic truth."""
    protected = pd.read_parquet(release / PROTECTED_FILE)
    return {label: {attribute: error_summary(compare_tabulations(truth, protected, by, attribute))
                    for attribute in config.attributes}
            for label, by in ACCURACY_CHECKS.items()}
