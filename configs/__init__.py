"""Budget plans shipped with gedp (YAML): baseline and uniform (SPEC E2), employment (SPEC E1), and
establishment-and-worker (E1 under the combined psi sqrt-linear)."""

from pathlib import Path

DIRECTORY = Path(__file__).parent


def available() -> list[str]:
    """Names of the shipped configs."""
    return sorted(p.stem for p in DIRECTORY.glob("*.yaml"))


def path(name: str) -> Path:
    """Path of a shipped config by name (e.g. 'baseline')."""
    candidate = DIRECTORY / f"{name}.yaml"
    if not candidate.is_file():
        raise FileNotFoundError(f"no shipped config '{name}'; shipped: {', '.join(available())}")
    return candidate
