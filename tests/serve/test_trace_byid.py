"""#31 serve's one-trace reads: the trace's stored rows are read on the server's connection (no new
connection per query), and the document is the one the named queries give for that trace."""

from __future__ import annotations

from pathlib import Path

from tracedag.pipeline.serve.data import Store
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.views import connect

NAMES = ("trace_summary", "propagation", "root_causes")


def some_traces(data: Path) -> list[str]:
    con = connect(data)
    try:
        failed = "select distinct trace_id from step_scores where score <= 2 order by 1 limit 4"
        other = "select trace_id from traces order by trace_id limit 2"
        return sorted({str(r[0]) for sql in (failed, other) for r in con.execute(sql).fetchall()})
    finally:
        con.close()


def test_one_trace_rows_are_the_named_queries_rows(serve_store: Path) -> None:
    store = Store(serve_store)
    for tid in some_traces(serve_store):
        for name in NAMES:
            stored = store._stored(name, {"trace_id": tid}, store.state())
            assert stored is not None  # the scorer stored the rows: no SQL run, no connection made
            assert stored.to_pylist() == run_named(serve_store, name, {"trace_id": tid}).to_pylist(), (tid, name)


def test_the_first_view_of_a_trace_equals_its_view_from_the_whole_store_results(serve_store: Path) -> None:
    cold, warm = Store(serve_store), Store(serve_store)
    warm.warm()  # the whole-store results cached: a trace's rows are filtered from them
    for tid in some_traces(serve_store):
        assert cold.trace(tid) == warm.trace(tid)


def test_each_nodes_score_and_metric_count_are_its_score_rows_lowest_and_count(serve_store: Path) -> None:
    store = Store(serve_store)
    con = connect(serve_store)
    seen = 0
    try:
        for tid in some_traces(serve_store):
            want = {str(r[0]): (float(r[1]) if r[1] is not None else None, int(r[2])) for r in con.execute(
                "select span_id, min(score), count(*) from step_scores where trace_id = ? group by span_id",
                [tid]).fetchall()}
            nodes = store.trace(tid)["nodes"]
            got = {n["span_id"]: (n["score"], n["metrics"]) for n in nodes if n["metrics"] is not None}
            assert got == want, tid
            assert all(n["score"] is None for n in nodes if n["span_id"] not in want)
            seen += len(want)
    finally:
        con.close()
    assert seen > 0
