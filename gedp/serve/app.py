"""The web application of ``gedp serve``: a page for data users and a JSON API over releases held in
memory (``gedp.serve.releases``), on Starlette (ASGI), run by uvicorn.

Why Starlette and uvicorn: both are small, maintained and widely used (Starlette is what FastAPI is
built on), pure Python with three small dependencies between them (anyio, h11, click) and no
compiled extension, and importing both takes 0.1 to 0.3 s; a request is answered in a worker
thread, so the event loop keeps accepting while numpy works. FastAPI would add pydantic (a compiled
dependency) for an OpenAPI document that ``openapi()`` here writes from the same table of
parameters the requests are parsed with.

Safe to expose: every response carries a content security policy that allows only this server's
own script and style (no inline script, nothing fetched from elsewhere, no framing) and the usual
hardening headers; a request names a release by id, never a file; keys and filters go through
gedp's condition language (never run as code) on public columns only; a query string, a result's
rows and a request's time are bounded; errors are one line of JSON, and anything unexpected is a
bare 500 without details. The page builds every element with ``textContent`` (nothing a release or
a request holds is ever parsed as HTML).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from importlib import resources
from itertools import repeat
from typing import Any

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gedp.errors import GedpError, InputError
from gedp.serve.releases import ID_CHARACTERS, ServedRelease, Stopping
from gedp.tabulation.request import Tabulation, TabulationRequest

#: Bounds of a request (``gedp serve`` options set the rows and seconds).
MAX_QUERY_BYTES = 4096
MAX_TEXT = 600
DEFAULT_MAX_ROWS = 100_000
DEFAULT_TIMEOUT = 30.0
#: Requests computed at once (each in a worker thread that holds one of ``Workers``' slots until its
#: computation ends, even past its request's time).
WORKERS = 4
#: Of those, the most computing tables ready to publish (agglvl: written from the release's files, each
#: seconds, the workbook of a state of 36,000 establishments 8-10 s): four such requests, each with another
#: junk level so that none is an answer kept, held every slot and every other request was answered 503
#: (red team rt28 J3); the other slots stay free for the requests answered from memory.
PUBLISHED_WORKERS = 2
#: Bytes of answers kept for requests asked again.
CACHE_BYTES = 64 << 20
#: Parameters of /api/tabulate: type, and what it means (the OpenAPI document is written from it).
PARAMETERS: dict[str, tuple[str, str]] = {
    "release": ("string", "The release's id (GET /api/releases)."),
    "by": ("string", "Public columns, comma-separated, e.g. county,naics3 ('total' or none: the total)."),
    "where": ("string", "Keep establishments matching this filter of public columns, e.g. sector == '31-33'."),
    "quarter": ("string", "A panel release: the quarter, e.g. 2016Q2."),
    "change": ("string", "A panel release: the change FIRST:SECOND of every cell, e.g. 2016Q1:2016Q4."),
    "moe": ("boolean", "1: add margins of error <attribute>_moe (no further privacy cost)."),
    "level": ("number", "Confidence level of the margins of error (default 0.95)."),
    "agglvl": ("integer", "A QCEW aggregation level (50-58, 70-78) instead of by: the table ready to publish."),
    "format": ("string", "json (default), csv (the CSV gedp tabulate writes), qcew (with agglvl) or xlsx (with "
                         "agglvl: the workbook)."),
}
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                 b"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=()"),
    (b"cache-control", b"no-store"),
]
STATIC = {"index.html": "text/html; charset=utf-8", "explorer.js": "text/javascript; charset=utf-8",
          "explorer.css": "text/css; charset=utf-8"}
DOWNLOADS = {"csv": "text/csv; charset=utf-8", "qcew": "text/csv; charset=utf-8",
             "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"}


@dataclass(frozen=True)
class Limits:
    """A request's bounds: rows of a result, and seconds of computing."""

    max_rows: int = DEFAULT_MAX_ROWS
    timeout: float = DEFAULT_TIMEOUT


