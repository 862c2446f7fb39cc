"""Garbage collection of superseded builds and compaction of derived files, on a real Parquet store.

The views must give the same rows before and after a collection, the raw ``*_all`` views must shrink
to the live rows, a reader running meanwhile must never count a row twice or miss one, and a crash
at any point of a collection must leave correct views and a store that the next run cleans up.
"""

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

from tests.dag.spanbuild import q, span, table, write_spans
from tracedag.pipeline.cli import cli
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.gc import GcSettings, staging_root
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.querying import run_sql
from tracedag.pipeline.store.swap import collect
from tracedag.schemas.errors import QueryFailed
from tracedag.schemas.layout import table_dir
from tracedag.schemas.tables import STEP_SCORES_V1

N_TRACES = 30
SPANS_PER_TRACE = 4
NO_GC = GcSettings(enabled=False)
VIEWS = {
    "traces": "select * exclude (built_unix_nano) from traces order by trace_id",
    "dag_nodes": "select * from dag_nodes order by trace_id, span_id",
    "dag_edges": "select * from dag_edges order by all",
    "step_scores": "select * from step_scores order by all",
}


def trace_rows(k, received):
    """One trace: a root and three children in sequence."""
    t = f"t{k:03d}"
    return [span("r", None, 0, 100, trace_id=t, received=received)] + [
        span(f"c{i}", "r", 10 * i, 10 * i + 5, trace_id=t, received=received) for i in range(SPANS_PER_TRACE - 1)]


def seed(data, n=N_TRACES):
    write_parquet_atomic(table([r for k in range(n) for r in trace_rows(k, 1)]), table_dir(data, "spans"))


def resend(data, traces, received):
    """Re-send one span of each trace later (a duplicate): the traces are rebuilt, the counts stay."""
    write_spans(data, [span("c0", "r", 0, 5, trace_id=f"t{k:03d}", received=received) for k in traces])


def snapshot(data):
    return {name: q(data, sql) for name, sql in VIEWS.items()}


def raw_and_live(data, name):
    return q(data, f"select (select count(*) from {name}_all), (select count(*) from {name})")[0]


def score_file(data, rows, stem=None):
    """A step_scores file of (trace, span, build) rows."""
    cols = {f.name: pa.nulls(len(rows), f.type) for f in STEP_SCORES_V1}
    cols.update(trace_id=pa.array([r[0] for r in rows]), span_id=pa.array([r[1] for r in rows]),
                build_id=pa.array([r[2] for r in rows], pa.string()), metric=pa.array(["m"] * len(rows)),
                score=pa.array([3.0] * len(rows)))
    write_parquet_atomic(pa.table(cols, schema=STEP_SCORES_V1), table_dir(data, "step_scores"), stem)


def churn(data, gc=NO_GC):
    """Several incremental builds (a few traces rebuilt each) and a full one; scores on some builds."""
    seed(data)
    first = build_store(data, idle_seconds=0, gc=gc)
    score_file(data, [(f"t{k:03d}", "r", first.build_id) for k in range(N_TRACES)] + [("t000", "c1", None)])
    for step in range(2, 6):
        resend(data, range(step, N_TRACES, step), step)
        build_store(data, idle_seconds=0, gc=gc)
    full = build_store(data, idle_seconds=0, full=True, gc=gc)
    resend(data, range(0, N_TRACES, 3), 9)
    last = build_store(data, idle_seconds=0, gc=gc)
    score_file(data, [(f"t{k:03d}", "c2", full.build_id) for k in range(N_TRACES)]
               + [(f"t{k:03d}", "c2", last.build_id) for k in range(0, N_TRACES, 3)])


@pytest.fixture(scope="module")
def churned(tmp_path_factory):
    """A store after ``churn`` (read-only: the tests take ``churned_copy``), built once for the module."""
    data = tmp_path_factory.mktemp("churned")
    churn(data)
    return data


