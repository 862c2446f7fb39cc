"""Agent graphs recorded in the spans (OpenLLMetry ``gen_ai.workflow.nodes`` / ``edges``)."""

from __future__ import annotations

import logging
from pathlib import Path

from tracedag import queries
from tracedag.pipeline.store.views import connect
from tracedag.schemas.agent_graph import AgentGraph, GraphInvalid, from_workflow_attributes

logger = logging.getLogger(__name__)


def graph_from_store(data: Path, name: str | None = None, agent: str | None = None) -> AgentGraph:
    """The most used workflow graph in the store (of ``agent`` when given), as a DSL graph."""
    con = connect(data, shared_macros=False)  # workflow_graphs calls no shared query macro
    try:
        row = con.execute(queries.load("workflow_graphs"), {"agent": agent or ""}).fetchone()
    finally:
        con.close()
    if row is None:
        raise GraphInvalid(str(data), "no span carries gen_ai.workflow.nodes and gen_ai.workflow.edges")
    found_agent, nodes_json, edges_json, spans, _ = row
    logger.info("graph of %s from %d spans", found_agent, spans)
    return from_workflow_attributes(nodes_json, edges_json, name=name or found_agent)
