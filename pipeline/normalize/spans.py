"""Normalization: one agent vocabulary over OTel GenAI, OpenInference and OpenLLMetry spans.

``normalize(base)`` adds the agent columns of ``SPANS_V1`` to a table of ``BASE_SCHEMA`` rows. It
is columnar: the attribute maps are flattened once, the needed keys picked by one hash lookup
per map entry (``normalize_extract``), and every column is computed with Arrow kernels; Python
only touches the JSON payloads of the rows whose readable text comes from JSON
(``normalize_text``). The mapping tables and the dialect priority are in ``normalize_rules``.
Unknown dialects get ``step_type = 'other'`` and the span name without its volatile parts.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.normalize import text
from tracedag.pipeline.normalize.extract import (
    Entries,
    Sparse,
    all_null,
    coalesce,
    first_present,
    key_value,
    map_entries,
    on_dictionary,
    pick,
    pick_sparse,
    regex_field,
    scatter,
    single_chunk,
    to_int,
    true_mask,
    valid_mask,
    with_prefixes,
)
from tracedag.pipeline.normalize.rules import (
    COLUMN_SOURCES,
    NAME_TYPE_FIXES,
    NO_MODEL,
    PRESENCE_HINTS,
    RESOURCE_KEYS,
    RUN_LABELS,
    STEP_TYPE_RULES,
    VOLATILE_PATTERNS,
    span_keys,
)
from tracedag.pipeline.normalize.toolcalls import output_call_ids
from tracedag.schemas.spans import AGENT_FIELDS, SPANS_V1

logger = logging.getLogger(__name__)

Cols = dict[str, pa.Array]
TEXT_SOURCES = ("tool_args", "tool_result", "input_messages", "output_messages", "input_value", "output_value",
                "entity_input", "entity_output")
MESSAGE_PREFIXES = ["llm.input_messages.", "llm.output_messages.", "gen_ai.prompt.", "gen_ai.completion."]
# payload keys: read in place by the text columns, never copied into per-key columns
TEXT_KEYS = list(dict.fromkeys(k for src in TEXT_SOURCES for k in COLUMN_SOURCES[src]))
_NULL = pa.scalar(None, pa.string())
_STRING = r'"(?P<v>(?:[^"\\]|\\.)*)"'


def normalize(base: pa.Table, *, reference: bool = False) -> pa.Table:
    """Return ``base`` (``BASE_SCHEMA`` columns) with the agent columns of ``SPANS_V1`` filled.

    ``reference=True`` reduces the JSON payloads with the straightforward per-row loop (the oracle
    the tests compare the fast path with); the result is the same.
    """
    if base.num_rows == 0:
        for f in AGENT_FIELDS:
            base = base.append_column(f, pa.nulls(0, f.type))
        return base.cast(SPANS_V1)
    cols = agent_columns(base, reference=reference)
    for f in AGENT_FIELDS:
        arr = cols[f.name]
        arr = pc.dictionary_encode(arr) if pa.types.is_dictionary(f.type) else arr.cast(f.type)
        base = base.append_column(f, arr)
    return base.cast(SPANS_V1)


def agent_columns(base: pa.Table, reference: bool = False) -> Cols:
    """Compute every agent column (plain Arrow arrays, step_type not yet dictionary-encoded)."""
    entries = map_entries(base["attributes"])
    a = pick(entries, [k for k in span_keys() if k not in TEXT_KEYS])
    res = pick(map_entries(base["resource_attributes"]), RESOURCE_KEYS)
    name = on_dictionary(base["name"], lambda d: d)
    out: Cols = {"_clean_name": on_dictionary(base["name"], clean_name)}
    out.update(_first_of(a))
    out.update(_langgraph(a, name))
    out.update(_kinds(a, name, out))
    out["error_type"] = _error_type(a, base)
    sparse = pick_sparse(entries, TEXT_KEYS)
    msgs = with_prefixes(entries, MESSAGE_PREFIXES)  # the indexed message families
    out.update(_texts(sparse, entries, text.fill_reference if reference else text.fill, msgs))
    out.update(_event_texts(base["events"], out))
    out["tool_call_id"] = _llm_call_ids(out, sparse, entries, msgs)
    out.update(_labels(a, res))
    out["conversation_id"] = inherit_by_trace(base, out["conversation_id"])
    return out


def _first_of(a: Cols) -> Cols:
    """Columns that are the first non-empty of their attribute sources."""
    names = ["conversation_id", "agent_name", "tool_name", "tool_call_id", "provider", "graph_node_id",
             "graph_node_parent_id", "previous_execution_id", "graph_node_name", "entity_name"]
    out = {c: coalesce(*(a[k] for k in COLUMN_SOURCES[c])) for c in names}
    models = [pc.if_else(pc.is_in(a[k], pa.array(NO_MODEL)), _NULL, a[k]) for k in COLUMN_SOURCES["model"]
              if not all_null(a[k])] or [a[COLUMN_SOURCES["model"][0]]]
    out["model"] = coalesce(*models)
    for c in ("input_tokens", "output_tokens"):
        out[c] = pc.coalesce(*(to_int(a[k]) for k in COLUMN_SOURCES[c]))
    finish = coalesce(*(a[k] for k in COLUMN_SOURCES["finish_reason"]))
    listed = regex_field(finish, r'^\[\s*"(?P<v>[^"]*)"')
    out["finish_reason"] = coalesce(pc.if_else(pc.starts_with(finish, "["), listed, finish))
    return out


def _langgraph(a: Cols, name: pa.Array) -> Cols:
    """LangGraph step metadata from OpenInference ``metadata`` JSON or OpenLLMetry association properties."""
    meta = a["metadata"]
    node = coalesce(a[COLUMN_SOURCES["lg_node"][0]], key_value(meta, "langgraph_node", _STRING))
    step = coalesce(a[COLUMN_SOURCES["lg_step"][0]], key_value(meta, "langgraph_step", r"(?P<v>-?\d+)"))
    trig = coalesce(a[COLUMN_SOURCES["lg_triggers"][0]], key_value(meta, "langgraph_triggers", r"(?P<v>\[[^\]]*\])"))
    trig = pc.replace_substring_regex(trig, r'"\s*,\s*"', '","')
    ns = coalesce(a[COLUMN_SOURCES["lg_checkpoint_ns"][0]], key_value(meta, "langgraph_checkpoint_ns", _STRING))
    task_id = regex_field(ns, r":(?P<v>[^:|]*)$")
    entity = coalesce(*(a[k] for k in COLUMN_SOURCES["entity_name"]))
    is_node = pc.or_(pc.fill_null(pc.equal(node, name), False), pc.fill_null(pc.equal(node, entity), False))
    exec_id = coalesce(a["gen_ai.node.execution.id"], pc.if_else(is_node, task_id, _NULL))
    return {"langgraph_node": node, "langgraph_step": to_int(step), "langgraph_triggers": trig,
            "node_execution_id": exec_id, "_is_node": is_node}


def _kinds(a: Cols, name: pa.Array, got: Cols) -> Cols:
    """step_type, step_name and the agent_name correction for the LangGraph graph run."""
    step_type = _step_type(a)
    oi_kind = pc.utf8_upper(a["openinference.span.kind"])
    in_graph = pc.is_valid(got["langgraph_node"])
    # OpenInference types any LangChain run whose *name* contains "agent" as AGENT.
    by_name = pc.and_(pc.and_(pc.equal(oi_kind, "AGENT"), in_graph), pc.is_null(a["gen_ai.operation.name"]))
    step_type = pc.if_else(pc.fill_null(by_name, False), "chain", step_type)
    graph_run = pc.and_(pc.and_(pc.is_valid(oi_kind), pc.invert(in_graph)),
                        pc.match_substring(a["metadata"], '"ls_integration": "langgraph"'))
    graph_run = pc.fill_null(graph_run, False)
    step_type = pc.if_else(graph_run, "agent", step_type)
    step_type = _fix_by_name(step_type, name)
    agent_name = coalesce(got["agent_name"], pc.if_else(graph_run, name, _NULL))
    node_name = pc.if_else(got["_is_node"], got["langgraph_node"], _NULL)
    # agent_name names the step only on the agent's own span: traceloop writes gen_ai.agent.name on
    # every span inside an @agent (its tasks, tools and LLM calls), which have names of their own.
    own_agent = pc.if_else(pc.equal(step_type, "agent"), agent_name, _NULL)
    step_name = coalesce(node_name, got["tool_name"], own_agent, got["graph_node_name"], got["entity_name"],
                         got["_clean_name"])
    return {"step_type": step_type, "step_name": step_name, "agent_name": agent_name}


def _fix_by_name(step_type: pa.Array, name: pa.Array) -> pa.Array:
    """Apply ``NAME_TYPE_FIXES``: a span of a listed name typed ``wrong`` becomes ``right``."""
    for pattern, wrong, right, _ in NAME_TYPE_FIXES:
        hit = pc.and_(pc.equal(step_type, wrong), pc.match_substring_regex(name, pattern))
        step_type = pc.if_else(pc.fill_null(hit, False), right, step_type)
    return step_type


def _step_type(a: Cols) -> pa.Array:
    """Apply ``STEP_TYPE_RULES`` then ``PRESENCE_HINTS`` in priority order; default ``other``."""
    found: list[pa.Array] = []
    for attr, table in STEP_TYPE_RULES:
        if all_null(a[attr]):
            continue
        keys = pa.array(list(table), pa.string())
        idx = pc.index_in(pc.utf8_lower(a[attr]), value_set=keys)
        found.append(pa.array(list(table.values()), pa.string()).take(idx))
    for kind, attrs in PRESENCE_HINTS:
        hint = coalesce(*(a[k] for k in attrs))
        if all_null(hint):
            continue
        present = pc.is_valid(hint)
        found.append(pc.if_else(present, kind, _NULL))
    if not found:
        found.append(pa.nulls(len(a[STEP_TYPE_RULES[0][0]]), pa.string()))
    return pc.coalesce(*found, pa.scalar("other"))


def clean_name(names: pa.Array) -> pa.Array:
    """Span names without volatile parts (uuids, hex ids, numbers), whitespace collapsed."""
    out = names
    for pat in VOLATILE_PATTERNS[:-1]:
        out = pc.replace_substring_regex(out, pat, "")
    out = pc.replace_substring_regex(out, VOLATILE_PATTERNS[-1], r"\1")
    out = pc.replace_substring_regex(out, r"\s+", " ")
    out = pc.utf8_trim(out, " -_:/#.")
    return pc.if_else(pc.equal(out, ""), names, out)


def _error_type(a: Cols, base: pa.Table) -> pa.Array:
    """``error.type`` (a class repr ``<class 'x.Y'>`` becomes ``x.Y``), else the exception event's type on ERROR."""
    failed = pc.equal(single_chunk(base["status_code"]), 2)
    exc = pc.if_else(pc.fill_null(failed, False), exception_types(base["events"]), _NULL)
    err = coalesce(a["error.type"], exc)
    repr_name = regex_field(err, r"^<class '(?P<v>[^']+)'>$")
    return pc.coalesce(repr_name, err)


