"""Implicates of a release: M complete microdata files drawn from the posterior of the confidential
values given the release's answers (``postprocess.implicates``), written implicate by implicate.

They read the release's files only (its manifest, protected public columns and identity answers),
spend no budget (postprocessing) and change none of the release's bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gedp.errors import InputError
from gedp.release.format import IMPLICATES_SUMMARY, MEASUREMENTS_FILE
from gedp.synth.schema import CONFIDENTIAL

if TYPE_CHECKING:
    from gedp.release.implicates_folder import DrawnImplicates

IMPLICATE_KEY = "implicate"
#: Establishments drawn at a time (memory: a few arrays of this many rows x ~150 prior components).
BLOCK_ROWS = 32_768
#: Most implicates of one request.
MAX_IMPLICATES = 1000


@dataclass
class ReleaseDraws:
    """What drawing a release's implicates needs, read from its files."""

    public: pd.DataFrame  # the protected microdata's columns but the attributes, release order
    models: list  # per state: (row positions, PosteriorModel)


def implicate_file(k: int, m: int) -> str:
    """The file name of implicate ``k`` of ``m`` (names sort in implicate order)."""
    return f"implicate-{k:0{max(2, len(str(m)))}d}.parquet"


def check_count(m: object) -> int:
    """The number of implicates, refused unless a whole number in 1..MAX_IMPLICATES."""
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or not 1 <= m <= MAX_IMPLICATES:
        raise InputError(f"number of implicates ({m!r}) must be a whole number from 1 to {MAX_IMPLICATES}")
    return int(m)


