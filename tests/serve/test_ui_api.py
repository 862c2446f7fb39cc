"""The web UI's endpoints on a real ``tracedag serve``: the trace list page, one trace's view with its
propagation path, a conversation; and the propagation path on hand-made failure graphs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.serve.serve_support import Server
from tracedag.pipeline.serve.paths import propagation_path
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.views import connect


@pytest.fixture(scope="module")
def server(plain_server: Server) -> Server:
    """The worker's plain server of ``serve_store`` (tests/serve/serve_support.py): this module only reads."""
    return plain_server


def _agents(data: Path) -> dict[str, str]:
    con = connect(data)
    try:
        return dict(con.sql("select trace_id, arg_min(agent_name, start_time_unix_nano) from spans "
                            "where agent_name is not null group by trace_id").fetchall())
    finally:
        con.close()


def test_the_list_sorts_filters_and_pages_with_a_total(server: Server, serve_store: Path) -> None:
    rows = run_named(serve_store, "trace_summary", {}).to_pylist()
    agents = _agents(serve_store)
    with server.client() as c:
        first = c.get("/api/trace_list", params={"sort": "duration_ms", "order": "asc", "limit": 50}).json()
        second = c.get("/api/trace_list", params={"sort": "duration_ms", "order": "asc", "limit": 50,
                                                  "offset": 50}).json()
        assert first["total"] == second["total"] == len(rows)
        got = [t["trace_id"] for t in first["traces"] + second["traces"]]
        assert got == [r["trace_id"] for r in sorted(rows, key=lambda r: (r["duration_ms"], r["trace_id"]))][:100]
        assert all(t["agent"] == agents[t["trace_id"]] for t in first["traces"])
        assert {t["status"] for t in first["traces"]} <= {"passed", "failed", "unscored"}
        assert first["choices"]["agent"] == sorted(set(agents.values()))
        failing = agents[next(r["trace_id"] for r in rows if r["passed"] is False)]
        found = c.get("/api/trace_list", params={"agent": failing, "status": "failed"}).json()
        expected = [r for r in rows if agents[r["trace_id"]] == failing and r["passed"] is False]
        assert found["total"] == len(expected) > 0
        assert {t["trace_id"] for t in found["traces"]} == {r["trace_id"] for r in expected}
        labelled = c.get("/api/trace_list", params={"label": "agent_name=research"}).json()
        assert labelled["total"] == sum(1 for r in rows if agents[r["trace_id"]] == "research")


@pytest.mark.parametrize(("params", "says"), [
    ({"sort": "bogus"}, "sort 'bogus' is not one of"),
    ({"order": "sideways"}, "order is asc or desc"),
    ({"status": "maybe"}, "status is passed, failed or error"),
    ({"limit": "ten"}, "limit and offset are integers"),
    ({"label": "sql:1=1"}, "label takes key=value"),
    ({"label": "no-equals-sign"}, "expected key=value"),
])
def test_a_bad_list_request_gets_400_saying_why(server: Server, params: dict[str, str], says: str) -> None:
    r = server.client().get("/api/trace_list", params=params)
    assert r.status_code == 400 and says in r.json()["error"]


def test_the_view_of_a_trace_carries_its_propagation_path(server: Server, serve_store: Path) -> None:
    roots = run_named(serve_store, "root_causes", {}).to_pylist()
    with server.client() as c:
        for root in roots:
            view = c.get(f"/api/traces/{root['trace_id']}/view").json()
            path = view["propagation_path"]
            assert path[0] == root["root_span_id"] and path[-1] == root["failed_span_id"]
            edges = {(e["source"], e["target"]) for e in view["edges"]}
            assert all(hop in edges for hop in zip(path, path[1:], strict=False))
            # every failure on the failure-DAG route is on the path, not only its two ends
            assert len(path) >= root["hops_from_root"] + 1
        assert c.get("/api/traces/nope/view").status_code == 404
        assert c.get("/api/conversations/nope").status_code == 404


def _edges(*pairs: str) -> list[dict[str, str]]:
    return [{"source": p[0], "target": p[1]} for p in pairs]


def test_the_path_follows_the_failures_and_expands_each_hop_over_dag_edges() -> None:
    # a (tool, fails) -> b (llm, passes) -> c (tool, fails); all three nested in P (the agent, fails)
    edges = _edges("ab", "bc", "aP", "bP", "cP")
    failures = [{"span_id": "a", "nearest_failing_upstream": []},
                {"span_id": "c", "nearest_failing_upstream": ["a"]},
                {"span_id": "P", "nearest_failing_upstream": ["a", "c"]}]
    cause = {"root_span_id": "a", "failed_span_id": "P"}
    # the longest failure route a -> c -> P, the hop a -> c through b: four steps, not [a, P]
    assert propagation_path(cause, failures, edges) == ["a", "b", "c", "P"]
    assert propagation_path({"root_span_id": "a", "failed_span_id": "a"}, failures, edges) == ["a"]
    assert propagation_path(None, failures, edges) == []


def test_a_cycle_or_a_missing_route_still_ends_at_the_final_failure() -> None:
    failures = [{"span_id": "x", "nearest_failing_upstream": ["y"]}, {"span_id": "y", "nearest_failing_upstream": ["x"]},
                {"span_id": "z", "nearest_failing_upstream": ["y"]}]
    assert propagation_path({"root_span_id": "a", "failed_span_id": "z"}, failures, _edges("az")) == ["a", "z"]
    assert propagation_path({"root_span_id": "a", "failed_span_id": "z"}, failures, []) == ["a", "z"]


def test_openapi_describes_the_ui_endpoints(server: Server) -> None:
    paths = server.client().get("/openapi.json").json()["paths"]
    assert {"/api/trace_list", "/api/traces/{trace_id}/view", "/api/conversations/{conversation_id}"} <= set(paths)
    names = {p["name"] for p in paths["/api/trace_list"]["get"]["parameters"]}
    assert {"sort", "order", "agent", "service_version", "scenario", "label", "limit", "offset"} <= names
