"""How a protection runs, as three values built once (from the command line's flags or in Python) and
passed to ``gedp.protect``: where the release is recorded (``Ledger``), where it is computed
(``Engine``) and how the input is read (``Input``). The config itself (its workflow, rounding and mu
limits) is ``gedp.load``'s.

    gedp.protect(data, "recommended", ledger=gedp.Ledger("budget.json", lifetime_cap=10),
                 engine=gedp.Engine(processes=2), input=gedp.Input(columns={"ruid": "estab_id"}))

Each value is checked when it is used, before anything is read: a cap without a ledger cannot be
said, a dask scheduler must be ``tls://`` with credentials (unless ``insecure_scheduler``), and a
ledger records releases for publication only.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

from gedp.errors import InputError

#: A ledger's caps or id given without the ledger.
CAPS_WITHOUT_LEDGER = "--lifetime-cap, --annual-cap and --dataset-id go with --ledger FILE"


@dataclass(frozen=True)
class Ledger:
    """The lifetime budget ledger (a JSON file the agency keeps, never published) that records the
    release: refused before any noise is drawn when it would take the dataset (its records, or
    ``dataset_id``) over ``lifetime_cap`` (needed the first time) or any 4 consecutive quarters over
    ``annual_cap``; committed once the release is complete."""

    path: str | Path
    lifetime_cap: float | None = None
    annual_cap: float | None = None
    dataset_id: str | None = None

    @classmethod
    def from_flags(cls, path: str | Path | None, lifetime_cap: float | None = None, annual_cap: float | None = None,
                   dataset_id: str | None = None) -> Ledger | None:
        """The ledger ``gedp protect --ledger --lifetime-cap --annual-cap --dataset-id`` names (None
        without ``--ledger``; a cap or an id without it is refused)."""
        if path is None and (lifetime_cap is not None or annual_cap is not None or dataset_id is not None):
            raise InputError(CAPS_WITHOUT_LEDGER)
        return None if path is None else cls(path, lifetime_cap, annual_cap, dataset_id)


class TlsFiles(NamedTuple):
    """The TLS files that reach an existing scheduler (``--tls-ca-file``, ``--tls-cert``, ``--tls-key``),
    read when the engine starts: an ``Engine``'s ``security`` may be these or a ``Security``."""

    ca_file: Path | None = None
    cert: Path | None = None
    key: Path | None = None


@dataclass(frozen=True)
class Engine:
    """Where the states of an input are protected: ``"local"`` (``processes`` worker processes;
    None: one per usable CPU and per 100,000 rows; 1: one after the other) or ``"dask"``, on a
    built-in loopback cluster with keys made for the run, or on an existing ``scheduler`` (a
    ``tls://`` address reached with ``security``, a ``distributed.security.Security``, unless
    ``insecure_scheduler``, which is warned on stderr)."""

    name: str = "local"
    scheduler: str | None = None
    security: Any = None
    insecure_scheduler: bool = False
    processes: int | None = None


@dataclass(frozen=True)
class Input:
    """How the input is read: ``columns`` maps the agency's column names to gedp's
    (``{"ruid": "estab_id"}``; names like ``month1_emplvl`` and ``cnty`` are recognized without it),
    ``pad_codes`` zero-pads codes that lost their leading zeros, and ``jobs`` is the job table
    (a DataFrame or a file) of a config with job families (e.g. "jobs")."""

    columns: Mapping[str, str] | None = None
    pad_codes: bool = False
    jobs: Any = None


#: The keywords ``gedp.protect`` took before these values, by the value that now holds each.
LEGACY_KEYWORDS = {
    "ledger": ("lifetime_cap", "annual_cap", "dataset_id"),
    "engine": ("scheduler", "security", "insecure_scheduler", "processes"),
    "input": ("columns", "pad_codes", "jobs"),
    "config": ("workflow", "integer", "allow_large_mu"),
}
_VALUES: dict[str, Callable[..., Any]] = {"ledger": Ledger, "engine": Engine, "input": Input}


Protect = TypeVar("Protect", bound=Callable[..., Any])


def accepts_legacy_keywords(protect: Protect) -> Protect:
    """``protect`` also called with the keywords of gedp 0.x (``ledger="file.json", lifetime_cap=3``,
    ``engine="dask", scheduler=...``, ``jobs=...``, ``workflow="psi"``, ...): they are gathered into
    the values above, with a DeprecationWarning naming the new spelling; they go in the next version."""

    @functools.wraps(protect)
    def protect_with_legacy_keywords(microdata: Any, *args: Any, **keywords: Any) -> Any:
        legacy = sorted([name for names in LEGACY_KEYWORDS.values() for name in names if name in keywords]
                        + [name for name in ("ledger", "engine") if isinstance(keywords.get(name), (str, Path))])
        if legacy:
            warnings.warn(f"gedp.protect's keywords {', '.join(legacy)} are deprecated: give "
                          "ledger=gedp.Ledger(...), engine=gedp.Engine(...), input=gedp.Input(...), and "
                          "gedp.load(config, workflow=..., integer=..., allow_large_mu=...) as the config",
                          DeprecationWarning, stacklevel=2)
            if args:  # the config, given by position
                keywords["config"], args = args[0], args[1:]
            keywords = _gathered(keywords)
        return protect(microdata, *args, **keywords)

    return cast(Protect, protect_with_legacy_keywords)


def _gathered(keywords: dict[str, Any]) -> dict[str, Any]:
    """``keywords`` with the legacy ones folded into Ledger, Engine, Input and the loaded config."""
    from gedp.config import resolve_config
    from gedp.configs import DEFAULT_CONFIG

    gathered = dict(keywords)
    for holder, names in LEGACY_KEYWORDS.items():
        given = {name: gathered.pop(name) for name in names if name in gathered}
        current = gathered.get(holder)
        if holder == "config":
            if given:
                gathered["config"] = resolve_config(DEFAULT_CONFIG if current is None else current, **given)
            continue
        if isinstance(current, (str, Path)):  # ledger="file.json", engine="dask"
            given = {("path" if holder == "ledger" else "name"): current, **given}
        elif holder == "ledger" and given and current is None:  # caps without a ledger: refused as before
            raise InputError(CAPS_WITHOUT_LEDGER)
        elif current is not None and given:
            raise TypeError(f"gedp.protect: {', '.join(given)} cannot be given beside {holder}={current!r}")
        if given:
            gathered[holder] = _VALUES[holder](**given)
    return gathered