def exception_types(events: pa.ChunkedArray) -> pa.Array:
    """Per span, ``exception.type`` of its last ``exception`` event (null when none)."""
    return event_attribute(events, "exception", "exception.type")


def event_attribute(events: pa.ChunkedArray, event: str, key: str) -> pa.Array:
    """Per span, attribute ``key`` of its last event named ``event`` (null when none)."""
    ev = single_chunk(events)
    offsets = np.asarray(ev.offsets, dtype=np.int64)
    start, stop = int(offsets[0]), int(offsets[-1])
    flat = ev.values.slice(start, stop - start)
    rows = np.repeat(np.arange(len(ev), dtype=np.int64), np.diff(offsets))
    hit = true_mask(pc.equal(flat.field("name"), event))
    if not hit.any():
        return pa.nulls(len(ev), pa.string())
    attrs = flat.field("attributes").filter(pa.array(hit))
    values = pc.map_lookup(attrs, key, "last")
    return scatter(values, rows[hit], len(ev))


def _event_texts(events: pa.ChunkedArray, out: Cols) -> Cols:
    """Texts only the deprecated per-message GenAI events carry (Strands' tool spans): a tool step's
    arguments (``gen_ai.tool.message`` ``content``) and result (``gen_ai.choice`` ``message``, a list of
    content blocks whose texts are joined), where no attribute gave them."""
    tool = pc.fill_null(pc.equal(out["step_type"], "tool"), False)
    args = pc.if_else(tool, event_attribute(events, "gen_ai.tool.message", "content"), _NULL)
    result = pc.if_else(tool, event_attribute(events, "gen_ai.choice", "message"), _NULL)
    result = text.reduce_column(result, _block_texts)
    input_text, cut_in = text.cap(coalesce(out["input_text"], args))
    output_text, cut_out = text.cap(coalesce(out["output_text"], result))
    return {"input_text": input_text, "output_text": output_text,
            "text_truncated": pc.or_(out["text_truncated"], pc.or_(cut_in, cut_out))}