class SecurityHeaders:
    """ASGI middleware: the security headers on every response, and a query string bounded."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if len(scope.get("query_string", b"")) > MAX_QUERY_BYTES:
            response = JSONResponse({"error": f"the query is longer than {MAX_QUERY_BYTES} bytes"}, status_code=414)
            await response(scope, receive, self._with_headers(send))
            return
        await self.app(scope, receive, self._with_headers(send))

    @staticmethod
    def _with_headers(send: Any) -> Any:
        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in SECURITY_HEADERS}
                message["headers"] = [*(h for h in message.get("headers", []) if h[0] not in names), *SECURITY_HEADERS]
            await send(message)

        return sending


class AnswerCache:
    """The bodies of the latest answers by query (the releases never change, so neither do their
    answers): at most ``CACHE_BYTES`` in all, the least recently used dropped first."""

    def __init__(self) -> None:
        self.kept: OrderedDict[tuple, tuple[bytes, str | None, dict]] = OrderedDict()
        self.size = 0
        self.lock = threading.Lock()

    def get(self, key: tuple) -> tuple[bytes, str | None, dict] | None:
        with self.lock:
            if key in self.kept:
                self.kept.move_to_end(key)
            return self.kept.get(key)

    def put(self, key: tuple, answer: tuple[bytes, str | None, dict]) -> None:
        if len(answer[0]) > CACHE_BYTES // 8:
            return
        with self.lock:
            if key in self.kept:
                return
            self.kept[key] = answer
            self.size += len(answer[0])
            while self.size > CACHE_BYTES:
                _, dropped = self.kept.popitem(last=False)
                self.size -= len(dropped[0])


class Busy(Exception):
    """No worker slot came free within a request's time."""


class Workers:
    """At most ``count`` computations at once, counted by the threads that compute: a thread holds its
    slot until its computation truly ends. (anyio's limiter of ``to_thread.run_sync`` gives its token
    back when a request past its time is abandoned while its thread keeps computing: 40 slow requests
    at --timeout 0.2 had 13 threads computing at once with 4 tokens.)"""

    def __init__(self, count: int = WORKERS, published: int = PUBLISHED_WORKERS) -> None:
        self.slots = threading.BoundedSemaphore(count)
        self.published = threading.BoundedSemaphore(published)
        #: What each kind of slot being held means, as a busy answer says it.
        self.held = {id(self.slots): f"{count} requests computing",
                     id(self.published): f"{published} tables ready to publish computing"}

    def run(self, deadline: float, published: bool, work: Any, *args: Any) -> Any:
        """``work(*args)`` in this thread once a slot is free (``published``: a table ready to publish, once
        one of the fewer slots of those is free too); Busy, saying which slots were held, when none is by
        ``deadline`` (``time.monotonic``)."""
        held = [self.published, self.slots] if published else [self.slots]
        taken = []
        try:
            for slots in held:
                if not slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    raise Busy(self.held[id(slots)])
                taken.append(slots)
            return work(*args)
        finally:
            for slots in reversed(taken):
                slots.release()


def retry_later(message: str, timeout: float) -> JSONResponse:
    """503 with Retry-After: the request's time (at least 1 s), when slots may have come free."""
    return JSONResponse({"error": message}, status_code=503, headers={"retry-after": str(max(1, math.ceil(timeout)))})


