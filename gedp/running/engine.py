"""Protect a multi-state input state by state, locally or as tasks on a dask.distributed cluster.

Every group-by query of the plan includes ``state``, so each establishment is measured only by its
own state's mechanisms and the states compose in parallel: the release spends the plan's mu once.
Each state's noise comes from its own secure generator, or, in a release not for publication,
from a generator derived from the seed and the state code, so the ``local`` and ``dask`` engines
give the same release. zeta is split among the states so the whole release keeps 1 - zeta. Only one
state's working set is in memory at a time per worker: a state is read from the input (Parquet: with
a filter, so only its rows are loaded), protected, written as one part of each output, and dropped.
The local engine's workers are processes (``gedp.running.state_pool``); with one process it protects the
states in its own process. Either way each part of a state is written on a thread of the state's own
as soon as it exists, while the state is computed further or the next one is protected.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, TypeAlias

import numpy as np
import pandas as pd

from gedp.config import Config
from gedp.measure.rng import make_rng, secure_generator, state_rng
from gedp.options import Engine, TlsFiles
from gedp.postprocess.wls import SolverError
from gedp.release.format import MANIFEST_FILE
from gedp.release.manifest import release_manifest, state_section
from gedp.release.writer import StateParts, join_tables, staged_directory, table_part, write_manifest
from gedp.running.state_pipeline import check_job_table, protect
from gedp.synth.io import (
    Parts,
    PinnedCsv,
    every_part,
    input_stamps,
    parts_holding,
    read_columns,
    read_csv_pinned,
)
from gedp.synth.paths import check_input_path
from gedp.synth.schema import InputError, canonical_ids, check_columns, estab_ids, normalize_code, validate_microdata
from gedp.waits import STOP_POLL, awaited, submitted

ENGINES = ("local", "dask")
#: Where the built-in dask cluster listens: the loopback interface only, never the network.
LOOPBACK = "127.0.0.1"


class Scheduler(NamedTuple):
    """An existing dask scheduler to run on: its address and the TLS credentials
    (``distributed.security.Security``) that reach it; ``insecure`` when neither is required."""

    address: str
    security: Any = None
    insecure: bool = False


def scheduler_access(address: str | None, security: Any = None, insecure: bool = False) -> Scheduler | None:
    """An existing scheduler's access, checked before anything is read: the workers read the
    confidential input and the task results carry it, so the scheduler must be a ``tls://`` address
    reached with credentials (a ``Security`` object, e.g. ``tls_credentials``) unless ``insecure``,
    which prints a warning on stderr. None without an address."""
    if address is None:
        if security is not None or insecure:
            raise InputError("TLS credentials and --insecure-scheduler go with --scheduler (the built-in "
                             "cluster makes its own keys)")
        return None
    if insecure:
        print(f"warning: --insecure-scheduler: the confidential input and its protected results travel to and "
              f"from scheduler '{address}' and its workers without the checks of TLS; any process that reaches "
              f"it can read them", file=sys.stderr)
        return Scheduler(address, security, insecure)
    if not address.startswith("tls://"):
        raise InputError(f"scheduler '{address}' must be a tls:// address (the workers read confidential data); "
                         "give --insecure-scheduler to use it anyway")
    if security is None:
        raise InputError(f"scheduler '{address}' needs TLS credentials: --tls-ca-file and --tls-cert (and "
                         "--tls-key), or a distributed.security.Security")
    return Scheduler(address, security, insecure)


def engine_access(engine: Engine) -> Scheduler | None:
    """The checked access of ``engine``'s existing scheduler (``scheduler_access``; its TLS files read
    now), None for the built-in cluster or the local engine."""
    security = tls_credentials(*engine.security) if isinstance(engine.security, TlsFiles) else engine.security
    return scheduler_access(engine.scheduler, security, engine.insecure_scheduler)


def tls_credentials(ca_file: Path | None, cert: Path | None, key: Path | None) -> Any:
    """A ``Security`` that requires TLS, from a CA certificate and the client's certificate and key
    (the key may sit in the certificate's file); None when no file is given."""
    if ca_file is None and cert is None and key is None:
        return None
    if ca_file is None or cert is None:
        raise InputError("TLS credentials need both --tls-ca-file and --tls-cert (and --tls-key unless the "
                         "certificate's file holds the key)")
    for option, path in (("--tls-ca-file", ca_file), ("--tls-cert", cert), ("--tls-key", key)):
        if path is not None and not Path(path).is_file():
            raise InputError(f"{option} '{path}' is not a file")
    from distributed.security import Security

    return Security(tls_ca_file=str(ca_file), tls_client_cert=str(cert),
                    tls_client_key=None if key is None else str(key), require_encryption=True)


class InputStates(NamedTuple):
    """What is read of an input before any noise: each state code with the stored values that
    normalize to it (e.g. " 44" and "44"), the number of rows, for a Parquet input each part's
    ``synth.footers.stamp`` taken before it was read, and for a CSV input the input pinned to the
    bytes read (``synth.io.PinnedCsv``)."""

    codes: dict[str, list]
    rows: int
    stamps: dict[str, tuple[int, ...]] | None = None
    pinned: PinnedCsv | None = None


#: An input: a CSV or Parquet file, a folder of Parquet parts, or microdata already in memory.
Source: TypeAlias = str | Path | pd.DataFrame


def read_source(source: Source | Parts | PinnedCsv, columns: list[str] | None = None,
                where: tuple[str, list] | None = None) -> pd.DataFrame:
    """``columns`` of an input as stored (all when None), only the rows whose ``where[0]`` holds one
    of ``where[1]``: files (or some ``Parts`` of a Parquet input) through ``synth.io.read_columns``,
    DataFrames in memory."""
    if not isinstance(source, pd.DataFrame):
        return read_columns(source, columns, where)
    check_columns([str(c) for c in source.columns], attributes=())
    frame = source if columns is None else source[columns]
    if where is not None:
        frame = frame[frame[where[0]].isin(where[1])]
    return frame.reset_index(drop=True)


def source_name(source: Source) -> str:
    """How messages name an input: its path, or "the microdata" for a DataFrame."""
    return "the microdata" if isinstance(source, pd.DataFrame) else f"'{source}'"


def input_states(source: Source) -> InputStates:
    """The state codes of an input, reading only its ``state`` and ``estab_id`` columns; estab_id is
    checked here to be unique across the whole input (every state and every Parquet part)."""
    stamps = None if isinstance(source, pd.DataFrame) else input_stamps(check_input_path(source))
    pinned = None
    if isinstance(source, pd.DataFrame) or stamps is not None:
        frame = read_source(source, ["state", "estab_id"])
    else:  # CSV: every later read is of the bytes read here
        frame, pinned = read_csv_pinned(source, ["state", "estab_id"])
    if len(frame) == 0:
        raise InputError(f"input {source_name(source)} has zero establishments (no data rows)")
    estab_ids(frame)
    distinct = pd.DataFrame({"state": pd.unique(frame["state"])})  # normalized once per stored value
    try:
        normalized = normalize_code(distinct, "state", 2)
    except InputError:
        normalize_code(frame, "state", 2)  # names the first offending row of the input
        raise
    codes: dict[str, list] = {}
    for code, stored in zip(normalized, distinct["state"].tolist()):
        codes.setdefault(code, []).append(stored)
    return InputStates(dict(sorted(codes.items())), len(frame), stamps, pinned)


def pinned_input(source: Source, inputs: InputStates) -> Source | Parts | PinnedCsv:
    """The input as read by ``input_states``: its later reads (the ledger's, the job table's, each
    state's) are of the same data, or refused (``synth.io.read_columns``): a CSV file's bytes of the
    same digest, a Parquet input's parts with the same stamps; a DataFrame is itself."""
    if inputs.pinned is not None:
        return inputs.pinned
    if inputs.stamps is not None:
        return every_part(Path(source), inputs.stamps)
    return source


def input_establishments(source: Source | Parts | PinnedCsv) -> pd.Series:
    """The estab_id column of an input as text (the establishments a lifetime ledger charges)."""
    return canonical_ids(read_source(source, ["estab_id"])["estab_id"])


def read_state(source: Source | Parts | PinnedCsv, state: str, attributes, stored: list) -> pd.DataFrame:
    """Validated microdata of one state: the rows whose stored code is one of ``stored`` (the values
    that normalize to ``state``; Parquet inputs are filtered while reading). The estab_id of a
    DataFrame's rows, of unchanged ``Parts`` or of a ``PinnedCsv`` (``synth.io.read_columns`` refuses
    changed ones) were checked unique over the whole input by ``input_states``: not again here."""
    checked = isinstance(source, (pd.DataFrame, Parts, PinnedCsv))
    return validate_microdata(read_source(source, where=("state", stored)), attributes, unique_ids_checked=checked)


def check_request(config: Config, states: list[str], *, seed: int | None, rng: str | None, engine: str,
                  jobs: bool = False, scheduler: Scheduler | None = None, processes: int | None = None) -> dict:
    """Refuse a bad engine, seed and generator, a scheduler without the dask engine, a number of
    processes below 1, a plan that spans states, or a job table (``jobs``: whether one is given) that
    does not go with the config (``gedp.running.state_pipeline.check_job_table``), before anything is read or
    reserved; returns how the manifest describes the generator."""
    from gedp.running.state_pool import pool_size

    pool_size(processes, len(states))
    check_job_table(config, jobs)
    if engine not in ENGINES:
        raise InputError(f"engine '{engine}' is unknown; choose one of {', '.join(ENGINES)}")
    if scheduler is not None and engine != "dask":
        raise InputError(f"scheduler '{scheduler.address}' goes with --engine dask, not '{engine}'")
    _, rng_description = make_rng(seed, rng)  # checks --seed and --rng together
    if len(states) > 1:
        check_state_by_state(config)
    return rng_description


def check_state_by_state(config: Config) -> None:
    """Refuse plans with a query that spans states (parallel composition needs state in every query)."""
    for query in config.plan.queries:
        if query.by != ("estab_id",) and "state" not in query.by:
            raise InputError(
                f"query {query.name} spans states; add 'state' to its columns to protect a multi-state input"
            )


def split_jobs(jobs: Source, source: Source, inputs: InputStates) -> dict[str, pd.DataFrame]:
    """The job table (a file, a Parquet folder or a DataFrame) split by its establishments' states;
    a job whose estab_id is not an establishment of the input is refused (its first row named)."""
    from gedp.synth.jobs import JOB_COLUMNS
    from gedp.synth.schema import _refuse

    if isinstance(jobs, pd.DataFrame):
        check_columns([str(c) for c in jobs.columns], attributes=(), required=JOB_COLUMNS[:-1])
        table = jobs.reset_index(drop=True)
    else:
        table = read_columns(jobs, required=JOB_COLUMNS[:-1])
    establishments = read_source(pinned_input(source, inputs), ["state", "estab_id"])
    code_of = {value: code for code, stored in inputs.codes.items() for value in stored}
    state = establishments["state"].map(code_of).to_numpy(dtype=object)
    positions, uniques = pd.factorize(canonical_ids(table["estab_id"]))
    found = pd.Index(canonical_ids(establishments["estab_id"])).get_indexer(pd.Index(uniques))
    row = np.where(positions >= 0, found[positions] if len(found) else -1, -1)
    _refuse("estab_id", row < 0, table, "values of the job table must be an estab_id of the input")
    job_state = state[row]
    return {code: table[job_state == code].reset_index(drop=True) for code in inputs.codes}


def protect_one_state(path: Source, state: str, stored: list, config: Config, entropy: int | None, staging: str,
                      states: int = 1, jobs: pd.DataFrame | None = None, key: Mapping[str, str] | None = None,
                      tables: bool = True) -> dict:
    """Protect one state and write its parts into the staging release; returns its manifest entry.

    ``stored`` are the input's values of the state code; ``entropy=None`` draws the state's noise
    from its own secure generator (ChaCha20, OS key). ``states`` is the number of states of the
    release, among which zeta is split. ``jobs``: the state's job table, for a plan with job families.
    ``key``: columns of one value each added to the protected microdata and measurements
    (``writer.StateParts``; a panel's quarter). ``tables=False``: no QCEW tables
    (``gedp.running.state_pipeline.protect``).
    """
    entry, write = _protect_state(path, state, stored, config, entropy, staging, states, jobs, key, tables)
    write()
    return entry


def _protect_state(path: Source, state: str, stored: list, config: Config, entropy: int | None, staging: str,
                   states: int, jobs: pd.DataFrame | None = None,
                   key: Mapping[str, str] | None = None, tables: bool = True) -> tuple[dict, Callable[[], None]]:
    """``protect_one_state`` but for the end of the writing: its manifest entry, and the call that
    writes the rest of its parts and waits for them (the measurements and the protected microdata
    are written while the state is computed, ``writer.StateParts``)."""
    microdata = read_state(path, state, config.attributes, stored)
    rng = secure_generator() if entropy is None else state_rng(entropy, state)
    plan = dataclasses.replace(config.plan, states=states)
    folder = Path(staging)
    parts = StateParts(folder, state, table_part(folder, state), key)
    try:
        contents = protect(microdata, dataclasses.replace(config, plan=plan), rng=rng, jobs=jobs,
                           on_measured=parts.measurements, on_protected=parts.protected, tables=tables)
    except BaseException:
        parts.close()
        raise
    del microdata, jobs
    entry = state_section(state, contents, plan.zeta_per_state)
    return entry, functools.partial(parts.finish, contents)


def _protect_locally(arguments: dict[str, tuple], on_state: Callable[[str], None] | None,
                     processes: int | None = None, rows: int | None = None) -> list[dict]:
    """Protect the states in a pool of worker processes (``gedp.running.state_pool``; ``processes``: None for
    one per usable CPU and per ``state_pool.ROWS_PER_WORKER`` of the input's ``rows``) or, with one
    state or one process, one after the other in this process, each state's parts written (Arrow and
    Parquet encode outside the GIL) while the next state is protected; at most one state waits to be
    written."""
    from gedp.running.state_pool import pool_size, protect_in_pool, release_started

    workers = pool_size(processes, len(arguments), rows)
    if workers > 1:
        return protect_in_pool(_protect_or_refuse, arguments, on_state, workers)
    release_started()
    pieces: list[dict] = []
    with ThreadPoolExecutor(max_workers=1) as writer:
        writing = None
        for state, task in arguments.items():
            entry, write = _protect_state(*task)
            if writing is not None:
                _written(writing, on_state)
            writing = (submitted(writer, write), entry["state"])
            pieces.append(entry)
        if writing is not None:
            _written(writing, on_state)
    return pieces


def _written(writing: tuple[Future, str], on_state: Callable[[str], None] | None) -> None:
    """Wait for one state's parts to be written (raising what the writing raised), then report the state."""
    future, state = writing
    awaited(future)
    if on_state is not None:
        on_state(state)


#: The manifest's name in a folder written without the QCEW tables (``protect_input``'s tables=False).
TABLELESS_MANIFEST_FILE = "tableless-manifest.json"


def protect_input(
    path: Source,
    config: Config,
    out: str | Path,
    *,
    seed: int | None,
    rng: str | None = None,
    engine: str = "local",
    scheduler: Scheduler | None = None,
    on_state: Callable[[str], None] | None = None,
    lifetime: dict | None = None,
    before_publish: Callable[[], None] | None = None,
    inputs: InputStates | None = None,
    extra_files: Callable[[Path], dict[str, dict]] | None = None,
    jobs: Source | None = None,
    key: Mapping[str, str] | None = None,
    processes: int | None = None,
    manifest_name: str = MANIFEST_FILE,
    tables: bool = True,
) -> dict:
    """Protect every state of ``path`` (a file, a Parquet folder or a DataFrame) into the release
    directory ``out``; returns the manifest. ``extra_files(staging)`` gives more JSON files to write,
    computed from the staged release (``gedp run``'s accuracy against a synthetic truth).

    ``lifetime`` is the manifest's lifetime-budget section; ``before_publish`` runs when the release
    is complete in its staging directory but for its manifest (the ledger's commit): the manifest is
    written only after it, so a run killed before leaves a staging folder no reader takes for a
    release; if it raises, nothing is published.
    ``inputs`` is ``input_states(path)`` when the caller has read it already. ``jobs`` is the job
    table (``synth.jobs``) of a plan with job families. ``key``: see ``protect_one_state``.
    ``processes``: the local engine's worker processes (None: one per usable CPU, at most one per
    state and per 100,000 input rows; 1: the states one after the other in this process); the
    release is the same whatever it is. ``manifest_name``: the manifest's file name (a panel's
    quarters are written with another, so that none of them is ever a release). ``tables=False``:
    a folder without the QCEW tables (nor their entry in the manifest's files), for a caller that
    reads only the other files (the pipeline audit); its manifest is ``TABLELESS_MANIFEST_FILE``, so
    that it is never taken for a release.
    """
    inputs = inputs or input_states(path)
    states = list(inputs.codes)
    rng_description = check_request(config, states, seed=seed, rng=rng, engine=engine, jobs=jobs is not None,
                                    scheduler=scheduler, processes=processes)
    job_tables = split_jobs(jobs, path, inputs) if jobs is not None else {}
    if rng_description["kind"] == "secure":
        entropy = None
    else:
        entropy = seed if seed is not None else int(np.random.SeedSequence().entropy)
    parts = {} if inputs.stamps is None else parts_holding(Path(path), "state", inputs.codes, inputs.stamps)
    with staged_directory(out) as staging:
        arguments = {state: (parts.get(state) or _state_source(path, stored, inputs), state, stored, config, entropy,
                             str(staging), len(states), job_tables.get(state), key, tables)
                     for state, stored in inputs.codes.items()}
        if engine == "local":
            pieces = _protect_locally(arguments, on_state, processes, inputs.rows)
        else:
            pieces = _run_on_dask(arguments, scheduler, on_state)
        protected = sum(piece["establishments"] for piece in pieces)
        if protected != inputs.rows:
            raise InputError(f"{protected} establishments were read state by state, but the input has {inputs.rows} "
                             "rows; was it changed while gedp read it?")
        manifest = release_manifest(config, pieces, rng_description, engine,
                                    None if scheduler is None else scheduler.address)
        if tables:
            join_tables(staging, states)
        else:  # never a release: no tables, and a manifest no reader takes for a release's
            del manifest["files"]["qcew_tables"]
            manifest_name = TABLELESS_MANIFEST_FILE
        if lifetime is not None:
            manifest["lifetime"] = lifetime
        write_manifest(staging, manifest, extra_files(staging) if extra_files else {}, before_publish,
                       manifest_name)
    return manifest


def _state_source(source: Source, stored: list, inputs: InputStates) -> Source | Parts | PinnedCsv:
    """What a state's task reads: the input as ``input_states`` read it (``pinned_input``), or only
    that state's rows of an in-memory input (so a dask task ships one state, not the whole frame)."""
    if isinstance(source, pd.DataFrame):
        return read_source(source, where=("state", stored))
    return pinned_input(source, inputs)


def _protect_or_refuse(*arguments) -> dict | Exception:
    """``protect_one_state`` on a worker, returning an input or solver error instead of raising it,
    so that no worker logs a traceback (nor the message) and the client reports it in one line."""
    try:
        return protect_one_state(*arguments)
    except (InputError, SolverError) as err:
        return err


def _run_on_dask(arguments: dict[str, tuple], scheduler: Scheduler | None, on_state) -> list[dict]:
    from dask.distributed import Client

    scratch = None if scheduler else tempfile.TemporaryDirectory(prefix="gedp-dask-")  # mode 0700: this user's
    cluster = None if scratch is None else local_cluster(Path(scratch.name))
    address, security = (scheduler.address, scheduler.security) if scheduler else (cluster, cluster.security)
    try:
        with Client(address, security=security) as client:
            # tables in memory (a state's job table, an in-memory input's rows) go to the workers as
            # data, not inside the task graph, which the scheduler holds and warns about when large
            futures = [client.submit(_protect_or_refuse, *[client.scatter(a) if isinstance(a, pd.DataFrame) else a
                                                           for a in task], key=f"gedp-state-{state}", pure=False)
                       for state, task in arguments.items()]
            for future in each_done(futures):
                if on_state is not None:
                    on_state(future.key.removeprefix("gedp-state-"))
            pieces = client.gather(futures)
    finally:
        if cluster is not None:
            cluster.close()
        if scratch is not None:
            scratch.cleanup()
    refused = next((piece for piece in pieces if isinstance(piece, Exception)), None)
    if refused is not None:
        raise refused
    return pieces


def each_done(futures: list) -> Iterator:
    """Each of the dask ``futures`` once it is done (those found done by one look in the order given),
    looked at every ``STOP_POLL`` seconds. ``Future.done`` takes no lock, where ``as_completed`` takes
    its own locks over and over while it waits: a Ctrl-C raised just after it took one leaves it taken,
    and the client's event loop, which takes it as each future ends, blocks for ever, and so does the
    client's close."""
    left = list(futures)
    while left:
        done = [future.done() for future in left]
        yield from (future for future, finished in zip(left, done) if finished)
        left = [future for future, finished in zip(left, done) if not finished]
        if left:
            time.sleep(STOP_POLL)


def local_cluster(scratch: Path) -> Any:
    """The built-in cluster of 2 worker processes, locked down: it listens on the loopback interface
    only, with TLS and keys made for this run (``Security.temporary()``: a throwaway CA and
    certificate, held in memory, that every connection must present), and serves no dashboard nor
    any other HTTP page (scheduler and worker HTTP routes are emptied; their servers answer 404).
    Another local process cannot connect to it, so cannot read the confidential input it holds.
    Its workers keep their files (data spilled to disk holds input rows) in ``scratch``, a folder
    only this user can enter (dask's default, ``dask-scratch-space`` in the temporary folder, is
    created readable by every user)."""
    import dask
    from distributed import LocalCluster
    from distributed.security import Security

    routes = {"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": []}
    with dask.config.set(routes), warnings.catch_warnings():
        # the empty HTTP server moves off dask's default port when another cluster holds it: not news
        warnings.filterwarnings("ignore", message="Port .* is already in use", category=UserWarning)
        return LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host=LOOPBACK, protocol="tls://",
                            security=Security.temporary(), dashboard_address=None, silence_logs=logging.CRITICAL,
                            local_directory=str(scratch), preload=[WORKER_IGNORES_CTRL_C])


#: A worker's preload (the text of a script, run in the worker process's main thread as it starts): Ctrl-C,
#: which the terminal sends to the whole process group, is ignored, as the local engine's workers ignore
#: it (``gedp.running.process.worker_signals``): the command stops the cluster and prints the one line. A
#: worker that raised KeyboardInterrupt printed its traceback after that line (red team rt25 F4).
WORKER_IGNORES_CTRL_C = "import signal as _gedp_signal; _gedp_signal.signal(_gedp_signal.SIGINT, _gedp_signal.SIG_IGN)"