def identity_answers(release: Path, answers: dict, ids: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Released psi-scale identity answers and their sds (rows in ``ids``' order x attributes), from the
    release's ``answers`` by attribute (``reader.read_answers``)."""
    values = np.full((len(ids), len(CONFIDENTIAL)), np.nan)
    sds = np.full((len(ids), len(CONFIDENTIAL)), np.nan)
    position = pd.Index(ids)
    for k, attribute in enumerate(CONFIDENTIAL):
        for answer in (held for held in answers.get(attribute, []) if held.query.is_identity):
            if answer.mechanism != "psi":
                raise InputError(f"release '{release}': the identity answers of {attribute} are not "
                                 "the psi-mechanism's")
            where = position.get_indexer(answer.keys["estab_id"])
            found = where >= 0
            values[where[found], k] = np.asarray(answer.released, dtype=float)[found]
            sds[where[found], k] = np.asarray(answer.sd, dtype=float)[found]
    missing = ~np.isfinite(values) | ~(np.isfinite(sds) & (sds > 0))
    if missing.any():
        k = int(np.argmax(missing.any(axis=0)))
        raise InputError(f"release '{release}' has no identity answer of {CONFIDENTIAL[k]} for "
                         f"{int(missing[:, k].sum()):,} establishments: implicates need a plan with the identity "
                         "query for every attribute")
    return values, sds


def check_public_groups(answers: dict, public: pd.DataFrame) -> None:
    """Every answer (by attribute) over the establishments' public columns has the keys of their groups,
    in order (``wls.check_answer_groups``): implicates refuse the answers ``gedp tabulate --moe`` refuses,
    though they draw from the identity answers only."""
    from gedp.postprocess.wls import check_answer_groups

    check_answer_groups([answer for held in answers.values() for answer in held
                         if set(answer.query.by) <= set(public.columns)], public)


def prepare(release: str | Path, rng: np.random.Generator, quarter: str | None = None,
            note: Callable[[str], None] | None = None, level_prior: str = "month1",
            change_prior: str = "independent", wage_prior: str = "sector") -> ReleaseDraws:
    """Read a release (one ``quarter`` of a panel release) and fit each state's priors (``level_prior``:
    ``postprocess.prior_components.LEVEL_PRIORS``; ``change_prior``: ``CHANGE_PRIORS``; ``wage_prior``:
    ``WAGE_PRIORS``, with ``cells`` the county x NAICS-6 cells of the public columns)."""
    from gedp.measure.neighbors import make_psi
    from gedp.postprocess.implicates import CELL_CHANGES, PosteriorModel, StateAnswers
    from gedp.postprocess.prior_components import CHANGE_PRIORS, LEVEL_PRIORS, WAGE_PRIORS, checked_prior
    from gedp.postprocess.structured import one_blas_thread
    from gedp.release.reader import quarter_manifest, read_answers

    release = Path(release)
    level_prior = checked_prior("level", level_prior, LEVEL_PRIORS)
    change_prior = checked_prior("change", change_prior, CHANGE_PRIORS)
    cells_wanted = checked_prior("wage", wage_prior, WAGE_PRIORS) == "cells"
    manifest = quarter_manifest(release, quarter)
    psi = make_psi(**manifest["psi"])
    public = release_public(release, quarter)
    answers = read_answers(release, quarter)  # read and checked once: the groups' keys, then the identity answers
    check_public_groups(answers, public)
    values, sds = identity_answers(release, answers, public["estab_id"])
    models = []
    cells = (public.groupby(["county", "naics"], sort=False, dropna=False).ngroup().to_numpy()
             if cells_wanted or CELL_CHANGES else None)
    for state, rows in public.groupby("state", sort=False).indices.items():
        if note is not None:
            note(f"fitting priors of state {state} ({len(rows):,} establishments)")
        answers = StateAnswers(months=values[rows, :3], month_sd=sds[rows, :3].mean(axis=0), wage=values[rows, 3],
                               wage_sd=float(sds[rows, 3].mean()),
                               industry=pd.factorize(public["sector"].to_numpy()[rows])[0],
                               cell=None if cells is None or not cells_wanted else pd.factorize(cells[rows])[0],
                               change_cell=None if cells is None else pd.factorize(cells[rows])[0])
        with one_blas_thread:
            models.append((rows, PosteriorModel(answers, psi, rng, level_prior, change_prior)))
    return ReleaseDraws(public, models)


def release_public(release: Path, quarter: str | None = None) -> pd.DataFrame:
    """The columns implicates are drawn beside: the protected microdata's but the attributes, validated
    (refused as tabulate refuses them) and in the release's order (``in_stored_order``)."""
    from gedp.release.reader import read_validated

    protected = in_stored_order(release, read_validated(release, quarter))
    return protected.drop(columns=[c for c in CONFIDENTIAL if c in protected.columns])


def in_stored_order(release: Path, validated: pd.DataFrame) -> pd.DataFrame:
    """The validated protected microdata (``reader.read_validated``: duplicated ids, codes that are not
    codes, values that are not finite refused) in the release's column order (the implicates' order)."""
    import pyarrow.parquet as pq

    from gedp.release.reader import release_parts

    stored = [c for c in pq.ParquetDataset(release_parts(release)).schema.names if c in validated.columns]
    return validated[[*stored, *(c for c in validated.columns if c not in stored)]]


#: Runs tasks: ``map_tasks(task, shared, items, on_result)`` calls ``on_result(index, task(shared, item))`` for
#: every item, in the items' order (``gedp.planning.workers.parallel_map`` on worker processes).
TaskMap = Callable[[Callable[[Any, Any], Any], Any, Sequence[Any], Callable[[int, Any], None]], Any]


def draw_blocks(draws: ReleaseDraws, m: int, rng: np.random.Generator, take: Callable[[np.ndarray, list], None],
                map_tasks: TaskMap | None = None) -> None:
    """For each block of establishments, in order: ``take(positions into the release's rows, its m draws of
    the attributes (rows x m1emp, m2emp, m3emp, wage))``. Without ``map_tasks``, from ``rng`` itself, one
    stream through the priors and blocks; with it, from streams of their own (``stream``), each
    implicate's priors and each block's chain a task ``map_tasks`` runs: the same draws for any
    number of workers (other bits than the one stream's, the same distribution)."""
    if map_tasks is None:
        for rows, model in draws.models:
            priors = _replicate_priors(model, m, rng)
            for start in range(0, len(rows), BLOCK_ROWS):
                take(rows[start:start + BLOCK_ROWS], _block_draws(model, priors, start, len(rows), rng))
        return
    entropy = [int(word) for word in rng.integers(0, 2**63, size=STREAM_WORDS)]
    for s, (rows, model) in enumerate(draws.models):
        priors: list = []
        map_tasks(_replicate_task, (model, entropy, s), range(m), lambda j, prior: priors.append(prior))
        starts = range(0, len(rows), BLOCK_ROWS)
        map_tasks(_block_task, (model, priors, len(rows), entropy, s), starts,
                  lambda b, drawn, rows=rows: take(rows[starts[b]:starts[b] + BLOCK_ROWS], drawn))


#: 63-bit words of the run's generator that seed the streams of ``draw_blocks`` with ``map_tasks``.
STREAM_WORDS = 4


def stream(entropy: list[int], *key: int) -> np.random.Generator:
    """The generator of one task of ``draw_blocks``: PCG64 seeded by the run's ``entropy`` and the task's
    ``key`` (state, 0 and an implicate for its priors; state, 1 and a block's first row for its chain)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy, spawn_key=key)))


def _replicate_task(shared: tuple, j: int) -> Any:
    model, entropy, s = shared
    return _replicate_priors(model, 1, stream(entropy, s, 0, j))[0]


def _block_task(shared: tuple, start: int) -> list[np.ndarray]:
    model, priors, n, entropy, s = shared
    return _block_draws(model, priors, start, n, stream(entropy, s, 1, start))


def _replicate_priors(model: Any, m: int, rng: np.random.Generator) -> list:
    """``m`` draws of a state's priors, one per implicate."""
    from gedp.postprocess.structured import one_blas_thread

    with one_blas_thread:
        return [model.replicate(rng) for _ in range(m)]


def _block_draws(model: Any, priors: list, start: int, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The draws of the block of a state's establishments from its row ``start`` (of ``n``): one per prior."""
    from gedp.postprocess.implicates import BURN_IN
    from gedp.postprocess.structured import one_blas_thread

    local = np.arange(start, min(start + BLOCK_ROWS, n))
    drawn = []
    with one_blas_thread:  # small products: BLAS threads only wait for each other on a busy machine
        for prior, months in zip(priors, model.months_chain(local, rng, BURN_IN, len(priors), priors=priors)):
            drawn.append(np.column_stack([months, model.wages(local, months, rng, prior)]))
    return drawn


def write_implicates(release: str | Path, m: int, out: str | Path, *, seed: int | None = None,
                     quarter: str | None = None, progress: Callable[[int, int], None] | None = None,
                     note: Callable[[str], None] | None = None, level_prior: str = "month1",
                     change_prior: str = "independent", wage_prior: str = "sector",
                     map_tasks: TaskMap | None = None) -> Path:
    """Draw ``m`` implicates of a release into the folder ``out`` (one Parquet file per implicate,
    ``pandas.read_parquet(out)`` reads them all with an ``implicate`` column), atomically; ``level_prior``:
    ``postprocess.prior_components.LEVEL_PRIORS``; ``change_prior``: ``CHANGE_PRIORS``; ``wage_prior``:
    ``WAGE_PRIORS``; ``map_tasks``: the draws' tasks run by it, from streams of their own (``draw_blocks``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gedp.measure.rng import make_rng
    from gedp.release.format import check_outside
    from gedp.release.writer import staged_directory

    check_outside(release, out)  # the folder and the temporary one staged beside it
    m = check_count(m)
    rng, rng_description = make_rng(seed, "pcg64" if seed is not None else "secure")
    with staged_directory(out, IMPLICATES_SUMMARY) as staging:
        draws = prepare(release, rng, quarter, note, level_prior, change_prior, wage_prior)
        identity = release_digest(release).hex()  # gedp tabulate --implicates checks it (implicates_folder)
        total, done = len(draws.public), 0
        writers: list = [None] * m

        def write(positions: np.ndarray, drawn: list) -> None:
            nonlocal done
            for k, values in enumerate(drawn):
                table = pa.Table.from_pandas(implicate_frame(draws.public.iloc[positions], values, k + 1),
                                             preserve_index=False)
                if writers[k] is None:
                    writers[k] = pq.ParquetWriter(staging / implicate_file(k + 1, m), table.schema)
                writers[k].write_table(table)
            done += len(positions)
            if progress is not None:
                progress(done, total)

        try:
            draw_blocks(draws, m, rng, write, map_tasks)
        finally:
            for writer in writers:
                if writer is not None:
                    writer.close()
        summary = {"gedp_implicates": 1, "implicates": m, "release": Path(release).name, "quarter": quarter,
                   "release_sha256": identity, "establishments": total, "rng": rng_description,
                   **({"streams": "per task"} if map_tasks is not None else {}),  # --processes: other bits
                   "level_prior": level_prior,
                   **({"change_prior": change_prior} if change_prior != "independent" else {}),
                   **({"wage_prior": wage_prior} if wage_prior != "sector" else {}),
                   "files": [implicate_file(k + 1, m) for k in range(m)],
                   "priors": [model.summary() for _, model in draws.models]}
        (staging / IMPLICATES_SUMMARY).write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return Path(out)


def implicate_frame(public: pd.DataFrame, values: np.ndarray, k: int) -> pd.DataFrame:
    """One block of implicate ``k``: its number, the release's public columns, the drawn attributes (each
    at most MAX_VALUE, the largest value a release holds: a draw beyond it follows an answer no protect
    run of a valid input gives)."""
    from gedp.synth.schema import MAX_VALUE

    frame = public.reset_index(drop=True).copy()
    frame.insert(0, IMPLICATE_KEY, np.int32(k))
    for j, attribute in enumerate(CONFIDENTIAL):
        frame[attribute] = np.minimum(values[:, j], MAX_VALUE)
    return frame


def implicates_in_memory(release: str | Path, m: int, *, seed: int | None = None, quarter: str | None = None,
                         rng: np.random.Generator | None = None, level_prior: str = "month1",
                         change_prior: str = "independent", wage_prior: str = "sector",
                         map_tasks: TaskMap | None = None) -> pd.DataFrame:
    """``m`` implicates of a release as one frame (``implicate`` 1..m, then the release's columns);
    ``level_prior``: ``postprocess.prior_components.LEVEL_PRIORS``; ``change_prior``: ``CHANGE_PRIORS``;
    ``wage_prior``: ``WAGE_PRIORS``; ``map_tasks``: as ``write_implicates``'s."""
    from gedp.measure.rng import make_rng

    m = check_count(m)
    if rng is None:
        rng = make_rng(seed, "pcg64" if seed is not None else "secure")[0]
    draws = prepare(release, rng, quarter, level_prior=level_prior, change_prior=change_prior, wage_prior=wage_prior)
    values = np.empty((m, len(draws.public), len(CONFIDENTIAL)))

    def keep(positions: np.ndarray, drawn: list) -> None:
        for k, block in enumerate(drawn):
            values[k, positions] = block

    draw_blocks(draws, m, rng, keep, map_tasks)
    return pd.concat([implicate_frame(draws.public, values[k], k + 1) for k in range(m)], ignore_index=True)


#: Implicates a tabulation by a derived column draws (Rubin's margins with M - 1 = 19 degrees of freedom).
TABULATION_IMPLICATES = 20


def release_digest(release: str | Path) -> bytes:
    """The release's identity: SHA-256 of its manifest's and answers' files' SHA-256 digests (what its
    implicates are drawn from), recorded in ``_implicates.json`` (``release_sha256``)."""
    import hashlib

    from gedp.release.format import MANIFEST_FILE
    from gedp.release.reader import release_parts

    release = Path(release)
    digest = hashlib.sha256()
    for part in [release / MANIFEST_FILE, *map(Path, release_parts(release, MEASUREMENTS_FILE))]:
        with part.open("rb") as file:
            digest.update(hashlib.file_digest(file, "sha256").digest())
    return digest.digest()


def tabulation_seed(release: Path) -> int:
    """A seed fixed by the release's manifest and answers (``release_digest``): the same request of the
    same release gives the same table (the draws are postprocessing of public values: their seed need
    not be secret)."""
    return int.from_bytes(release_digest(release)[:8], "little")


def tabulation_implicates(release: Path, quarter: str | None = None) -> pd.DataFrame:
    """The implicates a tabulation by a derived column of the release (of one ``quarter`` of a panel) is
    combined over: always the same, drawn with ``tabulation_seed``."""
    return implicates_in_memory(release, TABULATION_IMPLICATES, seed=tabulation_seed(release), quarter=quarter)


def tabulate_derived(release: str | Path, by, *, where: str | None = None, moe: bool = False, level: float = 0.95,
                     format: str = "table", quarter: str | None = None, implicates: pd.DataFrame | None = None,
                     drawn: DrawnImplicates | None = None) -> pd.DataFrame:
    """A release tabulated by public columns and derived ones (``size_class``), combined over
    TABULATION_IMPLICATES implicates (``postprocess.derived``); ``format`` "qcew" gives BLS's
    size-class layout (keys among state, sector and size_class). ``implicates``: those implicates
    (``tabulation_implicates``) drawn already, held by a server; ``drawn``: a folder of implicates
    ``gedp implicates`` drew of the release, combined over instead (``implicates_folder``)."""
    from gedp.postprocess.derived import SIZE_CLASS, size_class_publication, tabulate_implicates
    from gedp.postprocess.keys import by_columns
    release = Path(release)
    keys = by_columns(by)
    if format not in ("table", "qcew"):
        raise InputError(f"format {format!r}: a tabulation by {SIZE_CLASS} is a table or the qcew size-class layout")
    if format == "qcew":
        extra = [key for key in keys if key not in ("state", "sector", SIZE_CLASS)]
        if extra or SIZE_CLASS not in keys:
            raise InputError(f"the qcew size-class layout groups by state, sector and {SIZE_CLASS}; "
                             f"got {', '.join(keys)}")
        keys = list(dict.fromkeys(["state", *keys]))
    frame = (drawn.public if drawn is not None else
             tabulation_implicates(release, quarter) if implicates is None else implicates)
    try:
        table = (_tabulated_drawn(drawn, keys, where, moe or format == "qcew", level) if drawn is not None else
                 tabulate_implicates(frame, keys, where=where, moe=moe or format == "qcew", level=level))
    except ValueError as err:
        raise InputError(str(err)) from None
    if format == "qcew":
        year, qtr = (int(frame[c].iloc[0]) if c in frame else 0 for c in ("year", "qtr"))
        table = size_class_publication(table, year, qtr)
        if not moe:
            table = table[[c for c in table.columns if not c.endswith("_moe")]]
    return table


def _tabulated_drawn(drawn: DrawnImplicates, keys: list, where: str | None, moe: bool, level: float) -> pd.DataFrame:
    """``tabulate_implicates`` of a folder's implicates, read one at a time (memory: one implicate and the sums)."""
    from gedp.postprocess.derived import combined_table, implicate_sums
    from gedp.release.implicates_folder import implicate_frames

    sums, grouped = [], keys
    for frame in implicate_frames(drawn):
        grouped, summed = implicate_sums(frame, keys, where=where)
        sums.append(summed)
    return combined_table(pd.concat(sums), grouped, range(1, drawn.count + 1), where=where, moe=moe, level=level)