def create_app(releases: dict[str, ServedRelease], limits: Limits = Limits(), cache: bool = True) -> SecurityHeaders:
    """The application serving ``releases`` (by id) within ``limits``; ``cache``: answers kept for a
    request asked again (``AnswerCache``; False: every answer computed, so an answer's time never tells
    whether anyone asked the same before)."""
    static = {name: resources.files("gedp.serve").joinpath("static", name).read_bytes() for name in STATIC}
    workers = Workers(WORKERS, PUBLISHED_WORKERS)

    async def page(request: Request) -> Response:
        name = request.path_params.get("name", "index.html")
        if name not in static:
            return JSONResponse({"error": "not found"}, status_code=404)
        return Response(static[name], media_type=STATIC[name])

    async def release_list(request: Request) -> Response:
        return JSONResponse([describe(release) for release in releases.values()])

    async def manifest(request: Request) -> Response:
        release = releases.get(request.path_params["id"])
        if release is None:
            return JSONResponse({"error": "no such release"}, status_code=404)
        return JSONResponse(release.manifest)

    answered = AnswerCache()

    async def tabulate(request: Request) -> Response:
        key = tuple(sorted(request.query_params.multi_items()))
        kept = answered.get(key) if cache else None
        if kept is not None:
            return Response(kept[0], media_type=kept[1], headers=kept[2])
        response = await computed(request)
        if cache and response.status_code == 200:
            answered.put(key, (bytes(response.body), response.media_type, dict(response.headers)))
        return response

    async def computed(request: Request) -> Response:
        try:
            release, wanted, output = parse(request.query_params.multi_items(), releases)
            deadline = time.monotonic() + limits.timeout
            with anyio.fail_after(limits.timeout):  # a thread waiting for a slot gives up at the same deadline
                answer = await anyio.to_thread.run_sync(workers.run, deadline, wanted.agglvl is not None,
                                                        answered_in_full, release, wanted, limits.max_rows, output,
                                                        abandon_on_cancel=True)
        except Busy as busy:
            return retry_later(f"the server is busy ({busy}); retry later", limits.timeout)
        except TimeoutError:
            return retry_later(f"the request took longer than {limits.timeout:g} s", limits.timeout)
        except Stopping as stop:
            return retry_later(str(stop), limits.timeout)
        except GedpError as err:
            return JSONResponse({"error": without_paths(str(err), releases)}, status_code=400)
        if isinstance(answer, Tabulation):
            return JSONResponse({"error": f"the table has {answer.n_rows:,} rows, more than {limits.max_rows:,}: "
                                          "narrow it with a filter or fewer keys"}, status_code=400)
        return answer

    async def openapi_document(request: Request) -> Response:
        return JSONResponse(openapi())

    routes = [Route("/", page), Route("/static/{name}", page), Route("/api/releases", release_list),
              Route("/api/release/{id}/manifest", manifest), Route("/api/tabulate", tabulate),
              Route("/api/openapi.json", openapi_document)]
    return SecurityHeaders(Starlette(routes=routes))


def without_paths(message: str, releases: dict[str, ServedRelease]) -> str:
    """``message`` naming each release by its id, never by the server's folder (a path, quoted or not,
    to the folder or a file in it, is the release's id); any other absolute path left quoted is
    replaced by "a file of the server"."""
    for release in sorted(releases.values(), key=lambda r: len(str(r.folder)), reverse=True):
        folder = str(release.folder)
        message = re.sub(rf"'{re.escape(folder)}(/[^']*)?'|{re.escape(folder)}(/\S*)?", f"release {release.id}",
                         message)
    return re.sub(r"'/[^']*'", "a file of the server", message)


def parse(items: list[tuple[str, str]], releases: dict[str, ServedRelease]
          ) -> tuple[ServedRelease, TabulationRequest, str]:
    """The release, the tabulation request and the output format of a query string; InputError for
    an unknown, repeated, too long or malformed parameter, or an unknown release."""
    given: dict[str, str] = {}
    for name, value in items:
        if name not in PARAMETERS:
            raise InputError(f"unknown parameter {name[:40]!r}; the parameters are {', '.join(PARAMETERS)}")
        if name in given:
            raise InputError(f"parameter {name} given twice")
        if len(value) > MAX_TEXT:
            raise InputError(f"parameter {name} is longer than {MAX_TEXT} characters")
        given[name] = value
    release = releases.get(given.get("release", ""))
    if release is None:
        raise InputError("give release=ID, one of " + ", ".join(releases))
    output = given.get("format", "json")
    if output not in ("json", *DOWNLOADS):
        raise InputError(f"format {output[:20]!r}: choose json, csv, qcew or xlsx")
    if output in ("qcew", "xlsx") and "agglvl" not in given:
        raise InputError(f"format {output} needs agglvl (a QCEW aggregation level)")
    wanted = TabulationRequest(release.folder, by=given.get("by") or None, where=given.get("where") or None,
                               quarter=given.get("quarter") or None, change=given.get("change") or None,
                               moe=_flag(given.get("moe", "0")), level=_number(given, "level", float, 0.95),
                               agglvl=_number(given, "agglvl", int, None),
                               format={"json": "csv", "csv": "csv"}.get(output, output), flags=False)
    return release, wanted, output


def _flag(text: str) -> bool:
    if text.lower() not in ("0", "1", "true", "false"):
        raise InputError(f"moe {text[:20]!r}: give 1 or 0")
    return text.lower() in ("1", "true")


