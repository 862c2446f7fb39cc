"""AgentEval step roles beside the OTel step types: ``dag_nodes.step_role``.

One of PLAN, TOOLSEL, PARAMGEN, EXEC, SYNTH (``schemas.agent_graph.STEP_ROLES``) or null, first rule
that applies:

1. a workflow spec node with a ``role`` gives it to the steps it matches (``--spec``);
2. tool, retriever and embedding steps EXECute;
3. an LLM step that emitted tool calls (a ``tool_call`` edge leaves it, or its finish reason is a
   tool call) generated their parameters: PARAMGEN (with function calling the same output also
   selects the tool; a step that selects without writing arguments is a router, rule 5);
4. another LLM step PLANs when a model or tool step of the same agent starts after it, else it
   SYNThesizes the answer (the last model call of its agent);
5. other steps (chains, agents, graph nodes) by name: a router / selector / classifier TOOLSELects,
   a planner PLANs, a writer / summarizer / responder SYNThesizes, a tool node EXECutes; else null.

Rubrics and metrics can then be read per role (``group by step_role``), as AgentEval reports them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.dag.graph import Graph
from tracedag.pipeline.dag.spec import WorkflowSpec

EXEC_TYPES = ("tool", "retriever", "embedding")
# (RE2 pattern over the lower-case step name, role) for steps that are not model or tool calls
NAME_ROLES = (
    (r"rout|select|classif|choos|dispatch|triage|pick_tool", "TOOLSEL"),
    (r"plan", "PLAN"),
    (r"synth|summar|answer|respon|final|report|writ|compose", "SYNTH"),
    (r"^tools?$|tool_?node|execut", "EXEC"),
)
_TOOL_CALL_FINISH = r"tool|function"


def step_roles(prep: pa.Table, g: Graph, spec_nodes: pa.Array, spec: WorkflowSpec | None) -> pa.Array:
    """The ``step_role`` of every row of ``prep``."""
    n = prep.num_rows
    step_type = prep.column("step_type")
    role = np.full(n, None, dtype=object)
    _by_name(role, prep.column("step_name"))
    role[_mask(pc.is_in(step_type, pa.array(EXEC_TYPES)))] = "EXEC"
    llm = _mask(pc.equal(step_type, "llm"))
    emits = np.zeros(n, dtype=np.bool_)
    emits[g.tc_src] = True
    emits |= _mask(pc.match_substring_regex(pc.utf8_lower(prep.column("finish_reason")), _TOOL_CALL_FINISH))
    acts = llm | _mask(pc.equal(step_type, "tool"))
    last = np.full(int(g.agent_group.max()) + 1 if n else 1, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last, g.agent_group[acts], g.eff_s[acts])
    later = g.eff_s < last[g.agent_group]
    role[llm & emits] = "PARAMGEN"
    role[llm & ~emits & later] = "PLAN"
    role[llm & ~emits & ~later] = "SYNTH"
    if spec is not None and spec.roles:
        given = dict(spec.roles)
        for i, node in enumerate(spec_nodes.to_pylist()):
            if node in given:
                role[i] = given[node]
    return pa.array(role, pa.string())


def _mask(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=np.bool_)


def _by_name(role: np.ndarray, names: pa.ChunkedArray) -> None:
    """Rule 5 on every row (later rules overwrite the rows they cover), once per distinct name."""
    encoded = pc.dictionary_encode(names).combine_chunks()
    lower = pc.utf8_lower(encoded.dictionary)
    found = np.full(len(lower), None, dtype=object)
    for pattern, name in reversed(NAME_ROLES):  # the first pattern listed wins
        found[_mask(pc.match_substring_regex(lower, pattern))] = name
    codes = np.asarray(pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    if len(found):
        role[:] = found[codes]
