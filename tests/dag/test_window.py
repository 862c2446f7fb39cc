"""Incremental build plans: a round reads the spans files written since the last one, never misses a span."""

import random
import time

import pyarrow.parquet as pq
import pytest

from tests.dag.spanbuild import q, span, table, write_spans
from tracedag.pipeline.dag import build, build_store
from tracedag.pipeline.dag.window import load_window, spans_listing
from tracedag.pipeline.store.compact import Compactor
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.views import connect
from tracedag.schemas.layout import MERGED_FROM_KEY, table_dir

HOUR = "2026-01-01-00"  # a closed receive hour: the compactor merges its small files


def _nodes(data):
    return q(data, "select trace_id, span_id, parent_span_id, topo_index from dag_nodes order by all")


def _plan(data, now):
    con = connect(data)
    try:
        return build.plan_build(con, data, spans_listing(data), load_window(data), now, 0, False, 1000)
    finally:
        con.close()


def test_a_round_plans_from_the_new_file_and_reads_from_its_first_arrival(tmp_path):
    now = time.time_ns()
    write_spans(tmp_path, [span("r", None, 0, 10, received=now - 5), span("a", "r", 1, 2, received=now - 5)])
    assert build_store(tmp_path, idle_seconds=0).plan == "full"  # no state yet
    write_spans(tmp_path, [span("x", None, 0, 10, trace_id="t2", received=now - 3)])
    plan = _plan(tmp_path, time.time_ns())
    assert plan.full_reason is None and plan.received_from == now - 3
    assert [c.to_pylist() for c in plan.chunks] == [["t2"]]
    stats = build_store(tmp_path, idle_seconds=0)
    assert (stats.plan, stats.traces_built) == ("incremental", 1)
    assert q(tmp_path, "select trace_id, span_count from traces order by 1") == [("t1", 2), ("t2", 1)]


def test_a_span_converted_late_with_an_older_arrival_rebuilds_its_trace(tmp_path):
    # two converters: the file of the later request is written first
    now = time.time_ns()
    write_spans(tmp_path, [span("r", None, 0, 10, received=now - 1)])
    build_store(tmp_path, idle_seconds=0)
    write_spans(tmp_path, [span("a", "r", 1, 2, received=now - 2)])  # older arrival, newer file
    stats = build_store(tmp_path, idle_seconds=0)
    assert (stats.plan, stats.traces_built) == ("incremental", 1)
    assert q(tmp_path, "select span_count, last_received_unix_nano from traces") == [(2, now - 1)]


def test_a_late_span_to_a_trace_built_long_ago_is_built_with_all_its_spans(tmp_path):
    # arrivals long past: the trace is no longer open, its first arrival unknown: the build reads every file
    write_spans(tmp_path, [span("r", None, 0, 10, received=1), span("a", "r", 1, 2, received=1)])
    build_store(tmp_path, idle_seconds=0)
    assert load_window(tmp_path).open.num_rows == 0
    write_spans(tmp_path, [span("b", "a", 1.5, 1.8, received=2)])
    assert _plan(tmp_path, time.time_ns()).received_from is None
    stats = build_store(tmp_path, idle_seconds=0)
    assert (stats.plan, stats.traces_built) == ("incremental", 1)
    assert q(tmp_path, "select span_count from traces") == [(3,)]
    assert [n[:3] for n in _nodes(tmp_path)] == [("t1", "a", "r"), ("t1", "b", "a"), ("t1", "r", None)]


def test_pending_traces_stay_open_until_complete(tmp_path):
    now = time.time_ns()
    write_spans(tmp_path, [span("a", "r", 1, 2, received=now)])  # no root yet: waits for the idle time
    first = build_store(tmp_path, idle_seconds=30, grace_seconds=0)
    assert (first.traces_built, first.traces_pending) == (0, 1)
    write_spans(tmp_path, [span("r", None, 0, 10, received=now + 1)])  # the root: complete after the grace
    second = build_store(tmp_path, idle_seconds=30, grace_seconds=0)
    assert (second.plan, second.traces_built) == ("incremental", 1)
    assert q(tmp_path, "select span_count, root_span_id from traces") == [(2, "r")]


def _hour_file(data, rows):
    return write_parquet_atomic(table(rows), table_dir(data, "spans") / f"recv_hour={HOUR}")


def test_a_compaction_of_seen_files_keeps_the_plan_incremental(tmp_path):
    for i in range(3):
        _hour_file(tmp_path, [span(f"r{i}", None, 0, 10, trace_id=f"t{i}", received=i + 1)])
    build_store(tmp_path, idle_seconds=0)
    Compactor(tmp_path).run(_no_lock, now_unix=time.time())
    merged = [f for f in spans_listing(tmp_path) if f.name.startswith("compact-")]
    assert len(merged) == 1 and MERGED_FROM_KEY in pq.read_schema(merged[0]).metadata
    stats = build_store(tmp_path, idle_seconds=0)
    assert (stats.plan, stats.traces_built) == ("incremental", 0)


