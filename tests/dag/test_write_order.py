"""A reconstruction's tables come out in trace id order, so the build writes them without sorting them again
(``build.by_trace`` returns such a table as it is, and sorts any other stably)."""

import pyarrow as pa

from tests.dag.spanbuild import span, table
from tracedag.pipeline.dag.build import by_trace
from tracedag.pipeline.dag.reconstruct import reconstruct


def _rows():
    rows = []
    for t in ("t9", "t1", "t5"):  # out of order in the input
        rows += [span("r", None, 0, 100, trace_id=t), span("b", "r", 50, 60, trace_id=t),
                 span("a", "r", 10, 20, trace_id=t), span("a2", "a", 11, 19, trace_id=t)]
    return rows


def test_every_table_of_a_reconstruction_is_in_trace_order():
    for out in reconstruct(table(_rows()), "build-x", 1):
        ids = out.column("trace_id").to_pylist()
        assert ids == sorted(ids) and len(set(ids)) == 3
        assert by_trace(out) is out


def test_by_trace_sorts_other_tables_stably():
    t = pa.table({"trace_id": ["b", "a", "b", "a", "c"], "x": [1, 2, 3, 4, 5]})
    assert by_trace(t).to_pydict() == {"trace_id": ["a", "a", "b", "b", "c"], "x": [2, 4, 1, 3, 5]}
    with_null = pa.table({"trace_id": ["a", None, "b"], "x": [1, 2, 3]})
    assert by_trace(with_null).column("x").to_pylist() == [1, 3, 2]  # not taken as sorted
