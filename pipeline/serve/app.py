"""The Starlette application of ``tracedag serve``: read-only API, ``/metrics``, the web UI.

Routes (``openapi()`` describes them):

- ``GET /api/queries`` and ``GET /api/queries/{name}?<param>=..&since=..&format=json|csv|arrow|parquet``
- ``GET /api/traces?since=&status=passed|failed|error&agent=&conversation=&limit=&offset=``
- ``GET /api/traces/{trace_id}``: summary, spans, nodes (with score), edges, scores, failures,
  root cause and its propagation chain
- ``GET /api/regressions`` (saved ``tracedag regress`` reports) and ``GET /api/regressions/{name}``
- ``POST /api/sql`` (body: the SQL, or JSON ``{"sql": ..., "truncate": false}``; ``?format=``,
  ``?truncate=1``): one SELECT checked and run in a killable worker (``sqlproc``), its answer
  bounded in rows and bytes; 400 refused (or too slow to check), 408 timed out, 413 body, SQL or
  answer too large, 422 out of memory, 500 the worker crashed, 503 busy
- ``GET /metrics`` (Prometheus text), ``GET /healthz``, ``GET /openapi.json``, ``GET /`` (web UI)

Blocking work (DuckDB, the worker) runs in the thread pool, so one slow request never stops the
others. With a token, every API request needs ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tracedag import queries
from tracedag.pipeline.serve import encode, traces_api
from tracedag.pipeline.serve.answer import TooLarge
from tracedag.pipeline.serve.assets import vendor_script
from tracedag.pipeline.serve.data import NotFound, Store
from tracedag.pipeline.serve.hostcheck import HostCheck, HostPolicy
from tracedag.pipeline.serve.metrics import Metrics
from tracedag.pipeline.serve.openapi import openapi
from tracedag.pipeline.serve.sqlproc import (
    Busy,
    SqlCrashed,
    SqlLimits,
    SqlResources,
    SqlRunner,
    SqlTimeout,
    TextTooLarge,
)
from tracedag.pipeline.store.remote import remote_of
from tracedag.schemas.errors import QueryFailed, TracedagError
from tracedag.schemas.layout import reports_dir

logger = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
WARM_INTERVAL = 5.0
_RESERVED = {"format", "since"}
MAX_BODY_BYTES = 4 << 20
_STATUS: list[tuple[type[BaseException], int]] = [
    (NotFound, 404), (TextTooLarge, 413), (TooLarge, 413), (SqlTimeout, 408),
    (SqlResources, 422), (Busy, 503), (SqlCrashed, 500), (TracedagError, 400),
]


class BodyTooLarge(TextTooLarge):  # type: ignore[misc,unused-ignore]
    """The request body is larger than ``MAX_BODY_BYTES`` (the connection is closed after the answer)."""


def _error(e: BaseException) -> JSONResponse:
    status = next(code for kind, code in _STATUS if isinstance(e, kind))
    reason = e.reason if isinstance(e, QueryFailed) else str(e)
    headers = {"Connection": "close"} if isinstance(e, BodyTooLarge) else None  # the unread rest is not read
    return JSONResponse({"error": reason}, status_code=status, headers=headers)


def _format(request: Request) -> str:
    fmt = request.query_params.get("format", "json")
    if fmt not in encode.FORMATS:
        raise QueryFailed("format", f"{fmt!r} is not one of {', '.join(encode.FORMATS)}")
    return fmt


def _table_response(table: pa.Table, fmt: str, headers: dict[str, str] | None = None) -> Response:
    return StreamingResponse(encode.stream(table, fmt), media_type=encode.FORMATS[fmt], headers=headers)


class Api:
    """The handlers, bound to one store."""

    def __init__(self, data: Path, limits: SqlLimits | None = None) -> None:
        self.store = Store(data)
        self.sql = SqlRunner(data, limits)
        self.metrics = Metrics(self.store)

    async def list_queries(self, request: Request) -> Response:
        out = []
        for name in queries.names():
            doc = queries.describe(name)
            out.append({"name": name, "description": doc.description,
                        "params": [{"name": p.name, "type": p.type, "default": p.default, "help": p.help,
                                    "choices": list(p.choices)} for p in doc.params],
                        "since": "since_ns" in doc.used})
        return JSONResponse(out)

    async def run_query(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in queries.names():
            raise NotFound(f"no such query {name!r} (GET /api/queries lists them)")
        fmt = _format(request)
        params = {k: v for k, v in request.query_params.items() if k not in _RESERVED}
        since = request.query_params.get("since")
        table = await run_in_threadpool(self.store.named, name, params, since)
        return _table_response(table, fmt)

    async def traces(self, request: Request) -> Response:
        q = request.query_params
        try:
            limit, offset = int(q.get("limit", "200")), int(q.get("offset", "0"))
        except ValueError as e:
            raise QueryFailed("traces", "limit and offset are integers") from e
        total, page = await run_in_threadpool(self.store.traces, q.get("since"), q.get("status"), q.get("agent"),
                                              q.get("conversation"), max(0, min(limit, 10_000)), max(0, offset))
        fmt = _format(request)
        if fmt != "json":
            return _table_response(page, fmt, {"X-Total-Count": str(total)})
        body = encode.dumps({"total": total, "traces": page.to_pylist()})
        return Response(body, media_type="application/json")

    async def trace(self, request: Request) -> Response:
        body = await run_in_threadpool(self.store.trace_json, request.path_params["trace_id"])
        return Response(body, media_type="application/json")

    async def regressions(self, request: Request) -> Response:
        rows = await run_in_threadpool(_list_reports, self.store.data)
        return JSONResponse(rows)

    async def regression(self, request: Request) -> Response:
        doc = await run_in_threadpool(_read_report, self.store.data, request.path_params["name"])
        return Response(encode.dumps(doc), media_type="application/json")

    async def run_sql(self, request: Request) -> Response:
        raw = await _read_body(request)
        sql, truncate = _sql_request(raw, request.headers.get("content-type", ""), request.query_params)
        fmt = _format(request)
        # checked by the guard in the worker, under its own deadline: a parse never runs on the event loop
        answer = await run_in_threadpool(self.sql.run, sql, fmt, truncate)
        return Response(answer.body, media_type=encode.FORMATS[fmt],
                        headers={"X-Truncated": str(answer.truncated).lower()})

    async def metrics_text(self, request: Request) -> Response:
        text = await run_in_threadpool(self.metrics.text)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def index(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def openapi_json(self, request: Request) -> Response:
        return JSONResponse(openapi())

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"ok": True})


def _list_reports(data: Path) -> list[dict[str, Any]]:
    """The saved regression reports (``regress.saved``, imported here: the regress package imports the gate and
    polars, ~0.2 s CPU a server paid at each start though only the Regressions tab asks for reports; the warm-up
    imports it once the store has reports, ``_load_reports_reader``)."""
    if not _has_reports(data):  # what list_reports answers then, without the import
        return []
    from tracedag.pipeline.regress import saved

    rows: list[dict[str, Any]] = saved.list_reports(data)
    return rows


def _read_report(data: Path, name: str) -> dict[str, Any]:
    """One saved regression report; an unknown name is ``NotFound`` (404)."""
    from tracedag.pipeline.regress import saved

    try:
        doc: dict[str, Any] = saved.read_report(data, name)
    except saved.NoSuchReport as e:
        raise NotFound(str(e)) from e
    return doc


async def _read_body(request: Request) -> bytes:
    """The body, refused (413) on its Content-Length before any of it is read, or as soon as a
    chunked body passes ``MAX_BODY_BYTES``: the rest is never read (the connection is then closed)."""
    length = request.headers.get("content-length", "0")
    if not length.isdigit():
        raise QueryFailed("sql", "Content-Length is not a number")
    if int(length) > MAX_BODY_BYTES:
        raise BodyTooLarge("sql", f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise BodyTooLarge("sql", f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB")
    except ClientDisconnect as e:
        raise QueryFailed("sql", "the client closed the connection before the body ended") from e
    return bytes(body)


def _sql_request(raw: bytes, content_type: str, params: Mapping[str, str]) -> tuple[str, bool]:
    """The SQL text and whether a truncated answer is asked for (``?truncate=1`` or ``"truncate": true``)."""
    text = raw.decode("utf-8", errors="strict") if raw else ""
    truncate = params.get("truncate", "").lower() in ("1", "true", "yes")
    if "json" in content_type:
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise QueryFailed("sql", "the body is not JSON") from e
        if not isinstance(doc, dict) or not isinstance(doc.get("sql"), str):
            raise QueryFailed("sql", 'the JSON body needs {"sql": "..."}')
        text = doc["sql"]
        truncate = truncate or doc.get("truncate") is True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # a JSON escape of half a surrogate pair
        raise QueryFailed("sql", f"the SQL holds a lone surrogate ({text[e.start]!a}): not Unicode text") from e
    if not text.strip():
        raise QueryFailed("sql", "no SQL in the request body")
    return text, truncate


def _guard(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except (TracedagError, UnicodeDecodeError) as e:
            if isinstance(e, UnicodeDecodeError):
                return JSONResponse({"error": "the body is not UTF-8"}, status_code=400)
            return _error(e)
    return wrapped


class TokenMiddleware(BaseHTTPMiddleware):
    """``Authorization: Bearer <token>`` on every path but /healthz and the UI's page and scripts (no data).

    The UI takes the token from its address (``/#token=...``) and sends it with each API call."""

    def __init__(self, app: Any, token: str) -> None:
        super().__init__(app)
        self.expected = f"Bearer {token}".encode()

    async def dispatch(self, request: Request, call_next: Any) -> Response:
        path = request.url.path
        if path not in ("/healthz", "/") and not path.startswith("/static/"):
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, self.expected):
                return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
        response: Response = await call_next(request)
        return response


