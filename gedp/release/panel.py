"""Writing a panel release: the releases of its quarters joined into one folder whose protected
microdata and measurements carry a quarter key (``format.QUARTER_KEY``), whose QCEW tables hold
every quarter (their year and qtr columns tell them apart) and whose manifest lists the quarters
and keeps each quarter's own manifest (``manifest.panel_manifest``).

Each quarter's parts become ``part-<quarter>-<part>.parquet``: read in name order, the rows come
quarter by quarter, each quarter's in its own release order.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from gedp.measure.design import QuarterDesign
from gedp.release.format import MEASUREMENTS_FILE, PROTECTED_FILE, TABLES_FILE
from gedp.release.manifest import Manifest, panel_manifest
from gedp.release.writer import write_manifest

#: The manifest of a panel's quarter while it waits to be joined: not ``manifest.json``, so that no
#: reader takes a quarter, which the ledger charges only as part of its panel, for a release.
QUARTER_MANIFEST_FILE = "quarter-manifest.json"


def move_parts(source: Path, target: Path) -> None:
    """Move the Parquet parts of ``source`` (a quarter's output folder, its parts keyed and named by
    the quarter already: ``writer.StateParts``) into ``target``."""
    target.mkdir(exist_ok=True)
    for part in sorted(source.glob("part-*.parquet")):
        os.replace(part, target / part.name)


def write_panel(quarters: dict[str, Path], staging: Path, design: QuarterDesign, establishments: int, *,
                lifetime: dict | None = None, before_publish: Callable[[], None] | None = None,
                over_cap: bool = False) -> Manifest:
    """Join the quarters' folders (label -> folder, in order; each written with its quarter key and
    its manifest as ``QUARTER_MANIFEST_FILE``) into the staging folder of a panel release, moving
    their parts; returns its manifest, written last (``writer.write_manifest``). ``lifetime``: the
    manifest's lifetime-budget section of the panel's ledger reservation; ``before_publish``: the
    ledger's commit, run just before the manifest is written; ``over_cap``: the panel spends more than
    its config's cap, as the user allowed (``manifest.panel_manifest``)."""
    with (staging / TABLES_FILE).open("w") as tables:
        for index, (quarter, folder) in enumerate(quarters.items()):
            for name in (PROTECTED_FILE, MEASUREMENTS_FILE):
                move_parts(folder / name, staging / name)
            lines = (folder / TABLES_FILE).read_text().splitlines(keepends=True)
            tables.writelines(lines if index == 0 else lines[1:])
    manifest = panel_manifest({quarter: json.loads((folder / QUARTER_MANIFEST_FILE).read_text())
                               for quarter, folder in quarters.items()}, design, establishments, over_cap)
    if lifetime is not None:
        manifest["lifetime"] = lifetime
    write_manifest(staging, manifest, {}, before_publish)
    return manifest

