"""Establishment microdata: schema, validation, hierarchy, readers and synthetic states."""

from gedp.synth.io import read_microdata, write_microdata
from gedp.synth.profiles import generate_profile, load_profile
from gedp.synth.schema import CONFIDENTIAL, InputError, validate_microdata

__all__ = ["CONFIDENTIAL", "InputError", "generate_profile", "load_profile", "read_microdata", "validate_microdata",
           "write_microdata"]
