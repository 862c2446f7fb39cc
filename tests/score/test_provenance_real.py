"""Value provenance on a REAL agent conversation (issue #30 class 5): data edges and silent producers.

The agent loop of tests/queries/rca_scenarios.py (the official ``openai`` client traced by
``opentelemetry-instrumentation-openai-v2`` against the local scripted chat-completions server, the
agent, tools and conversation traced by ``tracedag.instrument``) exports with the real OTel SDK's
OTLP/HTTP exporter to a real ``tracedag collect`` on loopback port 0; the store is built and scored
by the real pipeline, which stores the ``data`` edges, and ``root_causes`` is read as a user would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.queries.rca_scenarios import (
    MODEL,
    Call,
    Scenario,
    Turn,
    _conversation,
    _fail,
    _ok,
    _server_script,
    genai_content_env,
)
from tests.realspans import fake_openai_server

STALE = "1Z999AA10123456784"
SAME_TURN = "1Z555BB20987654321"
TYPED = "1Z000XX00000000000"


def _order(order_id: str, tracking: str) -> Any:
    return _ok({"order_id": order_id, "status": "shipped", "tracking_no": tracking})


def _not_found(tracking: str) -> Any:
    return _fail(f"404 Not Found: no shipment with tracking number {tracking}", exc=LookupError)


SCENARIOS = [
    # turn 1's lookup_order silently returns a stale tracking number, the model quotes it, turn 2's
    # track_shipment fails with 404: the lookup is the root cause
    Scenario("stale-tracking", "provenance", [
        Turn("Where is my order A1042?", [[Call("lookup_order", {"order_id": "A1042"})],
                                          f"Order A1042 has shipped, tracking number {STALE}."]),
        Turn("Can you track it?", [[Call("track_shipment", {"tracking_no": STALE})],
                                   "Sorry, I could not find that shipment."]),
    ], None, {"lookup_order": _order("A1042", STALE), "track_shipment": _not_found(STALE)}),
    # the same within one turn (one trace)
    Scenario("same-turn", "provenance", [
        Turn("Where is my parcel for order B2071?", [
            [Call("lookup_order", {"order_id": "B2071"})],
            [Call("track_shipment", {"tracking_no": SAME_TURN})],
            "Sorry, the carrier does not know that parcel."]),
    ], None, {"lookup_order": _order("B2071", SAME_TURN), "track_shipment": _not_found(SAME_TURN)}),
    # the user typed a tracking number that does not exist: the user's message is the cause
    Scenario("user-typed", "provenance", [
        Turn(f"Please track {TYPED} for me.", [[Call("track_shipment", {"tracking_no": TYPED})],
                                               "That tracking number is not valid."]),
    ], None, {"track_shipment": _fail(f"invalid tracking number {TYPED}", exc=ValueError)}),
    # control: the value came from the lookup but the carrier timed out: nothing says the value is
    # unknown, the tool stays the root (its data edge is still stored)
    Scenario("carrier-down", "provenance", [
        Turn("Where is my order C3301?", [
            [Call("lookup_order", {"order_id": "C3301"})],
            [Call("track_shipment", {"tracking_no": "1Z777CC30111111111"})],
            "The carrier is not answering, sorry."]),
    ], None, {"lookup_order": _order("C3301", "1Z777CC30111111111"),
              "track_shipment": _fail("carrier API timed out after 10s", exc=TimeoutError)}),
    # control: only a common word and a short number are shared with the lookup's output: no data
    # edge, though the failure says not found
    Scenario("common-words", "provenance", [
        Turn("How many parcels are there?", [
            [Call("count_parcels", {"region": "north"})],
            [Call("track_shipment", {"carrier": "express", "parcels": 42})],
            "I could not find them."]),
    ], None, {"count_parcels": _ok({"carrier": "express", "count": 42}),
              "track_shipment": _fail("404 not found", exc=LookupError)}),
]


def _capture(data: Path) -> None:
    """Run the scenarios with the OTLP/HTTP exporter into a real collector storing into ``data``."""
    import openai
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    from tracedag import instrument as td
    from tracedag.pipeline.service import CollectorConfig, start_collector

    collector = start_collector(CollectorConfig(data=data, http_port=0, grpc_port=None))
    try:
        with genai_content_env():
            provider = td.configure(f"http://127.0.0.1:{collector.http_port}", service_name="shop-agent",
                                    set_global=False, schedule_delay_millis=50)
            instrumentor = OpenAIInstrumentor()
            instrumentor.instrument(tracer_provider=provider)
            try:
                with fake_openai_server([r for s in SCENARIOS for r in _server_script(s)]) as srv:
                    client = openai.OpenAI(base_url=srv.base_url, api_key="test-key", max_retries=0)
                    for s in SCENARIOS:
                        _conversation(td, client, s)
                td.force_flush()
            finally:
                instrumentor.uninstrument()
                td.shutdown()
        collector.flush()
    finally:
        collector.stop(2)


def provenance_store(data: Path) -> int:
    """Capture ``SCENARIOS`` into a new store at ``data``, build and score it; return the data edges stored."""
    from tracedag.pipeline.dag import build_store
    from tracedag.pipeline.score import score_store

    _capture(data)
    build_store(data, idle_seconds=0)
    return score_store(data).data_edges


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("provenance-real") / "data"
    assert provenance_store(data) == 4  # stale-tracking, same-turn, user-typed, carrier-down
    return data


def _sql(data: Path, sql: str) -> list[dict[str, Any]]:
    from tracedag.pipeline.store.views import connect

    con = connect(data)
    try:
        cur = con.execute(sql)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    finally:
        con.close()


_NAMES = """
select t.conversation_id, s.trace_id, s.span_id, s.name,
       dense_rank() over (partition by t.conversation_id order by t.start_time_unix_nano) as turn