def _number(given: dict[str, str], name: str, kind: type, default: Any) -> Any:
    if name not in given:
        return default
    try:
        value = kind(given[name])
    except ValueError:
        raise InputError(f"{name} {given[name][:20]!r} is not a{'n integer' if kind is int else ' number'}") from None
    if kind is float and not math.isfinite(value):
        raise InputError(f"{name} must be a finite number")
    return value


def answered_in_full(release: ServedRelease, wanted: TabulationRequest, max_rows: int, output: str
                     ) -> Response | Tabulation:
    """The response to a request (its table computed and written, off the server's event loop, so that
    a large table's writing does not hold the answers of others), or the table when it has more than
    ``max_rows`` rows."""
    answer = release.answer(wanted)
    if answer.n_rows > max_rows:
        return answer
    if output != "json":
        return download(answer, release, output)
    return Response(orjson.dumps(answer_json(answer, release)), media_type="application/json")


def download(answer: Tabulation, release: ServedRelease, output: str) -> Response:
    """The file ``gedp tabulate --out`` writes of the same request, as an attachment."""
    if answer.written is not None:
        content = answer.written
    else:
        import io

        text = io.StringIO(newline="")
        answer.write_csv(text)
        content = text.getvalue().encode("utf-8")
    request = answer.request
    parts = [release.id, request.quarter, request.change, request.by, f"agglvl{request.agglvl}" if request.agglvl
             else None]
    name = ID_CHARACTERS.sub("_", "-".join(part for part in parts if part))[:120]
    suffix = "xlsx" if output == "xlsx" else "csv"
    return Response(content, media_type=DOWNLOADS[output],
                    headers={"content-disposition": f'attachment; filename="{name}.{suffix}"'})


def answer_json(answer: Tabulation, release: ServedRelease) -> dict[str, Any]:
    """A tabulation as JSON: ``rows`` (one object per row, keyed by the CSV's column names; a missing
    value is null), the key columns, each value's quality flag, warnings."""
    from gedp.postprocess.quality import quality_flags

    series = {str(name): values for name, values in answer.frame().items()}
    columns = {name: _plain(values) for name, values in series.items()}
    names = list(columns)
    request = answer.request
    flags = {}
    if request.moe:
        for name in names:
            if f"{name}_moe" in columns and not name.endswith("_chg"):
                flags[name] = quality_flags(series[name].to_numpy(dtype=float, na_value=math.nan),
                                            series[f"{name}_moe"].to_numpy(dtype=float, na_value=math.nan),
                                            request.level).tolist()
    return {"release": release.id, "quarter": request.quarter, "change": request.change,
            "level": request.moe_level, "columns": names, "rows": list(map(dict, map(zip, repeat(names),
                                                                              zip(*columns.values())))),
            "flags": flags, "titles": key_titles(columns), "warnings": answer.warnings}


def key_titles(columns: dict[str, list]) -> dict[str, list[str]]:
    """The titles of a table's area, ownership and industry keys (``columns``: each column's values),
    row by row, as BLS writes them (``synth.titles``: the lists shipped with gedp)."""
    from gedp.postprocess.keys import SIZE_CLASS
    from gedp.postprocess.sizeclass import SIZE_TITLES
    from gedp.synth.hierarchy import INDUSTRY_OF_STATE_LEVEL
    from gedp.synth.titles import OWN_TITLES, shipped_titles

    titles = shipped_titles()
    found = {}
    if "state" in columns:
        counties = columns.get("county") or ["000"] * len(columns["state"])
        areas = [f"{state}{county}" for state, county in zip(columns["state"], counties)]
        found["county" if "county" in columns else "state"] = _titled(areas, titles.areas, "{}")
    if "own" in columns:
        found["own"] = _titled(columns["own"], OWN_TITLES, "{}")
    for column in (c for c in INDUSTRY_OF_STATE_LEVEL.values() if c is not None and c in columns):
        found[column] = _titled(columns[column], titles.industries, "NAICS {}")
    if SIZE_CLASS in columns:
        found[SIZE_CLASS] = _titled(columns[SIZE_CLASS], {str(code): title for code, title in SIZE_TITLES.items()},
                                    "size class {}")
    return found


