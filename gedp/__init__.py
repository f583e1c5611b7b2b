"""gedp: Gaussian Establishment DP for QCEW-style establishment statistics.

Subpackages: gedp.synth (inputs and synthetic states), gedp.measure (mechanisms and budgets),
gedp.postprocess (least squares and margins of error), gedp.evaluation (experiments), gedp.configs
(shipped budget plans).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # type checkers see the API's signatures; at run time it is imported on first use
    from gedp.api import (
        Engine,
        Input,
        Ledger,
        Release,
        combine,
        interval,
        load,
        plan,
        protect,
        read_release,
        report,
        synthesize,
    )

    __version__: str

#: The public API (gedp.api), imported on first use so that `gedp --help` starts fast.
__all__ = ["__version__", "Engine", "Input", "Ledger", "Release", "combine", "interval", "load", "plan", "protect",
           "read_release", "report", "synthesize"]
_API = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> object:
    if name in _API:
        from gedp import api

        return getattr(api, name)
    if name == "__version__":  # read on first use: importing gedp (the executable's first step) stays instant
        from importlib import metadata

        try:
            version = metadata.version("gedp")
        except metadata.PackageNotFoundError:  # running from a source tree without installation
            version = "0+unknown"
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module 'gedp' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API, with the names the lazy ``__getattr__`` provides (``dir(gedp)``)."""
    return sorted({*globals(), *__all__})
