"""gedp: Gaussian Establishment DP for QCEW-style establishment statistics (command line and pipeline)."""

from importlib import metadata

try:
    __version__ = metadata.version("gedp")
except metadata.PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0+unknown"