def _titled(codes: list, titles: Any, untitled: str) -> list[str]:
    """The title of each code (as text) in ``titles``, else ``untitled`` formatted with the code
    (``synth.titles.Titles``' rule), each distinct code looked up once."""
    found = {code: str(titles.get(str(code), untitled.format(code))) for code in set(codes)}
    return [found[code] for code in codes]


def _plain(series: Any) -> list:
    """A column's values as JSON values: numbers as Python numbers (the text CSV writes), missing
    and non-finite values as None."""
    import pandas as pd

    kind = getattr(series.dtype, "kind", "O")
    if kind in "iub":
        return series.to_numpy().tolist()
    if kind == "f":
        import numpy as np

        values = series.to_numpy()
        listed = values.tolist()
        if not np.isfinite(values).all():
            listed = [v if math.isfinite(v) else None for v in listed]
        return listed
    if isinstance(series.dtype, pd.StringDtype):
        return series.to_numpy(dtype=object, na_value=None).tolist()
    return [None if value is None or (isinstance(value, float) and not math.isfinite(value))
            else (value.item() if hasattr(value, "item") else value)
            for value in series.to_numpy(dtype=object, na_value=None)]


def describe(release: ServedRelease) -> dict[str, Any]:
    """What the page and /api/releases say of a release: id, quarters, states, establishments, its
    public columns, its ownership codes and their titles, its guarantee in plain words and the
    meanings of the quality flags."""
    from gedp.postprocess.quality import FLAG_MEANINGS
    from gedp.synth.titles import OWN_TITLES

    manifest = release.manifest
    return {"id": release.id, "quarters": release.quarters, "states": manifest["states"],
            "establishments": manifest["establishments"], "publishable": manifest.get("publishable") is True,
            "columns": release.public_columns,
            "owns": [[code, OWN_TITLES.get(code, f"ownership {code}")] for code in release.own_codes()],
            "size_classes": release.size_classes,
            "mu_total": manifest["mu_total"], "guarantee": guarantee(manifest), "flags": FLAG_MEANINGS}


def guarantee(manifest: dict[str, Any]) -> str:
    """The release's privacy guarantee and the budget it spent, in plain words."""
    from gedp.measure.conversions import stated_guarantee

    words = (f"Every number here is computed from a release protected with Gaussian differential privacy: the "
             f"whole release spent a privacy budget of {stated_guarantee(float(manifest['mu_total']))} when it was "
             f"made. Tables you make here are computed from the release alone, so they spend nothing more, however "
             f"many you make. Each value has a margin of error: the range that holds the value without noise at "
             f"the stated confidence.")
    if manifest.get("publishable") is not True:
        words += " This release is NOT FOR PUBLICATION: its noise came from a seed."
    return words


def openapi() -> dict[str, Any]:
    """The API's OpenAPI 3.1 document, from ``PARAMETERS``."""
    def parameter(name: str, kind: str, text: str, where: str = "query", required: bool = False) -> dict:
        return {"name": name, "in": where, "required": required, "description": text, "schema": {"type": kind}}

    error = {"description": "A refused request: {\"error\": message}."}
    return {
        "openapi": "3.1.0",
        "info": {"title": "gedp serve", "version": "1",
                 "description": "Tabulations of gedp releases with margins of error."},
        "paths": {
            "/api/releases": {"get": {"summary": "The releases served", "responses": {"200": {
                "description": "A list of objects, each with an id, quarters, states, establishments, columns "
                               "and the guarantee in words."}}}},
            "/api/release/{id}/manifest": {"get": {"summary": "A release's manifest", "parameters": [
                parameter("id", "string", "The release's id.", "path", True)],
                "responses": {"200": {"description": "The manifest.json of the release."}, "404": error}}},
            "/api/tabulate": {"get": {"summary": "A tabulation, as gedp tabulate gives it", "parameters": [
                parameter(name, kind, text, required=name == "release") for name, (kind, text) in PARAMETERS.items()],
                "responses": {"200": {"description": "JSON {rows: [{column: value}], columns, flags, warnings}, "
                                                     "or the file of format csv, qcew or xlsx."},
                              "400": error, "414": error, "503": error}}},
        },
    }
