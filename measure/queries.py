"""Group-by sum queries over public attributes, and the grouping of establishments they induce."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gedp.synth.schema import InputError

IDENTITY = ("estab_id",)


def query_name(by: Sequence[str]) -> str:
    """'identity', 'total', or the grouping columns joined by commas."""
    by = tuple(by)
    if by == IDENTITY:
        return "identity"
    return ",".join(by) if by else "total"


@dataclass(frozen=True)
class Query:
    """A group-by sum of one confidential attribute; ``by = ()`` is the total, IDENTITY the identity."""

    by: tuple[str, ...]
    attribute: str

    @property
    def name(self) -> str:
        return query_name(self.by)

    @property
    def is_identity(self) -> bool:
        return self.by == IDENTITY


@dataclass(frozen=True, eq=False)
class Grouping:
    """Which group every establishment falls in: ``codes[j]`` indexes a row of ``keys``.

    Groups are sorted by their key values, so the same public data always gives the same order.
    """

    by: tuple[str, ...]
    codes: np.ndarray
    keys: pd.DataFrame

    @property
    def n_groups(self) -> int:
        return len(self.keys)

    def sum(self, values: np.ndarray) -> np.ndarray:
        """Group totals of establishment values."""
        return np.bincount(self.codes, weights=values, minlength=self.n_groups)

    def max(self, values: np.ndarray) -> np.ndarray:
        """Group maxima of establishment values (every group is non-empty)."""
        out = np.full(self.n_groups, -np.inf)
        np.maximum.at(out, self.codes, values)
        return out


def group_establishments(public: pd.DataFrame, by: Sequence[str]) -> Grouping:
    """Group the establishments of ``public`` by the columns ``by`` (() -> one group of all)."""
    by = tuple(by)
    missing = [c for c in by if c not in public.columns]
    if missing:
        raise InputError(f"query {query_name(by)} groups by '{missing[0]}', which the input has no column of")
    n = len(public)
    if not by:
        return Grouping(by, np.zeros(n, dtype=np.int64), pd.DataFrame(index=range(1)))
    if by == IDENTITY:
        return Grouping(by, np.arange(n, dtype=np.int64), public[["estab_id"]].reset_index(drop=True))
    grouped = public.groupby(list(by), sort=True, observed=True)
    codes = grouped.ngroup().to_numpy(dtype=np.int64)
    keys = grouped.size().index.to_frame(index=False)[list(by)]
    return Grouping(by, codes, keys)
