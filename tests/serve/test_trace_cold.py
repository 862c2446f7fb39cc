"""#31 a trace's first view on a store just opened: the fixed costs before its reads are paid once per document
(the store's freshness, the trace's newest round) or not at all (the connection's catalog, the SQL files read
again), with the same answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tracedag import queries
from tracedag.pipeline.serve.data import Store
from tracedag.pipeline.store import current_rounds, freshness, materialized, sqlfiles
from tracedag.pipeline.store.querying import bind_params, query_doc
from tracedag.pipeline.store.views import connect

NAMES = ("trace_summary", "propagation", "root_causes")


def _trace_ids(data: Path) -> list[str]:
    con = connect(data)
    try:
        return [str(r[0]) for r in con.execute("select trace_id from traces order by trace_id limit 3").fetchall()]
    finally:
        con.close()


def _counted(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    calls = [0]
    real = getattr(module, name)

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, counting)
    return calls


def test_a_cold_first_view_asks_freshness_and_the_newest_round_once(serve_store: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    want = {tid: Store(serve_store).trace(tid) for tid in _trace_ids(serve_store)}
    catalog = _counted(monkeypatch, freshness, "has_state_view")
    fresh = _counted(monkeypatch, freshness, "freshness")
    newest = _counted(monkeypatch, current_rounds, "lookup")
    for tid, doc in want.items():
        freshness._FRESH.clear()  # a server just started: only what is kept on disk is known
        assert Store(serve_store).trace(tid) == doc
    assert (fresh[0], newest[0]) == (len(want), len(want))
    assert catalog[0] == 0  # the connection was made after a round's state files were listed: it has the view


def test_named_statements_are_each_named_statement(serve_store: Path) -> None:
    con = connect(serve_store)
    try:
        for tid in _trace_ids(serve_store):
            wanted = [(name, bind_params(query_doc(name), {"trace_id": tid})) for name in NAMES]
            together = freshness.named_statements(con, serve_store, wanted)
            assert together == [freshness.named_statement(con, serve_store, n, v) for n, v in wanted]
            assert all(s is not None for s in together)
    finally:
        con.close()


def test_the_sql_definitions_are_read_again_when_a_sql_file_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    before = materialized.definitions_hash()
    stamp = sqlfiles.stamp()
    assert stamp and sqlfiles.described("failures") == queries.describe("failures")
    real = queries.load
    monkeypatch.setattr(queries, "load", lambda name: real(name) + ("\n-- edited" if name == "failures" else ""))
    assert materialized.definitions_hash() == before  # the files' names, sizes and times are the same
    edited = (*stamp[:-1], (stamp[-1][0], stamp[-1][1] + 1, stamp[-1][2]))
    monkeypatch.setattr(sqlfiles, "stamp", lambda: edited)
    assert materialized.definitions_hash() != before
    monkeypatch.setattr(sqlfiles, "stamp", lambda: ())  # not plain files: read each time
    assert materialized.definitions_hash() != before
