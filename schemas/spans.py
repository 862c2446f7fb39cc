"""The ``spans`` table: one flat row per span (ClickHouse-exporter shape) plus agent columns.

Base columns come from the OTLP request as it was received. The agent columns after
``attributes`` are filled by normalization (``tracedag.pipeline.normalize.spans``) and are copies:
``attributes`` and ``resource_attributes`` always stay complete.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_KEY = b"tracedag.schema"

_STR = pa.string()
_DICT = pa.dictionary(pa.int32(), pa.string())
_MAP = pa.map_(pa.string(), pa.string())

EVENT = pa.struct(
    [
        pa.field("time_unix_nano", pa.int64()),
        pa.field("name", _STR),
        pa.field("attributes", _MAP),
    ]
)
LINK = pa.struct(
    [
        pa.field("trace_id", _STR),
        pa.field("span_id", _STR),
        pa.field("trace_state", _STR),
        pa.field("attributes", _MAP),
    ]
)

BASE_FIELDS: list[pa.Field] = [
    pa.field("trace_id", _STR, nullable=False),
    pa.field("span_id", _STR, nullable=False),
    pa.field("parent_span_id", _STR),  # null means root, never ""
    pa.field("trace_state", _STR),
    pa.field("name", _DICT),
    pa.field("service_name", _DICT),
    pa.field("scope_name", _DICT),
    pa.field("scope_version", _DICT),
    pa.field("kind", pa.int8()),
    pa.field("status_code", pa.int8()),  # 0 unset, 1 ok, 2 error
    pa.field("status_message", _STR),
    pa.field("start_time_unix_nano", pa.int64()),
    pa.field("end_time_unix_nano", pa.int64()),
    pa.field("duration_ns", pa.int64()),
    pa.field("received_unix_nano", pa.int64(), nullable=False),
    pa.field("batch_id", _STR),  # spool batch (or ingested file) the span came from
    # data-quality flags, e.g. end_before_start, zero_start, duplicate_attribute_key
    pa.field("quality_flags", pa.list_(_STR)),
    pa.field("attributes", _MAP),
    pa.field("resource_attributes", _MAP),
    pa.field("events", pa.list_(EVENT)),
    pa.field("links", pa.list_(LINK)),
    pa.field("dropped_attributes_count", pa.int32()),
    pa.field("dropped_events_count", pa.int32()),
    pa.field("dropped_links_count", pa.int32()),
]

# Filled by normalization; every one is nullable.
AGENT_FIELDS: list[pa.Field] = [
    pa.field("step_type", _DICT),  # llm|tool|agent|chain|retriever|embedding|guardrail|evaluator|other
    pa.field("step_name", _STR),
    pa.field("conversation_id", _STR),
    pa.field("agent_name", _STR),
    pa.field("tool_name", _STR),
    pa.field("tool_call_id", _STR),
    pa.field("model", _STR),
    pa.field("provider", _STR),
    pa.field("input_tokens", pa.int64()),
    pa.field("output_tokens", pa.int64()),
    pa.field("finish_reason", _STR),
    pa.field("error_type", _STR),
    pa.field("input_text", _STR),
    pa.field("output_text", _STR),
    pa.field("text_truncated", pa.bool_()),
    pa.field("langgraph_node", _STR),
    pa.field("langgraph_step", pa.int64()),
    pa.field("langgraph_triggers", _STR),  # JSON list
    pa.field("graph_node_id", _STR),
    pa.field("graph_node_parent_id", _STR),
    pa.field("node_execution_id", _STR),
    pa.field("previous_execution_id", _STR),
    pa.field("run_id", _STR),
    pa.field("scenario_id", _STR),
    pa.field("replay_index", pa.int64()),
    pa.field("variant_id", _STR),
    pa.field("service_version", _STR),
]

SPANS_V1 = pa.schema(BASE_FIELDS + AGENT_FIELDS, metadata={SCHEMA_KEY: b"spans/v1"})
BASE_SCHEMA = pa.schema(BASE_FIELDS)
