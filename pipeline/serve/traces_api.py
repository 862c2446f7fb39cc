"""The web UI's trace endpoints (beside ``app.py``'s): the list page, one trace's view, a conversation.

- ``GET /api/trace_list?sort=&order=asc|desc&status=&agent=&service_version=&scenario=&conversation=
  &label=key=value[,..]&since=&limit=&offset=``: ``{"total", "offset", "limit", "traces", "choices"}``;
  each row is a ``trace_summary`` row with ``agent`` (name) and ``status``.
- ``GET /api/traces/{trace_id}/view``: the document of ``GET /api/traces/{trace_id}`` with the
  ``propagation_path`` (every step from the root cause to the final failure, ``paths.py``),
  ``agent`` and ``cross_turn_cause`` (the ``root_causes`` row per conversation, when this turn ends
  its conversation's failure; its ``root_trace_id`` names the turn the cause is in) and
  ``root_cause_check`` (the latest ``tracedag confirm`` check of the root cause, ``serve.checks``).
- ``GET /api/conversations/{conversation_id}``: its turns in order, each turn's outcome and root
  cause, and the cross-turn root cause of every failed turn (``root_causes`` per conversation).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pyarrow.compute as pc
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tracedag.pipeline.serve import encode, tracelist
from tracedag.pipeline.serve.checks import root_cause_check
from tracedag.pipeline.serve.data import NotFound, Store
from tracedag.pipeline.serve.paths import propagation_path
from tracedag.schemas.errors import QueryFailed, TracedagError

logger = logging.getLogger(__name__)
Handler = Callable[[Request], Awaitable[Response]]


def trace_view(store: Store, trace_id: str) -> dict[str, Any]:
    """One trace's document with its propagation path, agent name and root cause across turns (one build state)."""
    state = store.state()
    doc = with_path(store.trace(trace_id, state), tracelist.agents(store, state).get(trace_id, ""))
    doc["cross_turn_cause"] = cross_turn_causes(store, state).get(trace_id)
    doc["root_cause_check"] = root_cause_check(store, trace_id, doc.get("root_cause"), doc["cross_turn_cause"], state)
    return doc


def cross_turn_causes(store: Store, state: str | None = None) -> dict[str, dict[str, Any]]:
    """trace id -> the root cause of its conversation's failure (``root_causes`` per conversation), once per
    build state (turning the whole table into rows took 0.2 s of each trace view on 1M spans)."""
    def compute() -> dict[str, dict[str, Any]]:
        rows = store.named("root_causes", {"per": "conversation"}, None).to_pylist()
        return {r["trace_id"]: r for r in rows}
    causes: dict[str, dict[str, Any]] = store.cache.get(state or store.state(), "cross_turn_causes", compute)
    return causes


def with_path(doc: dict[str, Any], agent: str) -> dict[str, Any]:
    """A copy of a trace document (``Store.documents``) with ``propagation_path`` and ``agent``."""
    path = propagation_path(doc.get("root_cause"), doc.get("failures") or [], doc.get("edges") or [])
    return {**doc, "propagation_path": path, "agent": agent}


def conversation(store: Store, conversation_id: str) -> dict[str, Any]:
    """The turns of a conversation in start order, each with its outcome and (cross-turn) root cause."""
    table = tracelist.listed(store, None)
    table = table.filter(pc.fill_null(pc.equal(table["conversation_id"], conversation_id), False))
    turns = sorted(table.to_pylist(),
                   key=lambda r: (r["start_time_unix_nano"] or 0, r["trace_id"]))
    if not turns:
        raise NotFound(f"conversation {conversation_id}: no built trace carries it")
    causes = cross_turn_causes(store)
    out = []
    for i, t in enumerate(turns, start=1):
        cause = causes.get(t["trace_id"])
        out.append({"turn": i, "trace": t, "cross_turn_cause": cause})
    return {"conversation_id": conversation_id, "turns": out}


def _guard(handler: Handler) -> Handler:
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except NotFound as e:
            return JSONResponse({"error": str(e)}, status_code=404)
        except TracedagError as e:
            reason = e.reason if isinstance(e, QueryFailed) else str(e)
            return JSONResponse({"error": reason}, status_code=400)
    return wrapped


def routes(store: Store) -> list[Route]:
    """The routes of these endpoints over ``store`` (``app.create_app`` registers them)."""

    async def trace_list(request: Request) -> Response:
        q = tracelist.query_from(dict(request.query_params))
        total, rows = await run_in_threadpool(tracelist.page, store, q)
        offered = await run_in_threadpool(tracelist.choices, store)
        return Response(encode.dumps({"total": total, "offset": q.offset, "limit": q.limit,
                                      "traces": rows.to_pylist(), "choices": offered}), media_type="application/json")

    async def view(request: Request) -> Response:
        doc = await run_in_threadpool(trace_view, store, request.path_params["trace_id"])
        return Response(encode.dumps(doc), media_type="application/json")

    async def turns(request: Request) -> Response:
        doc = await run_in_threadpool(conversation, store, request.path_params["conversation_id"])
        return Response(encode.dumps(doc), media_type="application/json")

    return [Route("/api/trace_list", _guard(trace_list)),
            Route("/api/traces/{trace_id}/view", _guard(view)),
            Route("/api/conversations/{conversation_id}", _guard(turns))]


def _param(name: str, where: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": where, "required": where == "path", "description": description,
            "schema": {"type": "string"}}


def openapi_paths() -> dict[str, Any]:
    """The OpenAPI description of these endpoints (``openapi.openapi`` adds it)."""
    err = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    filters = [_param(k, "query", d) for k, d in (
        ("sort", "one of " + ", ".join(tracelist.SORTS)), ("order", "asc or desc (default desc)"),
        ("status", "passed, failed or error"), ("agent", "agent name"), ("service_version", "service version"),
        ("scenario", "scenario id"), ("conversation", "conversation id"),
        ("label", "run labels key=value[,key=value]"), ("since", "15m, 1h, 2d or an ISO time"),
        ("limit", f"page size (default 100, at most {tracelist.MAX_PAGE})"), ("offset", "rows to skip"))]
    return {
        "/api/trace_list": {"get": {
            "operationId": "trace_list", "summary": "One page of the trace list with the agent name and status",
            "parameters": filters, "responses": {"200": {"description": "{total, offset, limit, traces, choices}"},
                                                 "400": err}}},
        "/api/traces/{trace_id}/view": {"get": {
            "operationId": "trace_view",
            "summary": "One trace with its propagation path (root cause to final failure) and cross-turn cause",
            "parameters": [_param("trace_id", "path", "trace id")],
            "responses": {"200": {"description": "the trace"}, "404": err}}},
        "/api/conversations/{conversation_id}": {"get": {
            "operationId": "conversation", "summary": "A conversation's turns in order, outcome and cause of each",
            "parameters": [_param("conversation_id", "path", "conversation id")],
            "responses": {"200": {"description": "{conversation_id, turns}"}, "404": err}}},
    }
