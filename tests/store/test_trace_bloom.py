"""#31: a trace's spans are read from the row groups they arrived in, not from every spans row group.

Spans are stored in arrival order (statistics of ``trace_id`` span every id), so each spans file carries a
Bloom filter of ``trace_id`` per row group (``store.parquet.parquet_options``) and DuckDB skips the row
groups whose filter rules the trace out, for a literal, a bound parameter and a join's dynamic filter.
"""

import contextlib
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bench.gen import make_store
from tracedag.pipeline.store.compact import Compactor
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.shared_macros import calls_shared_macros
from tracedag.pipeline.store.views import connect


@pytest.fixture(scope="module")
def spans_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("bloom") / "d"
    make_store(data, 40_000, seed=31)  # through the ingest converter, as the collector stores spans
    return data


def read_groups(data: Path, sql: str, params: dict[str, object], tmp: Path) -> tuple[int, int, int]:
    """(row groups scanned, row groups in the files, rows returned) of the spans scan of ``sql``."""
    con = connect(data, shared_macros=calls_shared_macros(sql))
    out = tmp / "profile.json"
    con.execute("pragma enable_profiling = 'json'")
    con.execute(f"pragma profiling_output = '{out}'")
    rows = len(con.execute(sql, params).fetchall())
    con.close()
    todo, scanned, total = list(json.loads(out.read_text())["operator"]), 0, 0
    while todo:
        node = todo.pop()
        todo += node.get("children", [])
        if node.get("name") == "READ_PARQUET" and "/spans/" in node["extra_info"].get("Filename(s)", ""):
            scanned += node["row_groups_scanned"]
            total += node["total_row_groups_to_scan"]
    return scanned, total, rows


def a_trace(data: Path) -> tuple[str, int]:
    con = connect(data, shared_macros=False)
    try:
        tid, n = con.execute("select trace_id, count(*) from spans_all group by 1 order by 2 desc, 1 limit 1").fetchall()[0]
    finally:
        con.close()
    return str(tid), int(n)


@pytest.mark.parametrize("how", ["literal", "param", "join"])
def test_one_trace_reads_the_row_groups_it_arrived_in(spans_store: Path, tmp_path: Path, how: str) -> None:
    tid, n = a_trace(spans_store)
    sql, params = {
        "literal": (f"select * from spans_all where trace_id = '{tid}'", {}),
        "param": ("select * from spans_all where trace_id = $t", {"t": tid}),
        "join": ("select * from spans_all where trace_id in (select unnest($t))", {"t": [tid]}),
    }[how]
    scanned, total, rows = read_groups(spans_store, sql, params, tmp_path)
    assert rows == n
    assert total >= 8  # the store's files hold many row groups
    assert scanned <= 3, (scanned, total)  # a trace's spans arrive together: one or two groups (+ a false positive)


def test_compacted_spans_keep_the_filter(spans_store: Path, tmp_path: Path) -> None:
    data = tmp_path / "c"
    shutil.copytree(spans_store, data)
    before = parquet_files(data, "spans")
    Compactor(data).run(contextlib.nullcontext, now_unix=4e9)  # every hour closed
    after = parquet_files(data, "spans")
    assert after != before
    for f in after:
        meta = pq.ParquetFile(f).metadata
        column = meta.schema.names.index("trace_id")
        assert all(meta.row_group(g).column(column).bloom_filter_offset for g in range(meta.num_row_groups)), f.name
    tid, n = a_trace(data)
    scanned, total, rows = read_groups(data, "select * from spans_all where trace_id = $t", {"t": tid}, tmp_path)
    assert rows == n and scanned < total