class Warmer:
    """A thread that computes the trace list, the root causes and /metrics whenever the build state changes.

    So the first request after a build finds them ready. It waits at least ``WARM_INTERVAL`` and
    twice its last pass between passes, so it takes at most a third of one core on a busy store.
    """

    def __init__(self, api: Api) -> None:
        self.api = api
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tracedag-serve-warm", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = None
        reports = False
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                state = self.api.store.state()
                if state != last:
                    self.api.store.warm()
                    self.api.metrics.text()
                    last = state
                reports = reports or _load_reports_reader(self.api.store.data)
            except Exception:  # a store mid-compaction or not built yet: the next pass tries again
                logger.info("warm-up pass failed", exc_info=True)
            self._stop.wait(max(WARM_INTERVAL, 2 * (time.monotonic() - t0)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _has_reports(data: Path) -> bool:
    """Whether the store may hold saved regression reports: a ``reports/regress-*.json`` file, or an object store
    (whose reports come from the writers)."""
    folder = reports_dir(data)
    return remote_of(data) is not None or (folder.is_dir() and any(folder.glob("regress-*.json")))


def _load_reports_reader(data: Path) -> bool:
    """Import the saved reports' reader (``regress.saved``, ~0.2 s CPU) once the store has saved reports, so the
    first /api/regressions does not pay it; a store without reports never does. True once imported."""
    if not _has_reports(data):
        return False
    from tracedag.pipeline.regress import saved  # noqa: F401

    return True


def create_app(data: Path, token: str | None = None, limits: SqlLimits | None = None,
               warm: bool = True, hosts: HostPolicy | None = None) -> Starlette:
    """The application over the store at ``data``; ``token`` required on every request when given.

    ``hosts``: without a token, the Host names it answers as and no cross-site writes (``hostcheck``).

    ``warm``: compute the whole-store results in the background whenever the store changes (``Warmer``).
    """
    api = Api(data, limits)
    routes = [
        Route("/", _guard(api.index)),
        Route("/healthz", _guard(api.healthz)),
        Route("/openapi.json", _guard(api.openapi_json)),
        Route("/metrics", _guard(api.metrics_text)),
        Route("/api/queries", _guard(api.list_queries)),
        Route("/api/queries/{name}", _guard(api.run_query)),
        Route("/api/traces", _guard(api.traces)),
        *traces_api.routes(api.store),
        Route("/api/traces/{trace_id}", _guard(api.trace)),
        Route("/api/regressions", _guard(api.regressions)),
        Route("/api/regressions/{name}", _guard(api.regression)),
        Route("/api/sql", _guard(api.run_sql), methods=["POST"]),
        Route("/static/vendor/{name}", vendor_script),  # stored gzipped (assets.py)
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = [Middleware(TokenMiddleware, token=token)] if token else []
    if hosts is not None and not token:
        middleware.append(Middleware(HostCheck, policy=hosts))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        api.sql.warm()
        warmer = Warmer(api) if warm else None
        try:
            yield
        finally:
            if warmer is not None:
                warmer.stop()
            api.sql.close()

    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