@pytest.fixture
def churned_copy(churned, tmp_path):
    """This test's own copy of the churned store, in ``tmp_path``."""
    shutil.copytree(churned, tmp_path, dirs_exist_ok=True)
    return tmp_path


def test_views_identical_before_and_after_collection(churned_copy):
    tmp_path = churned_copy
    before = snapshot(tmp_path)
    assert raw_and_live(tmp_path, "dag_nodes")[0] > 2 * N_TRACES * SPANS_PER_TRACE  # garbage piled up
    stats = collect(tmp_path, compact=True)
    assert snapshot(tmp_path) == before
    for name in ("traces", "dag_nodes", "dag_edges", "step_scores"):
        raw, live = raw_and_live(tmp_path, name)
        assert raw == live, name  # compaction filters every small file: nothing superseded is left
    assert q(tmp_path, "select count(*) from step_scores where build_id is null") == [(1,)]  # a human row stays
    assert stats.deleted["dag_nodes"] >= 5 and stats.merged["dag_nodes"] >= 2
    assert len(parquet_files(tmp_path, "dag_nodes")) == 1 and not staging_root(tmp_path).exists()
    assert collect(tmp_path, compact=True).rows_dropped == {}  # a second pass has nothing left to do


def test_builds_keep_superseded_share_bounded(tmp_path):
    seed(tmp_path)
    build_store(tmp_path, idle_seconds=0)
    for step in range(2, 8):
        resend(tmp_path, range(0, N_TRACES, step), step)
        build_store(tmp_path, idle_seconds=0, gc=GcSettings(max_small_files=3))
        for name in ("dag_nodes", "dag_edges", "traces"):
            raw, live = raw_and_live(tmp_path, name)
            assert raw <= 2 * live, (step, name)  # each file at most half superseded
        assert len(parquet_files(tmp_path, "dag_nodes")) <= 4
    full = build_store(tmp_path, idle_seconds=0, full=True)
    assert full.gc is not None and full.gc.rewritten == {}  # after a full rebuild: deletions only
    for name in ("dag_nodes", "dag_edges", "traces"):
        raw, live = raw_and_live(tmp_path, name)
        assert raw == live == q(tmp_path, f"select count(*) from {name}_all where build_id = '{full.build_id}'")[0][0]


def test_human_scores_file_and_busy_scorer(tmp_path):
    seed(tmp_path)
    first = build_store(tmp_path, idle_seconds=0)
    score_file(tmp_path, [("t000", "r", first.build_id), ("t001", "r", None)], stem="human")
    score_file(tmp_path, [("t000", "c0", first.build_id)])
    import fcntl

    with open(tmp_path / "state" / "score.lock", "a+") as fh:  # a scorer is running
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        busy = build_store(tmp_path, idle_seconds=0, full=True)
    assert busy.gc is not None and busy.gc.skipped == ["step_scores"]
    assert raw_and_live(tmp_path, "step_scores") == (3, 1)
    again = CliRunner().invoke(cli, ["build", "--data", str(tmp_path), "--compact"])
    assert again.exit_code == 0, again.output
    assert "gc step_scores: 1 superseded files deleted" in again.output
    assert [f.name for f in parquet_files(tmp_path, "step_scores")] == ["human.parquet"]  # never merged away
    assert raw_and_live(tmp_path, "step_scores") == (2, 1)