def _block_texts(value: str, loads: text.Loads = json.loads) -> str | None:
    """The joined texts of a list of content blocks ``[{"text": ...}, ...]``; other values as they are."""
    try:
        doc = loads(value)
    except ValueError:
        return value
    if isinstance(doc, list) and doc and all(isinstance(b, dict) and isinstance(b.get("text"), str) for b in doc):
        return "\n".join(b["text"] for b in doc)
    return value


def _llm_call_ids(out: Cols, sp: dict[str, Sparse], entries: Entries, msgs: Entries) -> pa.Array:
    """``tool_call_id``: a tool step's own call id; for an LLM step, the ids of the calls its output holds."""
    key = COLUMN_SOURCES["output_messages"][0]
    ids = output_call_ids(sp[key], entries.values, msgs)
    if all_null(ids):
        return out["tool_call_id"]
    llm = pc.fill_null(pc.equal(out["step_type"], "llm"), False)
    return coalesce(out["tool_call_id"], pc.if_else(llm, ids, _NULL))


def _texts(sp: dict[str, Sparse], entries: Entries, fill_with: text.Filler, msgs: Entries) -> Cols:
    """input_text / output_text in source priority order, capped, with the truncation flag."""
    src = {k: first_present(*(sp[x] for x in COLUMN_SOURCES[k])) for k in TEXT_SOURCES}
    inp, out = text.Assembly(entries.n), text.Assembly(entries.n)
    fill_with(inp, src["tool_args"], entries.values, text.readable)
    fill_with(inp, src["input_messages"], entries.values, text.genai_input)
    inp.coalesce(text.last_user_message(msgs, "llm.input_messages.", "message\\.role|message\\.content",
                                        "message.role", "message.content"))
    inp.coalesce(text.last_user_message(msgs, "gen_ai.prompt.", "role|content", "role", "content"))
    fill_with(inp, src["input_value"], entries.values, text.readable)
    fill_with(inp, src["entity_input"], entries.values, text.readable)
    fill_with(out, src["tool_result"], entries.values, text.readable)
    fill_with(out, src["output_messages"], entries.values, text.genai_output)
    out.coalesce(text.last_message(msgs, "llm.output_messages.", "message\\.content", "message.content"))
    out.coalesce(text.llm_output_calls(msgs))
    out.coalesce(text.last_message(msgs, "gen_ai.completion.", "content", "content"))
    fill_with(out, src["output_value"], entries.values, text.readable)
    fill_with(out, src["entity_output"], entries.values, text.readable)
    input_text, cut_in = text.cap(coalesce(inp.column()))  # an empty text is kept from later sources, then null
    output_text, cut_out = text.cap(coalesce(out.column()))
    return {"input_text": input_text, "output_text": output_text, "text_truncated": pc.or_(cut_in, cut_out)}


