"""The collection's liveness (``gc.liveness``, ``gc.latest_builds``) against the SQL of the ``traces`` view, and
the footer cache (``gc.footer``) that spares a collection reading every derived file's footer each round."""

import pyarrow as pa

from tests.dag.spanbuild import q, span, write_spans
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.store import gc
from tracedag.pipeline.store.gc import GcSettings, footer, latest_builds, liveness
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.schemas.layout import table_dir

# what the collection read before latest_builds: per build, its rows, its rows of a latest build, the spans of the
# others (the ``traces`` view's arg_max)
BUILDS_SQL = """
with l as (select trace_id, arg_max(build_id, (built_unix_nano, build_id)) as b from traces_all group by trace_id)
select t.build_id, count(*), count(l.trace_id),
       coalesce(sum(t.span_count) filter (where l.trace_id is null), 0)
from traces_all t left join l on t.trace_id = l.trace_id and t.build_id = l.b
group by t.build_id
"""
LATEST_SQL = """select trace_id || chr(31) || arg_max(build_id, (built_unix_nano, build_id)) from traces_all
group by trace_id"""


def _trace(k, received, spans=3):
    t = f"t{k:03d}"
    return [span("r", None, 0, 100, trace_id=t, received=received)] + [
        span(f"c{i}", "r", 10 * i, 10 * i + 5, trace_id=t, received=received) for i in range(spans - 1)]


def test_liveness_agrees_with_the_traces_view_over_superseded_and_tied_builds(tmp_path):
    data = tmp_path / "d"
    off = GcSettings(enabled=False)  # keep every superseded row
    write_spans(data, [r for k in range(12) for r in _trace(k, 1)])
    build_store(data, idle_seconds=0, gc=off)
    write_spans(data, [r for k in range(4) for r in _trace(k, 2, spans=5)])  # 4 traces grow: rebuilt
    build_store(data, idle_seconds=0, gc=off)
    build_store(data, idle_seconds=0, full=True, gc=off)  # every trace superseded once more
    write_spans(data, [r for k in range(20, 23) for r in _trace(k, 3)])
    build_store(data, idle_seconds=0, gc=off)
    lv = liveness(data)
    assert sorted(lv.keys.to_pylist()) == sorted(r[0] for r in q(data, LATEST_SQL))
    rows = q(data, BUILDS_SQL)
    assert len(rows) == 4
    assert lv.total == {b: n for b, n, _, _ in rows}
    assert lv.live == {b: n for b, _, n, _ in rows}
    assert lv.dead_spans == {b: n for b, _, _, n in rows}
    assert sorted(lv.live.values()) == [0, 0, 3, 12] and sum(lv.dead_spans.values()) == 12 * 3 + 4 * 5


def test_latest_builds_takes_the_greatest_time_then_build_id():
    pairs = pa.table({
        "trace_id": ["b", "a", "a", "b", "c", "a"],
        "build_id": ["x1", "x1", "x2", "x3", "x1", "x0"],
        "built_unix_nano": [5, 5, 5, 4, 1, 9],
        "span_count": [2, 3, 4, 5, 6, 7],
    })
    keys, per = latest_builds(pairs)
    assert sorted(keys.to_pylist()) == ["a\x1fx0", "b\x1fx1", "c\x1fx1"]  # a: time 9 wins; b: 5 > 4
    assert per["total"] == {"x1": 3, "x2": 1, "x3": 1, "x0": 1}
    assert per["live"] == {"x1": 2, "x2": 0, "x3": 0, "x0": 1}
    assert per["dead_spans"] == {"x1": 3, "x2": 4, "x3": 5, "x0": 0}
    keys, per = latest_builds(pairs.slice(0, 0))
    assert len(keys) == 0 and per == {"total": {}, "live": {}, "dead_spans": {}}


def test_a_footer_is_read_once_per_version_of_a_file(tmp_path, monkeypatch):
    rows = [{"trace_id": "t", "build_id": "b1"}, {"trace_id": "u", "build_id": "b1"}]
    path = write_parquet_atomic(pa.Table.from_pylist(rows), table_dir(tmp_path, "traces"), "one")
    assert footer(path) == (2, "b1")
    reads = []
    monkeypatch.setattr(gc, "single_build", lambda p, meta=None: reads.append(p) or "read")
    assert footer(path) == (2, "b1") and not reads  # cached
    write_parquet_atomic(pa.Table.from_pylist(rows + [{"trace_id": "v", "build_id": "b2"}]),
                         table_dir(tmp_path, "traces"), "one")  # another version under the same name
    assert footer(path) == (3, "read") and reads == [path]


def test_liveness_on_the_plans_open_connection_reads_the_files_written_since(tmp_path):
    """A build's collection reads the liveness on its plan's connection (``build_store``): the raw views are made
    again, so the traces files of the build itself count (else its rows would look dead and be deleted)."""
    from tracedag.pipeline.store.views import connect

    data = tmp_path / "d"
    off = GcSettings(enabled=False)
    write_spans(data, [r for k in range(5) for r in _trace(k, 1)])
    build_store(data, idle_seconds=0, gc=off)
    con = connect(data, tables=["traces"])
    try:
        write_spans(data, [r for k in range(3) for r in _trace(k, 2, spans=4)])
        build_store(data, idle_seconds=0, gc=off)  # 3 traces rebuilt after con was made
        write_spans(data, [r for k in range(7, 9) for r in _trace(k, 3)])
        build_store(data, idle_seconds=0, gc=off)
        on_con, fresh = liveness(data, con), liveness(data)
        assert con.sql("select 1").fetchall() == [(1,)]  # left open
    finally:
        con.close()
    assert sorted(on_con.keys.to_pylist()) == sorted(fresh.keys.to_pylist()) and len(fresh.keys) == 7
    assert (on_con.total, on_con.live, on_con.dead_spans) == (fresh.total, fresh.live, fresh.dead_spans)
    assert sorted(fresh.live.values()) == [2, 2, 3]
