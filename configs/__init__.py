"""Budget plans shipped with gedp (YAML): recommended (the main path: the plan `gedp plan` made from
a published QCEW file), baseline and uniform (the paper's E2), employment (E1), and
establishment-and-worker (E1 under the combined psi sqrt-linear)."""

from pathlib import Path

DIRECTORY = Path(__file__).parent
#: The config of the main path (`gedp run`, `gedp protect` and the API's protect); `baseline` and `uniform`
#: stay for the paper's experiments.
DEFAULT_CONFIG = "recommended"


def available() -> list[str]:
    """Names of the shipped configs."""
    return sorted(p.stem for p in DIRECTORY.glob("*.yaml"))


def path(name: str) -> Path:
    """Path of a shipped config by name (e.g. 'baseline')."""
    candidate = DIRECTORY / f"{name}.yaml"
    if not candidate.is_file():
        raise FileNotFoundError(f"no shipped config '{name}'; shipped: {', '.join(available())}")
    return candidate
