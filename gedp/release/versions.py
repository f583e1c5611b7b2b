"""The software versions a release records (and its kept margin structure is keyed by): a module of
its own, light to import, so that a request that only reads a release need not load the manifest's
builder."""

from __future__ import annotations

import functools
from importlib import metadata

VERSIONED_PACKAGES = ("gedp", "numpy", "scipy", "pandas", "pyarrow", "cvxpy", "osqp", "clarabel")


def versions() -> dict[str, str]:
    """Versions of gedp and the packages its numbers depend on."""
    return dict(_versions())


@functools.cache
def _versions() -> dict[str, str]:
    return {package: package_version(package) for package in VERSIONED_PACKAGES}


def package_version(package: str) -> str:
    """The installed version of one package ("not installed" when it is not): a request that needs
    gedp's alone does not look up the others'."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"