def test_a_compaction_that_merged_an_unseen_file_makes_a_full_plan_that_misses_nothing(tmp_path):
    _hour_file(tmp_path, [span("r", None, 0, 10, received=1)])
    _hour_file(tmp_path, [span("q", None, 0, 10, trace_id="t2", received=2)])
    build_store(tmp_path, idle_seconds=0)
    _hour_file(tmp_path, [span("a", "r", 1, 2, received=3)])  # written, then merged before any plan saw it
    Compactor(tmp_path).run(_no_lock, now_unix=time.time())
    stats = build_store(tmp_path, idle_seconds=0)
    assert (stats.plan, stats.traces_built) == ("full", 1)
    assert q(tmp_path, "select trace_id, span_count from traces order by 1") == [("t1", 2), ("t2", 1)]


def test_a_crash_during_a_build_makes_the_next_plan_a_full_one(tmp_path, monkeypatch):
    write_spans(tmp_path, [span("r", None, 0, 10, received=1)])
    build_store(tmp_path, idle_seconds=0)
    write_spans(tmp_path, [span("q", None, 0, 10, trace_id="t2", received=2)])

    def crash(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(build, "_run", crash)
    with pytest.raises(RuntimeError):
        build_store(tmp_path, idle_seconds=0)
    monkeypatch.undo()
    assert load_window(tmp_path) is None
    stats = build_store(tmp_path, idle_seconds=0)
    assert (stats.plan, stats.traces_built) == ("full", 1)


@pytest.mark.parametrize("seed", range(12))
def test_rounds_over_files_in_any_order_build_what_one_full_build_does(tmp_path, seed):
    """Spans of 6 traces in random order, in files of 1-4 spans, 1-3 files new to each round (a round sees one
    file or several: 2-9 rounds per seed, 61 in all), some arrivals long past."""
    rng = random.Random(seed)
    now = time.time_ns()
    rows = []
    for t in range(6):
        n = rng.randint(1, 6)
        rows += [span(f"s{i}", None if i == 0 else f"s{rng.randrange(i)}", i, 20 - i, trace_id=f"t{t}",
                      received=now - rng.randrange(10**9) if rng.random() < 0.8 else 1 + rng.randrange(9))
                 for i in range(n)]
    rng.shuffle(rows)
    live, whole = tmp_path / "live", tmp_path / "whole"
    while rows:
        for _ in range(rng.randint(1, 3)):
            if not rows:
                break
            k = rng.randint(1, 4)
            write_spans(live, rows[:k])
            write_spans(whole, rows[:k])
            rows = rows[k:]
        build_store(live, idle_seconds=0)
    build_store(whole, idle_seconds=0, full=True)
    assert _nodes(live) == _nodes(whole)
    assert q(live, "select trace_id, span_count from traces order by 1") == q(
        whole, "select trace_id, span_count from traces order by 1")


class _no_lock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_incremental_plans_share_one_connection_a_full_one_closes_it(tmp_path):
    """The plans of live rounds on one store take the connection the last incremental plan left (``dag.kept``),
    whose view sees the traces built since; a full plan closes it, and the next incremental plan connects again."""
    from tracedag.pipeline.dag import kept

    now = time.time_ns()
    write_spans(tmp_path, [span("r", None, 0, 10, received=now - 5)])
    assert build_store(tmp_path, idle_seconds=0).plan == "full"
    assert kept.PLAN.current is None
    seen = []
    for i in range(3):
        write_spans(tmp_path, [span("x", None, 0, 10, trace_id=f"n{i}", received=now - 4 + i)])
        assert build_store(tmp_path, idle_seconds=0).plan == "incremental"
        assert kept.PLAN.current is not None and kept.PLAN.current[1] == tmp_path
        seen.append(kept.PLAN.current[2])
    assert seen[0] is seen[1] is seen[2]
    # a span late to a trace built by the round before: the kept view sees that build, so the trace is rebuilt
    write_spans(tmp_path, [span("y", "x", 1, 2, trace_id="n2", received=now)])
    assert build_store(tmp_path, idle_seconds=0).traces_built == 1
    assert q(tmp_path, "select trace_id, span_count from traces order by 1") == [
        ("n0", 1), ("n1", 1), ("n2", 2), ("t1", 1)]
    assert build_store(tmp_path, idle_seconds=0, full=True).plan == "full"
    assert kept.PLAN.current is None
    write_spans(tmp_path, [span("z", None, 0, 10, trace_id="n3", received=now)])
    assert build_store(tmp_path, idle_seconds=0).plan == "incremental"
    assert kept.PLAN.current is not None and kept.PLAN.current[2] is not seen[0]