def test_concurrent_reader_never_sees_a_wrong_count(tmp_path):
    seed(tmp_path)
    build_store(tmp_path, idle_seconds=0)
    want = (N_TRACES * SPANS_PER_TRACE, N_TRACES * SPANS_PER_TRACE, N_TRACES * (SPANS_PER_TRACE - 1) * 2 - N_TRACES)
    assert q(tmp_path, "select (select count(*) from dag_nodes), (select sum(span_count) from traces), "
                       "(select count(*) from dag_edges)")[0] == want
    stop, seen, errors = threading.Event(), [], []
    sql = ("select (select count(*) from dag_nodes) as n, (select sum(span_count) from traces) as s, "
           "(select count(*) from dag_edges) as e")

    def reader():
        # the query layer re-runs a query whose listed file vanished under a swap (see querying.py)
        while not stop.is_set():
            try:
                row = run_sql(tmp_path, sql).to_pylist()[0]
                seen.append((row["n"], row["s"], row["e"]))
            except QueryFailed as exc:
                errors.append(str(exc))

    th = threading.Thread(target=reader)
    th.start()
    try:
        cfg = GcSettings(max_small_files=2, small_rows=40)  # full builds' files (120 nodes) are large
        done = {"deleted": 0, "rewritten": 0, "merged": 0}
        for step in range(2, 14):
            resend(tmp_path, range(step % 5, N_TRACES, 2 + step % 4), step)
            gc = build_store(tmp_path, idle_seconds=0, full=step % 4 == 0, compact=step % 3 == 0, gc=cfg).gc
            assert gc is not None
            for k in done:
                done[k] += sum(getattr(gc, k).values())
    finally:
        stop.set()
        th.join()
    assert len(seen) >= 10 and set(seen) == {want}
    assert errors == []
    assert min(done.values()) > 0, done  # the reader ran across deletions, rewrites and merges


CHILD = """
import sys
from pathlib import Path
from tracedag.pipeline.dag import build_store
build_store(Path(sys.argv[1]), idle_seconds=0, full=sys.argv[2] == "full", compact=True)
"""


@pytest.mark.parametrize("point", ["dag_gc.after_unlink", "dag_gc.before_swap", "dag_gc.after_swap"])
def test_crash_mid_collection_then_rerun(churned_copy, point):
    tmp_path = churned_copy
    before = snapshot(tmp_path)
    resend(tmp_path, [1], 20)
    env = {**os.environ, "TRACEDAG_FAULT": point}
    r = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), "inc"], env=env, capture_output=True, timeout=120)
    assert r.returncode == 137, r.stderr.decode()[-2000:]
    after = snapshot(tmp_path)
    changed = {row[0] for row in after["traces"]} - {row[0] for row in before["traces"]}
    assert not changed and len(after["dag_nodes"]) == len(before["dag_nodes"])
    # every view but the rebuilt trace t001 (and its scores) is unchanged by the crashed run
    for name in ("dag_nodes", "dag_edges"):
        assert [r for r in after[name] if r[0] != "t001"] == [r for r in before[name] if r[0] != "t001"]
    assert [r for r in after["step_scores"] if r[0] != "t001"] == [r for r in before["step_scores"] if r[0] != "t001"]
    build_store(tmp_path, idle_seconds=0, compact=True)  # the next run (CHILD's, in this process) cleans up
    assert not staging_root(tmp_path).exists()
    for name in ("traces", "dag_nodes", "dag_edges", "step_scores"):
        raw, live = raw_and_live(tmp_path, name)
        assert raw == live, name
    assert len(q(tmp_path, "select * from dag_nodes")) == N_TRACES * SPANS_PER_TRACE


def test_crash_mid_build_leaves_no_orphan_chunk_files(tmp_path):
    seed(tmp_path)
    build_store(tmp_path, idle_seconds=0)
    env = {**os.environ, "TRACEDAG_FAULT": "dag_build.after_dag_nodes"}
    r = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), "full"], env=env, capture_output=True, timeout=120)
    assert r.returncode == 137, r.stderr.decode()[-2000:]
    assert (tmp_path / "state" / "build-inflight").exists()
    assert raw_and_live(tmp_path, "dag_nodes") == (2 * N_TRACES * SPANS_PER_TRACE, N_TRACES * SPANS_PER_TRACE)
    time.sleep(0.01)
    build_store(tmp_path, idle_seconds=0, full=True)
    assert raw_and_live(tmp_path, "dag_nodes") == (N_TRACES * SPANS_PER_TRACE,) * 2
    assert not (tmp_path / "state" / "build-inflight").exists()
    assert all(Path(f).name.startswith("build-") for f in parquet_files(tmp_path, "dag_edges"))
