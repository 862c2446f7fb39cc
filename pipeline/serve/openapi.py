"""The OpenAPI 3.1 description of ``tracedag serve`` (``GET /openapi.json``), named queries included.

Each named query is its own path with its declared parameters (type, default, choices), so a
client generator sees them as typed operations.
"""

from __future__ import annotations

from typing import Any

from tracedag import queries
from tracedag.pipeline.serve import traces_api

_TYPES = {"double": "number", "bigint": "integer", "integer": "integer", "boolean": "boolean"}
_FORMAT = {"name": "format", "in": "query", "schema": {"type": "string", "enum": ["json", "csv", "arrow", "parquet"],
                                                       "default": "json"}}
_ERR = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_TABLE = {"description": "rows", "content": {
    "application/json": {"schema": {"type": "array", "items": {"type": "object"}}},
    "text/csv": {}, "application/vnd.apache.arrow.stream": {}, "application/vnd.apache.parquet": {}}}


def _query_path(name: str) -> dict[str, Any]:
    doc = queries.describe(name)
    params: list[dict[str, Any]] = [_FORMAT]
    for p in doc.params:
        schema: dict[str, Any] = {"type": _TYPES.get(p.type, "string"), "default": p.default}
        if p.choices:
            schema["enum"] = list(p.choices)
        params.append({"name": p.name, "in": "query", "description": p.help, "schema": schema})
    if "since_ns" in doc.used:
        params.append({"name": "since", "in": "query", "description": "15m, 1h, 2d, 1w or an ISO time",
                       "schema": {"type": "string"}})
    return {"get": {"operationId": f"query_{name}", "summary": doc.description, "tags": ["queries"],
                    "parameters": params, "responses": {"200": _TABLE, "400": _ERR}}}


def _q(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "description": description, "schema": {"type": "string"}}


def openapi() -> dict[str, Any]:
    """The description as a JSON-ready dict."""
    paths: dict[str, Any] = {
        "/api/queries": {"get": {"operationId": "list_queries", "summary": "Every named query and its parameters",
                                 "responses": {"200": {"description": "queries"}}}},
        "/api/traces": {"get": {
            "operationId": "list_traces", "summary": "Built traces, newest first (trace_summary rows)",
            "parameters": [_q("since", "15m, 1h, 2d or an ISO time"), _q("status", "passed, failed or error"),
                           _q("agent", "service name"), _q("conversation", "conversation id"),
                           _q("limit", "page size (default 200)"), _q("offset", "rows to skip"), _FORMAT],
            "responses": {"200": {"description": "{total, traces}"}, "400": _ERR}}},
        "/api/traces/{trace_id}": {"get": {
            "operationId": "get_trace", "summary": "One trace: spans, nodes, edges, scores, failures, root cause",
            "parameters": [{"name": "trace_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": {"description": "the trace"}, "404": _ERR}}},
        "/api/sql": {"post": {
            "operationId": "run_sql",
            "summary": "One SELECT over the views, in a sandboxed worker with a timeout, a memory cap and a row cap",
            "parameters": [_FORMAT],
            "requestBody": {"required": True, "content": {
                "text/plain": {"schema": {"type": "string"}},
                "application/json": {"schema": {"type": "object", "required": ["sql"],
                                                "properties": {"sql": {"type": "string"}}}}}},
            "responses": {"200": {"description": "{columns, rows, truncated}"}, "400": _ERR, "408": _ERR,
                          "413": _ERR, "422": _ERR, "503": _ERR}}},
        "/api/regressions": {"get": {
            "operationId": "list_regressions",
            "summary": "Saved tracedag regress reports, newest first: name, time, sides, verdict, fail/warn counts",
            "responses": {"200": {"description": "list of reports"}}}},
        "/api/regressions/{name}": {"get": {
            "operationId": "get_regression", "summary": "One saved tracedag regress report (its JSON result)",
            "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": {"description": "the report"}, "400": _ERR, "404": _ERR}}},
        "/metrics": {"get": {"operationId": "metrics", "summary": "Prometheus text of the analysis aggregates",
                             "responses": {"200": {"description": "text/plain; version=0.0.4"}}}},
    }
    paths.update(traces_api.openapi_paths())
    for name in queries.names():
        paths[f"/api/queries/{name}"] = _query_path(name)
    return {
        "openapi": "3.1.0",
        "info": {"title": "tracedag serve", "version": "1",
                 "description": "Read-only API over a tracedag store: named queries, traces, sandboxed SQL."},
        "paths": paths,
        "components": {
            "schemas": {"Error": {"type": "object", "properties": {"error": {"type": "string"}}}},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
