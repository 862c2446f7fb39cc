"""#31 one trace by id: ``tracedag show`` reads only the row groups of the trace it shows, and shows
what it showed when it read the whole-store views.

Before #31 ``load_shown`` read the ``traces``, ``dag_nodes`` and ``step_scores`` views (the latest build
of every trace) and ran ``failure_dag_roots`` over them; now it reads the trace's latest build from
``traces_all`` by id and restricts the views to that trace and build (``views.restrict_to_trace``).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.queries.query_fixtures import write_store
from tests.queries.test_rca_ties import SIBLINGS, WRAPPED
from tests.serve.serve_support import built_store
from tests.store.test_gc import N_TRACES, SPANS_PER_TRACE, churn, resend, seed
from tracedag.pipeline.dag import build as dag_build
from tracedag.pipeline.dag import build_store, show, show_stored
from tracedag.pipeline.score.materialize import materialize
from tracedag.pipeline.store import freshness
from tracedag.pipeline.store.gc import GcSettings
from tracedag.pipeline.store.views import LATEST_BY_ID_SQL, connect, latest_by_id, restrict_to_trace


def whole_store_shown(data: Path, trace_id: str, con: duckdb.DuckDBPyConnection | None = None) -> show.Shown:
    """What ``load_shown`` read before #31: the same SQL over the whole-store views, the cause computed
    by ``failure_dag_roots`` (never read from the stored rows). ``con``: a connection of ``connect(data)``
    to read on (a test comparing many traces opens one for all of them), else one of its own."""
    own = con is None
    con = connect(data) if con is None else con
    try:
        trace = con.sql("select * from traces where trace_id = $t", params={"t": trace_id}).to_arrow_table()
        nodes = con.sql(show._NODES_SQL, params={"t": trace_id}).to_arrow_table().to_pylist()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(show_stored, "cause_rows", lambda con, trace_id: None)
            return show.Shown(trace.to_pylist()[0], nodes, show._cause(con, trace_id))
    finally:
        if own:
            con.close()


def materialized_copy(src: Path, dst: Path) -> Path:
    """A copy of the store ``src`` with the named queries' rows stored (one full round), fresh."""
    shutil.copytree(src, dst)
    materialize(dst, [])
    con = connect(dst)
    try:
        assert freshness.fresh(con, dst)
    finally:
        con.close()
    return dst


COLUMNS = ("node", "score", "greedy_root_id", "greedy_hops", "final", "longest_chain")


_WHOLE: dict[Path, dict[str, show.Shown]] = {}


def whole_store_answers(data: Path) -> dict[str, show.Shown]:
    """``whole_store_shown`` of every trace of the fixture store ``data`` (never written to), computed once per module:
    the two tests below compare ``load_shown`` with it, on a materialized copy of ``data`` and on ``data`` itself."""
    if data not in _WHOLE:
        con = connect(data)
        try:
            _WHOLE[data] = {tid: whole_store_shown(data, tid, con) for tid in trace_ids(data)}
        finally:
            con.close()
    return _WHOLE[data]


@pytest.mark.parametrize("fixture", ["query_store", "rca_store", "ties_store"])
def test_the_stored_failure_dag_equals_the_computed_one(fixture: str, request: pytest.FixtureRequest,
                                                        tmp_path: Path) -> None:
    source = request.getfixturevalue(fixture)
    data = materialized_copy(source, tmp_path / "store")
    whole = whole_store_answers(source)  # the same traces, whose named queries' rows are not stored
    con = connect(data)
    failed = 0
    assert trace_ids(data) == sorted(whole)
    for tid in trace_ids(data):
        want = con.sql(show._CAUSE_SQL, params={"t": tid, "fail_threshold": 2.0, "max_hops": 1000}
                       ).to_arrow_table().to_pylist()
        got = show_stored.cause_rows(con, tid)
        assert got is not None
        assert [{k: r[k] for k in COLUMNS} | {"nearest": sorted(r["nearest"] or [])} for r in got] == \
            [{k: r[k] for k in COLUMNS} | {"nearest": sorted(r["nearest"] or [])} for r in want], tid
        failed += bool(want)
        assert show.load_shown(data, tid) == whole[tid], tid
    con.close()
    assert failed >= 2


@pytest.fixture(scope="module")
def ties_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/queries/test_rca_ties.py's traces: failures whose greedy step is decided by the tie rules."""
    return write_store(tmp_path_factory.mktemp("ties"), [WRAPPED, SIBLINGS])


def trace_ids(data: Path) -> list[str]:
    con = connect(data)
    try:
        return [str(r[0]) for r in con.execute("select trace_id from traces order by trace_id").fetchall()]
    finally:
        con.close()


@pytest.mark.parametrize("fixture", ["query_store", "rca_store"])
def test_show_reads_what_the_whole_store_views_give(fixture: str, request: pytest.FixtureRequest) -> None:
    data: Path = request.getfixturevalue(fixture)
    ids = trace_ids(data)
    assert len(ids) >= 6
    causes = 0
    whole = whole_store_answers(data)
    for tid in ids:
        got, want = show.load_shown(data, tid), whole[tid]
        assert got == want, tid
        causes += got.cause is not None
    assert causes >= 3  # the fixtures' failed traces: the cause path is compared too


