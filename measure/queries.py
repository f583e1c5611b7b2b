"""Group-by sum queries over public attributes, and the grouping of establishments they induce."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pandas as pd

from gedp.synth.keycodes import sorted_codes
from gedp.synth.schema import InputError

if TYPE_CHECKING:
    import scipy.sparse as sp

IDENTITY = ("estab_id",)
T = TypeVar("T")


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
    return Groupings(public)(by)


#: Largest product of the key columns' distinct counts that is ranked by one bincount (else by a sort).
DENSE_KEYS = 1 << 24


class Groupings:
    """``group_establishments`` over one frame, each key column factorized once and each grouping
    built once: the groupings of the queries of several attributes share their work.

    The frame's key columns must not change while this object is in use.
    """

    def __init__(self, public: pd.DataFrame) -> None:
        self.public = public
        self._columns: dict[str, tuple[np.ndarray, object] | None] = {}
        self._groupings: dict[tuple[str, ...], Grouping] = {}
        self._made: dict[Hashable, object] = {}

    def __call__(self, by: Sequence[str]) -> Grouping:
        by = tuple(by)
        if by not in self._groupings:
            self._groupings[by] = self._group(by)
        return self._groupings[by]

    def rows(self, queries: Sequence[Sequence[str]]) -> sp.csr_matrix:
        """The 0/1 rows (groups x establishments) of several group-by queries, stacked in order; shared
        by every caller asking for the same queries, so read-only."""
        import scipy.sparse as sp  # imported when first needed: a tabulation groups without it

        queries = tuple(tuple(by) for by in queries)
        n = len(self.public)

        def stacked() -> sp.csr_matrix:
            return sp.vstack([sp.csr_matrix((np.ones(n), (grouping.codes, np.arange(n))), shape=(grouping.n_groups, n))
                              for grouping in map(self, queries)], format="csr")

        return self.made_once(("rows", queries), stacked)

    def made_once(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()`` the first time ``key`` is asked for, the same object after: a structure derived
        from these groupings alone (stacked query rows, the structure the solves of several attributes
        over the same queries share), shared by its callers, so read-only."""
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]  # type: ignore[return-value]

    def _column(self, column: str) -> tuple[np.ndarray, object] | None:
        """Sorted factorization of one column; None for an object column (pandas infers its keys' type)
        or one with missing values (pandas drops those): grouped by pandas then, their rows in no group
        (code -1, as every caller reads a code below 0)."""
        if column not in self._columns:
            values, factorized = self.public[column], None
            if values.dtype != object:
                codes, uniques = sorted_codes(values)
                if not (codes < 0).any():
                    factorized = (codes, uniques)
            self._columns[column] = factorized
        return self._columns[column]

    def _group(self, by: tuple[str, ...]) -> Grouping:
        public = self.public
        missing = [c for c in by if c not in public.columns]
        if missing:
            raise InputError(f"query {query_name(by)} groups by '{missing[0]}', which the input has no column of")
        n = len(public)
        if not by:
            return Grouping(by, np.zeros(n, dtype=np.int64), pd.DataFrame(index=range(1)))
        if by == IDENTITY:
            return Grouping(by, np.arange(n, dtype=np.int64), public[["estab_id"]].reset_index(drop=True))
        factorized = [self._column(c) for c in by]
        sizes = [len(f[1]) for f in factorized if f is not None]
        if any(f is None for f in factorized) or n == 0 or np.prod(sizes, dtype=float) >= 2.0**62:
            grouped = public.groupby(list(by), sort=True, observed=True)
            codes = np.nan_to_num(grouped.ngroup().to_numpy(dtype=float), nan=-1).astype(np.int64)  # -1: no group
            return Grouping(by, codes, grouped.size().index.to_frame(index=False)[list(by)])
        # mixed-radix key of the columns of several values: its numeric order is the lexicographic order
        # of the sorted codes (a column of one value adds nothing to it)
        varying = [(codes, len(uniques)) for codes, uniques in factorized if len(uniques) > 1]
        if len(varying) <= 1:  # every value of the one column present: its codes are the groups'
            codes = varying[0][0] if varying else np.zeros(n, dtype=np.int64)
            values = np.arange(int(np.prod(sizes)))
        else:
            combined = varying[0][0]
            for column_codes, size in varying[1:]:
                combined = combined * size + column_codes
            if np.prod(sizes, dtype=float) <= max(DENSE_KEYS, 4 * n):
                present = np.bincount(combined, minlength=int(np.prod(sizes))) > 0
                values = np.flatnonzero(present)
                codes = (np.cumsum(present) - 1)[combined]
            else:
                values, codes = np.unique(combined, return_inverse=True)
        keys = {}
        for column, (_, uniques) in zip(reversed(by), reversed(factorized)):
            values, digit = np.divmod(values, len(uniques))
            keys[column] = uniques.take(digit)
        return Grouping(by, codes.astype(np.int64, copy=False), pd.DataFrame({c: keys[c] for c in by}))
