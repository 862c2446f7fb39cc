"""root_causes with data edges (value provenance, issue #30 class 5) on a hand-built store.

Every trace below is written by hand (tests/queries/query_fixtures.py) with its ``data`` edges given as
dag_edges rows, and the expected rows were worked out by hand from root_causes.sql's header:

- c1 (two turns): turn 1's lookup_order (k1, passed, score 5) wrote the tracking number; turn 2's
  track_shipment (k2) fails "HTTP 404 ... not found". per=conversation: k1 is the root, a silent
  producer one hop (the data edge) above k2, in turn 1. per=trace: the edge comes from another trace,
  so turn 2 names its own k2.
- c2 (one turn): the same within one trace: per=trace names k3 too.
- c3: the user typed the value (data_from 'user', carried by the model call l4): the user is the root.
- c4: the tool fails with HTTP 500 (nothing says the value is unknown): k6 stays the root.
- c5: a validation error naming the argument (tracking_no) flips to the producer; c6's validation error
  names another argument (order_id): no flip.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.queries.query_fixtures import BUILD, Score, Step, Trace, _table, write_store
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.querying import run_named
from tracedag.schemas.layout import table_dir
from tracedag.schemas.tables import DAG_EDGES_V1

STRATEGIES = ("greedy", "full_path_min", "weighted", "agenteval")


def _tool_turn(tid: str, offset: int, conv: str, producer: str, consumer: str, message: str,
               producer_first: bool = True) -> Trace:
    """Agent root, a passing producer tool, a model call, the failing consumer tool, in sequence."""
    root = f"a-{tid}"
    steps = [Step(root, None, "assistant", 0, 100, "agent"),
             Step(producer, root, "lookup_order", 10, 20),
             Step(f"l-{tid}", root, "chat gpt-4o-mini", 20, 30, "llm", input_text="where is it?"),
             Step(consumer, root, "track_shipment", 30, 40, status_message=message, error_type="LookupError")]
    seq = [(producer, f"l-{tid}"), (f"l-{tid}", consumer)]
    scores = [Score(producer, 5.0), Score(consumer, 1.0, taxonomy_l1="tool", taxonomy_l2="execution",
                                          taxonomy_l3="tool_error")]
    if not producer_first:
        steps = [s for s in steps if s.span_id != producer]
        seq, scores = seq[1:], scores[1:]
    return Trace(tid, offset, steps, seq, scores, conversation_id=conv)


def _turn1(tid: str, conv: str) -> Trace:
    root = f"a-{tid}"
    return Trace(tid, 0, [Step(root, None, "assistant", 0, 100, "agent"),
                          Step("l1", root, "chat gpt-4o-mini", 10, 20, "llm", input_text="where is order A1042?"),
                          Step("k1", root, "lookup_order", 20, 30)],
                 [("l1", "k1")], [Score("k1", 5.0)], conversation_id=conv)


def _data(trace_id: str, src: str, dst: str, arg: str, src_trace: str | None = None,
          data_from: str = "output") -> dict[str, object]:
    return {"trace_id": trace_id, "build_id": BUILD, "src_span_id": src, "dst_span_id": dst, "edge_kind": "data",
            "upstream_span_id": src, "downstream_span_id": dst, "src_trace_id": src_trace or trace_id,
            "data_arg": arg, "data_from": data_from}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("prov") / "data"
    traces = [
        _turn1("t1", "c1"),
        _tool_turn("t2", 1000, "c1", "-", "k2", "HTTP 404: tracking number 1Z999AA1 not found", producer_first=False),
        _tool_turn("t3", 2000, "c2", "k3", "k4", "no such tracking number"),
        _tool_turn("t4", 3000, "c3", "-", "k5", "invalid tracking number", producer_first=False),
        _tool_turn("t5", 4000, "c4", "k7", "k6", "HTTP 500: internal server error"),
        _tool_turn("t6", 5000, "c5", "k9", "k8", "1 validation error for track: tracking_no must match ^1Z"),
        _tool_turn("t7", 6000, "c6", "k11", "k10", "1 validation error for track: order_id is required"),
    ]
    write_store(data, traces)
    edges = [_data("t2", "k1", "k2", "tracking_no", src_trace="t1"),
             _data("t3", "k3", "k4", "tracking_no"),
             _data("t4", "l-t4", "k5", "tracking_no", data_from="user"),
             _data("t5", "k7", "k6", "tracking_no"),
             _data("t6", "k9", "k8", "tracking_no"),
             _data("t7", "k11", "k10", "tracking_no")]
    write_parquet_atomic(_table(edges, DAG_EDGES_V1), table_dir(data, "dag_edges"))
    return data


COLS = ("trace_id", "failed_span_id", "root_span_id", "root_step_type", "root_step_name", "root_score",
        "root_trace_id", "root_turn_index", "turn_index", "hops_from_root", "silent_producer", "data_arg",
        "root_taxonomy_l3", "kind")


def _rows(data: Path, per: str, strategy: str = "greedy") -> dict[str, tuple[object, ...]]:
    got = run_named(data, "root_causes", {"per": per, "strategy": strategy}).to_pylist()
    return {r["trace_id"]: tuple(r[c] for c in COLS) for r in got}


TOOL_ROOT = ("tool", "track_shipment", 1.0)

# per=conversation: (trace, failed, root, root type, root name, root score, root trace, root turn, turn,
# hops, silent, data_arg, root taxonomy l3, kind)
BY_CONVERSATION = {
    "t2": ("t2", "k2", "k1", "tool", "lookup_order", 5.0, "t1", 1, 2, 1, True, "tracking_no", None, "originating"),
    "t3": ("t3", "k4", "k3", "tool", "lookup_order", 5.0, "t3", 1, 1, 1, True, "tracking_no", None, "originating"),
    "t4": ("t4", "k5", "l-t4", "user", "user", None, "t4", 1, 1, 1, True, "tracking_no", None, "originating"),
    "t5": ("t5", "k6", "k6", *TOOL_ROOT, "t5", 1, 1, 0, False, None, "tool_error", "originating"),
    "t6": ("t6", "k8", "k9", "tool", "lookup_order", 5.0, "t6", 1, 1, 1, True, "tracking_no", None, "originating"),
    "t7": ("t7", "k10", "k10", *TOOL_ROOT, "t7", 1, 1, 0, False, None, "tool_error", "originating"),
}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_silent_producer_per_conversation(store: Path, strategy: str) -> None:
    assert _rows(store, "conversation", strategy) == BY_CONVERSATION


def test_per_trace_reads_only_data_edges_of_the_same_trace(store: Path) -> None:
    got = _rows(store, "trace")
    # turn 2 of c1: the producer is in turn 1, out of the trace: the failing tool is its own root
    assert got["t2"] == ("t2", "k2", "k2", *TOOL_ROOT, "t2", 2, 2, 0, False, None, "tool_error", "originating")
    assert {k: v for k, v in got.items() if k != "t2"} == {k: v for k, v in BY_CONVERSATION.items() if k != "t2"}
    assert "t1" not in got  # turn 1 did not fail


def test_per_step_rows_carry_the_flag(store: Path) -> None:
    got = run_named(store, "root_causes", {"per": "step"}).to_pylist()
    flagged = sorted((r["failed_span_id"], r["root_span_id"]) for r in got if r["silent_producer"])
    assert flagged == [("k4", "k3"), ("k5", "l-t4"), ("k8", "k9")]


def _show(data: Path, trace_id: str) -> str:
    from click.testing import CliRunner

    from tracedag.pipeline.cli import cli

    r = CliRunner().invoke(cli, ["show", trace_id, "--data", str(data)], env={"COLUMNS": "220"})
    assert r.exit_code == 0, r.output
    return r.output


def test_show_marks_the_silent_producer_and_the_data_edge(store: Path) -> None:
    out = _show(store, "t3")
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip() and ln.split()[0] in
             ("lookup_order", "track_shipment")}
    assert "◆ root cause: silent producer" in lines["lookup_order"]
    assert "✖ failure (1) ← data tracking_no" in lines["track_shipment"]
    assert "root cause: lookup_order (tool, score 5.0) → track_shipment (the trace's failure); 1 hop" in out
    assert ("silent producer: lookup_order wrote the value of tracking_no, which track_shipment failed on as "
            "unknown, invalid or not found") in out


def test_show_names_the_user_and_keeps_a_tool_that_failed_on_its_own(store: Path) -> None:
    out = _show(store, "t4")
    assert "◆ root cause: the user's message" in out
    assert "root cause: the user's message (carried by chat gpt-4o-mini) → track_shipment" in out
    assert "silent producer: the user typed the value of tracking_no" in out
    out = _show(store, "t5")  # HTTP 500: the data edge is shown, the tool stays the root
    assert "◆ root cause = failure ← data tracking_no" in out and "silent producer" not in out
    out = _show(store, "t2")  # per trace: the producer is in turn 1's trace
    assert "← data tracking_no" in out and "silent producer" not in out
