"""Input preparation: dedupe (trace_id, span_id), sort by (trace_id, start, span_id), index parents.

Ordering is computed on a few narrow columns with Polars; the wide columns are then gathered once
with one Arrow ``take``.
"""

from __future__ import annotations

import logging

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.schemas.spans import SPANS_V1

logger = logging.getLogger(__name__)

INPUT_COLUMNS = [
    "trace_id", "span_id", "parent_span_id", "name", "service_name", "status_code",
    "start_time_unix_nano", "end_time_unix_nano", "received_unix_nano", "batch_id", "links",
    "step_type", "step_name", "conversation_id", "langgraph_node", "langgraph_step", "graph_node_id",
    "graph_node_parent_id", "node_execution_id", "previous_execution_id", "run_id", "scenario_id",
    "replay_index", "variant_id", "service_version", "kind", "tool_call_id", "finish_reason",
]  # fmt: skip

_CARRIED = [
    "trace_id", "span_id", "parent_span_id", "received_unix_nano", "links", "langgraph_step", "langgraph_node",
    "graph_node_id", "graph_node_parent_id", "node_execution_id", "previous_execution_id", "service_version",
    "conversation_id", "run_id", "scenario_id", "replay_index", "variant_id", "tool_call_id", "finish_reason",
]  # fmt: skip


def conform(spans: pa.Table) -> pa.Table:
    """Select the input columns, adding any missing one as nulls of its ``SPANS_V1`` type."""
    cols = []
    for name in INPUT_COLUMNS:
        f = SPANS_V1.field(name)
        cols.append(spans.column(name) if name in spans.column_names else pa.nulls(spans.num_rows, f.type))
    return pa.table(cols, names=INPUT_COLUMNS)


def _order(spans: pa.Table) -> pl.DataFrame:
    """Row, idx, trace_no and parent_idx of each kept span, in final order."""
    narrow = pl.from_arrow(
        spans.select(["trace_id", "span_id", "parent_span_id", "start_time_unix_nano", "received_unix_nano", "batch_id"])
    )
    assert isinstance(narrow, pl.DataFrame)
    df = (
        narrow.with_row_index("row")
        .sort(["received_unix_nano", "batch_id", "row"], descending=True, nulls_last=True)
        .unique(["trace_id", "span_id"], keep="first")
        .with_columns(s=pl.col("start_time_unix_nano").fill_null(0))
        .sort(["trace_id", "s", "span_id"])
        .with_row_index("idx")
        .with_columns(trace_no=(pl.col("trace_id") != pl.col("trace_id").shift()).fill_null(True).cum_sum() - 1)
    )
    parents = df.select("trace_id", pl.col("span_id").alias("parent_span_id"), pl.col("idx").alias("parent_idx"))
    df = df.join(parents, on=["trace_id", "parent_span_id"], how="left", maintain_order="left")
    self_ref = pl.col("parent_span_id") == pl.col("span_id")
    return df.select(
        "row", "idx", "trace_no",
        pl.when(self_ref).then(-1).otherwise(pl.col("parent_idx").fill_null(-1)).cast(pl.Int64).alias("parent_idx"),
    )  # fmt: skip


def _text(col: pa.ChunkedArray) -> pa.ChunkedArray:
    return col.cast(pa.string()) if pa.types.is_dictionary(col.type) else col


# ids that vary between two runs of one operation (uuids, 0x.., long hex runs); numbers are kept
_IDS = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|\b0[xX][0-9a-fA-F]+\b|\b[0-9a-fA-F]{12,}\b"


def _op_names(name: pa.ChunkedArray) -> pa.ChunkedArray:
    """The operation of each span for retries: its name without ids, with the numbers step keys drop."""
    return pc.fill_null(pc.replace_substring_regex(_text(name), _IDS, ""), "")


def prepare_table(spans: pa.Table) -> pa.Table:
    """The ``prep`` table: kept spans in (trace_id, start, span_id) order with idx, trace_no, parent_idx."""
    spans = conform(spans)
    order = _order(spans).to_arrow()
    wide = spans.take(order.column("row"))
    start = pc.fill_null(wide.column("start_time_unix_nano"), 0)
    end = pc.max_element_wise(pc.fill_null(wide.column("end_time_unix_nano"), start), start)
    name = pc.coalesce(wide.column("step_name"), wide.column("langgraph_node"), _text(wide.column("name")),
                       pa.scalar("?"))  # fmt: skip
    cols: dict[str, pa.ChunkedArray | pa.Array] = {
        "idx": order.column("idx").cast(pa.int64()),
        "trace_no": order.column("trace_no").cast(pa.int64()),
        "parent_idx": order.column("parent_idx"),
        "has_parent_ref": pc.is_valid(wide.column("parent_span_id")),
        "s": start,
        "e": end,
        "status_code": pc.fill_null(wide.column("status_code"), 0).cast(pa.int8()),
        "step_type": _text(wide.column("step_type")),
        "step_name": name,
        "op_name": _op_names(wide.column("name")),
        "service_name": _text(wide.column("service_name")),
        "kind": pc.fill_null(wide.column("kind"), 0).cast(pa.int8()),
    }
    for c in _CARRIED:
        cols[c] = wide.column(c)
    return pa.table(cols)