def _labels(a: Cols, res: Cols) -> Cols:
    """Run labels (span attribute, else resource attribute) and ``service.version``."""
    out = {col: coalesce(a[key], res[key]) for col, key in RUN_LABELS.items()}
    out["replay_index"] = to_int(out["replay_index"])
    out["service_version"] = coalesce(res["service.version"])
    return out


def inherit_by_trace(base: pa.Table, conv: pa.Array) -> pa.Array:
    """Fill null ``conversation_id`` from the earliest span of the same trace (in this batch) that has one.

    Ties on the start time go to the earlier row.
    """
    has = valid_mask(conv)
    if has.all() or not has.any():
        return conv
    codes = np.asarray(pc.dictionary_encode(single_chunk(base["trace_id"])).indices, dtype=np.int64)
    start = np.asarray(single_chunk(base["start_time_unix_nano"]), dtype=np.int64)
    rows = np.flatnonzero(has)
    order = rows[np.lexsort((start[rows], codes[rows]))]  # stable: by trace, then start, then row
    first = np.ones(len(order), dtype=bool)
    first[1:] = codes[order][1:] != codes[order][:-1]
    source = np.full(int(codes.max()) + 1, -1, dtype=np.int64)
    source[codes[order][first]] = order[first]
    take = source[codes]
    return pc.coalesce(conv, conv.take(pa.array(take, mask=take < 0)))