from spans s join traces t using (trace_id)
"""


def _where(data: Path) -> dict[tuple[str, str], tuple[str, int, str]]:
    """(trace_id, span_id) -> (conversation, turn, span name)."""
    return {(r["trace_id"], r["span_id"]): (r["conversation_id"], r["turn"], r["name"]) for r in _sql(data, _NAMES)}


def _roots(data: Path, per: str) -> dict[str, tuple[Any, ...]]:
    from tracedag.pipeline.store.querying import run_named

    where = _where(data)
    out: dict[str, tuple[Any, ...]] = {}
    for r in run_named(data, "root_causes", {"per": per}).to_pylist():
        conv, turn, name = where[(r["root_trace_id"], r["root_span_id"])]
        key = f"{conv}#{where[(r['trace_id'], r['failed_span_id'])][1]}" if per == "trace" else conv
        out[key] = (turn, name, r["root_step_type"], r["silent_producer"], r["data_arg"])
    return out


def test_data_edges_are_stored_from_the_producer(store: Path) -> None:
    where = _where(store)
    edges = _sql(store, "select * from dag_edges where edge_kind = 'data'")
    got = sorted((where[(e["trace_id"], e["dst_span_id"])][0],
                  where[(e["src_trace_id"], e["src_span_id"])][1:], e["data_arg"], e["data_from"],
                  e["upstream_span_id"] == e["src_span_id"], e["downstream_span_id"] == e["dst_span_id"])
                 for e in edges)
    assert got == [
        ("conv-carrier-down", (1, "execute_tool lookup_order"), "tracking_no", "output", True, True),
        ("conv-same-turn", (1, "execute_tool lookup_order"), "tracking_no", "output", True, True),
        ("conv-stale-tracking", (1, "execute_tool lookup_order"), "tracking_no", "output", True, True),
        ("conv-user-typed", (1, f"chat {MODEL}"), "tracking_no", "user", True, True),
    ]


def test_silent_producer_turns_back_per_conversation(store: Path) -> None:
    assert _roots(store, "conversation") == {
        "conv-stale-tracking": (1, "execute_tool lookup_order", "tool", True, "tracking_no"),
        "conv-same-turn": (1, "execute_tool lookup_order", "tool", True, "tracking_no"),
        "conv-user-typed": (1, f"chat {MODEL}", "user", True, "tracking_no"),
        "conv-carrier-down": (1, "execute_tool track_shipment", "tool", False, None),
        "conv-common-words": (1, "execute_tool track_shipment", "tool", False, None),
    }


def test_per_trace_stays_within_the_trace(store: Path) -> None:
    got = _roots(store, "trace")
    # turn 2 of the stale tracking number: its producer is in turn 1, out of the trace
    assert got["conv-stale-tracking#2"] == (2, "execute_tool track_shipment", "tool", False, None)
    assert got["conv-same-turn#1"] == (1, "execute_tool lookup_order", "tool", True, "tracking_no")


def test_rescoring_stores_no_second_copy(store: Path) -> None:
    from tracedag.pipeline.score.provenance import data_edges, write_data_edges
    from tracedag.pipeline.store.querying import to_arrow
    from tracedag.pipeline.store.views import connect

    con = connect(store)
    try:
        scope = to_arrow(con.sql("select distinct trace_id from traces"))
        assert data_edges(con, scope).num_rows == 4
        assert write_data_edges(store, con, scope) == 0
    finally:
        con.close()


def test_stored_root_causes_equal_the_sql(store: Path) -> None:
    from tests.queries.test_materialized import assert_materialized_equal

    assert_materialized_equal(store)  # the rows root_causes read above were the materialized ones


def test_inputs_read_from_the_earliest_arrival(store: Path) -> None:
    """A live round's bounds (no span of the scope arrived earlier, no latest build of it is older) give the same
    edges; past every arrival or build, no failed step's input or step is read, so no edge: the bounds are what
    the rows are read by."""
    from tracedag.pipeline.score.provenance import data_edges
    from tracedag.pipeline.store.querying import to_arrow
    from tracedag.pipeline.store.views import connect

    con = connect(store)
    try:
        scope = to_arrow(con.sql("select distinct trace_id from traces"))
        first, last = con.execute("select min(received_unix_nano), max(received_unix_nano) from spans_all").fetchall()[0]
        full = data_edges(con, scope).sort_by([("trace_id", "ascending"), ("dst_span_id", "ascending")])
        bounded = data_edges(con, scope, first).sort_by([("trace_id", "ascending"), ("dst_span_id", "ascending")])
        assert bounded.equals(full) and full.num_rows == 4
        assert data_edges(con, scope, last + 1).num_rows == 0
        oldest = con.execute("select min(build_id) from traces").fetchall()[0][0]
        by_build = data_edges(con, scope, first, oldest).sort_by([("trace_id", "ascending"), ("dst_span_id", "ascending")])
        assert by_build.equals(full)
        assert data_edges(con, scope, 0, oldest + "~").num_rows == 0  # after every build id
    finally:
        con.close()


def test_scope_built_by_the_round(store: Path) -> None:
    """``_failed_traces`` says whether the round's build built every trace in scope (then its bound holds)."""
    import pyarrow.parquet as pq

    from tracedag.pipeline.score.provenance import _failed_traces
    from tracedag.schemas.layout import table_dir

    files = sorted(table_dir(store, "step_scores").glob("*.parquet"))
    builds = {b for f in files for b in pq.read_table(f, columns=["build_id"]).column("build_id").to_pylist() if b}
    scope, built = _failed_traces(files, next(iter(builds)) if len(builds) == 1 else None)
    assert scope.num_rows > 0 and built == (len(builds) == 1)
    assert _failed_traces(files, "build-0-none") == (scope, False)
    assert _failed_traces(files)[1] is False
