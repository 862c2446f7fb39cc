"""The SQL reference page's column reference is the generated one, documents every column, and matches real files."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from bench.gen import make_store
from tests.collector.collector_support import make_request, make_span
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.ingest.direct import ingest_requests
from tracedag.pipeline.score import score_store
from tracedag.pipeline.store import reference
from tracedag.pipeline.store.files import TABLES, parquet_files
from tracedag.pipeline.store.views import SCHEMAS, connect
from tracedag.schemas.columns import COLUMNS

SQL_PAGE = Path(__file__).resolve().parents[2] / "docs" / "pages" / "sql.md"


def test_the_sql_page_holds_the_generated_reference() -> None:
    text = SQL_PAGE.read_text(encoding="utf-8")
    start, end = text.index(reference.BEGIN), text.index(reference.END) + len(reference.END)
    assert text[start:end] == reference.render(), "docs/pages/sql.md drifted: python -m tracedag.pipeline.store.reference"


def test_every_column_of_every_table_has_one_line_of_meaning() -> None:
    assert set(COLUMNS) == set(TABLES)
    for table, schema in SCHEMAS.items():
        assert list(COLUMNS[table]) == schema.names, table  # same columns, same order
        assert all(COLUMNS[table].values()), table


def _evaluated_span() -> ExportTraceServiceRequest:
    span = make_span(0, trace=bytes([5] * 16))
    event = span.events.add(name="gen_ai.evaluation.result", time_unix_nano=span.end_time_unix_nano)
    for key, value in (("gen_ai.evaluation.name", AnyValue(string_value="relevance")),
                       ("gen_ai.evaluation.score.value", AnyValue(double_value=0.9))):
        event.attributes.add(key=key, value=value)
    return make_request([span])


@pytest.fixture(scope="module")
def real_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("reference") / "d"
    make_store(data, 1500, seed=9)
    ingest_requests(data, [_evaluated_span()], time.time_ns())
    build_store(data, idle_seconds=0)
    score_store(data)
    return data


@pytest.mark.parametrize("table", ["spans", "evaluations", "traces", "dag_nodes", "dag_edges", "step_scores"])
def test_the_documented_columns_are_those_of_the_real_files(real_store: Path, table: str) -> None:
    files = parquet_files(real_store, table)
    assert files, f"the pipeline wrote no {table} file"
    for f in files:
        assert pq.read_schema(f).names == list(COLUMNS[table]), f
    con = connect(real_store)
    try:
        documented = [line for line in reference._view_section(con, table) if line.startswith("| `")]
    finally:
        con.close()
    assert "\n".join(documented) in SQL_PAGE.read_text(encoding="utf-8")
