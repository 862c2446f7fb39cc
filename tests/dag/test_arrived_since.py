"""A build reads only the spans files with spans that arrived since its earliest trace's first arrival
(``chunks.arrived_since``), known from each file's footer, read once per file version."""

import os

from tests.dag.spanbuild import q, span, table
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.dag.chunks import arrived_since
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.schemas.layout import table_dir


def _file(data, name, rows):
    return write_parquet_atomic(table(rows), table_dir(data, "spans"), name)


def test_files_whose_spans_all_arrived_before_are_left_out(tmp_path):
    early = _file(tmp_path, "a", [span("r", None, 0, 9, trace_id="t1", received=10)])
    mixed = _file(tmp_path, "b", [span("r", None, 0, 9, trace_id="t2", received=10),
                                  span("c", "r", 1, 2, trace_id="t2", received=30)])
    late = _file(tmp_path, "c", [span("r", None, 0, 9, trace_id="t3", received=40)])
    files = [early, mixed, late]
    assert arrived_since(files, None) == files
    assert arrived_since(files, 11) == [mixed, late]
    assert arrived_since(files, 30) == [mixed, late]
    assert arrived_since(files, 31) == [late]
    assert arrived_since(files, 41) == []
    gone = tmp_path / "elsewhere.parquet"  # not here (an object store's): kept, the scan reads it
    assert arrived_since([gone, early], 11) == [gone]
    # read once per version: a file written again under its name is read again
    os.utime(early, ns=(1, 1))
    assert arrived_since(files, 11) == [mixed, late]
    _file(tmp_path, "a", [span("r", None, 0, 9, trace_id="t1", received=50)])
    assert arrived_since(files, 41) == [early]


def test_a_late_span_rebuilds_its_trace_whole_when_earlier_files_are_left_out(tmp_path):
    data = tmp_path / "d"
    write_parquet_atomic(table([span("r", None, 0, 100, trace_id="t1", received=1),
                                span("a", "r", 10, 20, trace_id="t1", received=1)]), table_dir(data, "spans"))
    write_parquet_atomic(table([span("r", None, 0, 100, trace_id="t0", received=2)]), table_dir(data, "spans"))
    build_store(data, idle_seconds=0)
    write_parquet_atomic(table([span("b", "r", 30, 40, trace_id="t1", received=3)]), table_dir(data, "spans"))
    assert build_store(data, idle_seconds=0).traces_built == 1
    assert q(data, "select span_count from traces where trace_id = 't1'") == [(3,)]
    assert q(data, "select count(*) from dag_edges where trace_id = 't1' and edge_kind = 'parent'") == [(2,)]


def test_files_of_builds_before_a_bound_are_left_out(tmp_path):
    """``chunks.reaching`` on a string column: a build's derived files by their greatest build id (ids sort by build
    time), as a live round's data edges read them."""
    from tracedag.pipeline.dag.chunks import reaching

    data = tmp_path / "d"
    write_parquet_atomic(table([span("r", None, 0, 9, trace_id="t1", received=1)]), table_dir(data, "spans"))
    first = build_store(data, idle_seconds=0)
    write_parquet_atomic(table([span("r", None, 0, 9, trace_id="t2", received=2)]), table_dir(data, "spans"))
    second = build_store(data, idle_seconds=0, gc=None)
    files = sorted(table_dir(data, "dag_nodes").glob("*.parquet"))
    assert len(files) == 2 and first.build_id < second.build_id
    assert reaching(files, "build_id", "") == files
    assert reaching(files, "build_id", first.build_id) == files
    assert [f.name.startswith(second.build_id) for f in reaching(files, "build_id", second.build_id)] == [True]
    assert reaching(files, "build_id", second.build_id + "~") == []
    assert reaching(files, "no_such_column", "x") == files  # statistics that do not tell: kept
