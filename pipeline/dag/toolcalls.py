"""Tool-call edges: each tool step linked to the LLM step that emitted its call (edge kind ``tool_call``).

The LLM step that wrote a tool call's arguments is upstream of the tool step that ran it, whatever
the nesting (LangGraph runs the tool in another node than the model; an agent may run a guardrail
model call between the two). For each tool step, in this order:

1. **by id**: the LLM step whose output holds the tool's call id (``spans.tool_call_id``: a tool's
   own id; for an LLM step, the ``,``-joined ids of the calls in its output, from
   ``gen_ai.output.messages``, OpenInference ``llm.output_messages.*.tool_calls.*`` or indexed
   ``gen_ai.completion.*.tool_calls.*``): the latest one that started before the tool started, else
   (clock skew) the earliest one;
2. **by containment and order** otherwise (no id, an id no model step emitted such as Google ADK's
   ``<not specified>`` on a tool that raised, or ids from another namespace than the model's):
   under the same agent (nearest ``agent`` ancestor, else the trace), the LLM step that started last
   before the tool started, among those whose output holds a call or whose finish reason, when
   recorded, is a tool call (Google ADK through LiteLLM says ``stop`` after a tool call), leaving
   out a model call that lies wholly inside another one of them (a wrapper's inner call, a guardrail
   running while the model answers). Timing only orders the calls: a tool may start before the
   model call that emitted it ends (a streamed answer, clocks of two hosts), by any amount.

A tool step without such an LLM step (a tool called by code) gets no edge. Pure function of the
``prep`` rows and the repaired call tree; vectorized in DuckDB (an ASOF join per rule).
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.dag.siblings import arrow
from tracedag.pipeline.dag.tree import BoolArray, IntArray

_TOOL_CALL_FINISH = r"tool|function"

# The model calls a tool may hang off by order: may emit a call, not inside another such call of
# the group (cover: the latest end among the calls of the group that start before it, or at the
# same time and end later).
_CANDIDATES = """
cand as (
    select idx, grp, s from (
        select idx, grp, s, e,
               max(e) over (partition by grp order by s, e desc, idx
                            rows between unbounded preceding and 1 preceding) as cover
        from tc
        where step_type = 'llm' and (finish_reason is null or regexp_matches(lower(finish_reason), $finish)
                                     or tool_call_id is not null)
    ) where cover is null or cover < e
)"""

_LINK_SQL = f"""
with {_CANDIDATES}, tool as (
    select idx, trace_no, grp, s, tool_call_id as cid from tc where step_type = 'tool'
), llm_id as (
    select idx, trace_no, s, unnest(string_split(tool_call_id, ',')) as cid
    from tc where step_type = 'llm' and tool_call_id is not null
), before as (
    select t.idx as dst, l.idx as src
    from tool t asof join llm_id l on l.trace_no = t.trace_no and l.cid = t.cid and t.s >= l.s
), skewed as (
    select t.idx as dst, arg_min(l.idx, (l.s, l.idx)) as src
    from tool t join llm_id l on l.trace_no = t.trace_no and l.cid = t.cid
    anti join before b on b.dst = t.idx
    group by t.idx
), by_id as (
    select dst, src from before union all select dst, src from skewed
), rest as (
    select t.* from tool t anti join by_id b on b.dst = t.idx
)
select src, dst from by_id
union all
select l.idx, t.idx from rest t asof join cand l on l.grp = t.grp and t.s >= l.s
"""

# No LLM step of the chunk lists call ids (dialects or stores without them): containment and order
# alone, one ASOF join (the same edges as _LINK_SQL then).
_BY_ORDER_SQL = f"""
with {_CANDIDATES}, tool as (
    select idx, grp, s from tc where step_type = 'tool'
)
select l.idx as src, t.idx as dst from tool t asof join cand l on l.grp = t.grp and t.s >= l.s
"""


def agent_groups(parent: IntArray, by_depth: list[IntArray], is_agent: BoolArray, trace: IntArray) -> IntArray:
    """Per row, the row of its nearest agent ancestor (itself excluded), else ``n + trace number``."""
    n = parent.size
    own = np.full(n, -1, dtype=np.int64)  # nearest agent among the row and its ancestors
    for rows in by_depth:
        up = np.where(parent[rows] >= 0, own[np.maximum(parent[rows], 0)], -1)
        own[rows] = np.where(is_agent[rows], rows, up)
    anc = np.where(parent >= 0, own[np.maximum(parent, 0)], -1)
    return np.where(anc >= 0, anc, n + trace)


def tool_call_edges(
    con: duckdb.DuckDBPyConnection,
    prep: pa.Table,
    group: IntArray,
    eff_s: IntArray,
    eff_e: IntArray,
) -> tuple[IntArray, IntArray]:
    """(LLM row, tool row) pairs: each tool step and the LLM step that emitted its call."""
    step_type = prep.column("step_type")
    tc = pa.table({
        "idx": prep.column("idx"), "trace_no": prep.column("trace_no"), "grp": group, "s": eff_s, "e": eff_e,
        "step_type": step_type, "tool_call_id": prep.column("tool_call_id"),
        "finish_reason": prep.column("finish_reason"),
    })  # fmt: skip
    tc = tc.filter(pc.is_in(step_type, pa.array(["llm", "tool"])))
    if tc.num_rows == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    llm_ids = pc.and_(pc.equal(tc.column("step_type"), "llm"), pc.is_valid(tc.column("tool_call_id")))
    sql = _LINK_SQL if pc.any(llm_ids).as_py() else _BY_ORDER_SQL
    con.register("tc", tc)
    try:
        t = arrow(con, sql, {"finish": _TOOL_CALL_FINISH})
    finally:
        con.unregister("tc")
    src = np.asarray(t.column("src").to_numpy(zero_copy_only=False), dtype=np.int64)
    dst = np.asarray(t.column("dst").to_numpy(zero_copy_only=False), dtype=np.int64)
    order = np.argsort(dst, kind="stable")
    return src[order], dst[order]
