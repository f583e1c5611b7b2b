"""Establishment microdata: schema, validation, hierarchy, readers and synthetic states."""

from synth.default_state import generate_default_state
from synth.io import read_microdata, write_microdata
from synth.schema import CONFIDENTIAL, InputError, validate_microdata

__all__ = ["CONFIDENTIAL", "InputError", "generate_default_state", "read_microdata", "validate_microdata", "write_microdata"]
