"""Establishment microdata: schema, validation, hierarchy, readers and synthetic states."""

from synth.io import read_microdata, write_microdata
from synth.profiles import generate_profile, load_profile
from synth.schema import CONFIDENTIAL, InputError, validate_microdata

__all__ = ["CONFIDENTIAL", "InputError", "generate_profile", "load_profile", "read_microdata", "validate_microdata",
           "write_microdata"]
