"""Establishment microdata: schema, validation, hierarchy, readers and synthetic states.

The names below are imported on first use, so that the first check of an input
(``gedp.synth.intake``) runs before numpy and pandas are imported.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gedp.synth.io import read_microdata, write_microdata
    from gedp.synth.profiles import generate_profile, load_profile
    from gedp.synth.schema import CONFIDENTIAL, InputError, validate_microdata

__all__ = ["CONFIDENTIAL", "InputError", "generate_profile", "load_profile", "read_microdata", "validate_microdata",
           "write_microdata"]
_HOMES = {"read_microdata": "io", "write_microdata": "io", "generate_profile": "profiles", "load_profile": "profiles",
          "CONFIDENTIAL": "schema", "InputError": "schema", "validate_microdata": "schema"}


def __getattr__(name: str) -> object:
    if name in _HOMES:
        from importlib import import_module

        return getattr(import_module(f"gedp.synth.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'gedp.synth' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
