"""A benchmark's section of results: printed, and appended to benchmarks/RESULTS.md unless told not to."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def report(lines: list[str], record: bool = True) -> None:
    """Print ``lines`` and, when ``record``, append them to RESULTS.md after a blank line."""
    print("\n".join(lines))
    if record:
        with RESULTS.open("a", encoding="utf-8") as results:
            results.write("\n" + "\n".join(lines))