# One trace of each build history: the builds that wrote a row of it to traces_all and the builds (or none, a
# human's row) its step_scores rows name. Traces of one history have the same rows in every file but their ids.
_HISTORIES_SQL = """
select min(trace_id) as trace_id, count(*) as traces from (
    select trace_id,
           (select list(distinct build_id order by build_id) from traces_all a where a.trace_id = t.trace_id) as built,
           (select list(distinct coalesce(build_id, '-') order by 1) from step_scores_all s
            where s.trace_id = t.trace_id) as scored
    from (select distinct trace_id from traces_all) t)
group by built, scored order by 1"""


def test_show_after_rebuilds_reads_the_latest_build_only(tmp_path: Path) -> None:
    churn(tmp_path)  # several incremental and full builds: traces_all holds superseded rows of each trace
    con = connect(tmp_path)
    builds = con.execute("select count(distinct build_id) from traces_all").fetchall()[0][0]
    histories = con.execute(_HISTORIES_SQL).fetchall()
    assert builds >= 5
    assert sum(n for _, n in histories) == len(trace_ids(tmp_path)) and len(histories) >= 10  # 17 of 30 traces
    for tid, _ in histories:
        assert show.load_shown(tmp_path, tid) == whole_store_shown(tmp_path, tid, con), tid
    con.close()


def test_a_unique_prefix_finds_the_trace_and_an_ambiguous_one_says_so(query_store: Path) -> None:
    assert show.load_shown(query_store, "t1-ch").trace["trace_id"] == "t1-chain"
    with pytest.raises(show.TraceNotFound, match="matches several traces"):
        show.load_shown(query_store, "t")
    with pytest.raises(show.TraceNotFound, match="is not in the store"):
        show.load_shown(query_store, "t9-none")


def _scans(profile: dict[str, Any]) -> list[dict[str, Any]]:
    """The Parquet scans of one profiled statement."""
    out: list[dict[str, Any]] = []
    todo = list(profile["operator"])
    while todo:
        node = todo.pop()
        todo += node.get("children", [])
        if node.get("name") == "READ_PARQUET":
            out.append(node)
    return out


@pytest.fixture(scope="module")
def small_groups(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A built and scored store whose build files have row groups of 64 rows (sorted by trace id)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dag_build, "TRACE_ROW_GROUP", 64)
        return built_store(tmp_path_factory.mktemp("groups") / "store", spans=2000, seed=31)


def test_one_trace_is_read_from_its_row_groups_only(small_groups: Path, tmp_path: Path) -> None:
    ids = trace_ids(small_groups)
    tid = ids[len(ids) // 2]
    con = connect(small_groups)
    out = tmp_path / "profile.json"
    con.execute("pragma enable_profiling = 'json'")
    con.execute(f"pragma profiling_output = '{out}'")

    def scans(sql: str, params: dict[str, object]) -> list[dict[str, Any]]:
        con.sql(sql, params=params).fetchall()
        return _scans(json.loads(out.read_text()))

    first = latest_by_id(con, tid)
    assert [r["trace_id"] for r in first] == [tid]
    build = str(first[0]["build_id"])
    lookup = scans(LATEST_BY_ID_SQL, {"lo": tid, "hi": tid + "\U0010ffff", "n": 2})
    restrict_to_trace(con, tid, build)
    nodes = scans(show._NODES_SQL, {"t": tid})
    cause = scans("select * from failure_dag_roots(2.0, [$t]::varchar[], 1000, false)", {"t": tid})
    build_files = [s for s in lookup + nodes + cause
                   if any(f"/{t}/" in s["extra_info"].get("Filename(s)", "") for t in ("traces", "dag_nodes", "dag_edges"))]
    assert len(build_files) >= 3
    for scan in build_files:  # a trace's rows straddle at most two row groups of a file
        assert scan["row_groups_scanned"] <= 2 < scan["total_row_groups_to_scan"], scan["extra_info"]
    assert sum(s["total_row_groups_to_scan"] for s in build_files) >= 30
    con.close()
    assert show.load_shown(small_groups, tid) == whole_store_shown(small_groups, tid)


def test_a_reader_racing_builds_and_their_collection_never_misses_a_step(tmp_path: Path) -> None:
    seed(tmp_path)
    build_store(tmp_path, idle_seconds=0)
    stop, seen, errors = threading.Event(), [], []

    def reader() -> None:
        while not stop.is_set():
            try:
                shown = show.load_shown(tmp_path, "t007")
                seen.append((len(shown.nodes), shown.trace["span_count"], {n["build_id"] for n in shown.nodes}
                             == {shown.trace["build_id"]}))
            except Exception as exc:  # any failure of a read is what this test looks for
                errors.append(repr(exc))

    th = threading.Thread(target=reader)
    th.start()
    try:
        cfg = GcSettings(max_small_files=2, small_rows=40)
        for step in range(2, 12):
            done = len(seen) + len(errors)
            resend(tmp_path, range(step % 5, N_TRACES, 2 + step % 4), step)
            build_store(tmp_path, idle_seconds=0, full=step % 4 == 0, compact=step % 3 == 0, gc=cfg)
            # at least one read ends after each build (under load the builds could take every turn of the GIL:
            # 4 reads in 10 builds once at load 11), so every step is raced and read
            deadline = time.monotonic() + 60
            while len(seen) + len(errors) <= done and time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        stop.set()
        th.join()
    assert errors == []
    assert len(seen) >= 5 and set(seen) == {(SPANS_PER_TRACE, SPANS_PER_TRACE, True)}
