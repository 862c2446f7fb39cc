"""Workflow specs for ``tracedag build --spec``: an agent graph (the DSL) read as allowed dependencies.

A spec is an agent-graph file (``tracedag.schemas.agent_graph``, JSON or YAML): its nodes are the
spec nodes, its edges the allowed dependencies (upstream -> downstream), ``required`` the nodes
every trace must contain. A node matches the steps named like it (``step_name``), or those its
``match`` names (``{"step_type": ..., "step_name": ...}``, both exact)::

    {"nodes": [{"name": "classify"}, {"name": "agent"}, {"name": "tools", "match": {"step_type": "tool"}}],
     "edges": [{"source": "classify", "target": "agent"}, {"source": "agent", "target": "tools"},
               {"source": "tools", "target": "agent"}],
     "start": "classify", "terminals": ["agent"], "required": ["classify", "agent"]}

Each DAG node is mapped to the first spec node whose rule matches (``dag_nodes.spec_node``). A trace
is deviant when a sequence/explicit edge joins two mapped nodes whose pair is not allowed, or a
required spec node never ran; ``traces.deviation_reason`` says which.

The retired workflow-spec format (``nodes`` as a mapping of match rules, ``edges`` as pairs) is
still read: it is converted to the DSL with a warning, and the converted file is written beside
it (``<name>.graph.json``) when it is not there yet.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracedag.schemas.agent_graph import AgentGraph, GraphInvalid, parse_graph
from tracedag.schemas.errors import TracedagError

logger = logging.getLogger(__name__)

MAX_REASONS = 3


class BadSpec(TracedagError):  # type: ignore[misc,unused-ignore]
    """A workflow spec file could not be read or is malformed."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"workflow spec {path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class WorkflowSpec:
    """Spec nodes with their match rules, allowed (upstream, downstream) pairs and required nodes."""

    nodes: tuple[tuple[str, str | None, str | None], ...]  # (spec node, step_type, step_name)
    allowed: frozenset[tuple[str, str]]
    required: tuple[str, ...] = ()
    roles: tuple[tuple[str, str], ...] = ()  # (spec node, AgentEval step role): dag_nodes.step_role

    def match(self, step_type: str | None, step_name: str | None) -> str | None:
        """Return the spec node of a step, or None."""
        for name, want_type, want_name in self.nodes:
            if (want_type is None or want_type == step_type) and (want_name is None or want_name == step_name):
                return name
        return None

    def deviation(self, spec_nodes: set[str], pairs: set[tuple[str, str]]) -> str | None:
        """Reason a trace leaves the spec (given its mapped nodes and mapped edges), or None."""
        reasons = [f"{a} -> {b} not allowed" for a, b in sorted(pairs - self.allowed)]
        reasons += [f"required {r} missing" for r in self.required if r not in spec_nodes]
        if not reasons:
            return None
        more = len(reasons) - MAX_REASONS
        return "; ".join(reasons[:MAX_REASONS]) + (f"; and {more} more" if more > 0 else "")


def spec_from_graph(graph: AgentGraph) -> WorkflowSpec:
    """The workflow spec an agent graph describes."""
    nodes = tuple(
        (n.name, n.match_type, n.match_name if (n.match_type or n.match_name) else n.name) for n in graph.nodes
    )
    roles = tuple((n.name, n.role) for n in graph.nodes if n.role)
    return WorkflowSpec(nodes, frozenset((e.source, e.target) for e in graph.edges), graph.required, roles)


def parse_spec(doc: Any, origin: str = "<spec>") -> WorkflowSpec:
    """Build a ``WorkflowSpec`` from a parsed agent-graph document (or a retired workflow spec)."""
    if isinstance(doc, dict) and isinstance(doc.get("nodes"), dict):
        doc = graph_from_legacy(doc, origin)
    try:
        return spec_from_graph(parse_graph(doc))
    except GraphInvalid as e:
        raise BadSpec(origin, str(e)) from e


def graph_from_legacy(doc: dict[str, Any], origin: str = "<spec>") -> dict[str, Any]:
    """Convert a retired workflow spec (``nodes`` mapping, ``edges`` pairs) to the agent-graph DSL."""
    nodes: list[dict[str, Any]] = []
    for name, rule in doc["nodes"].items():
        rule = rule or {}
        if not isinstance(rule, dict) or not (set(rule) <= {"step_type", "step_name"}):
            raise BadSpec(origin, f"node {name}: rule must use step_type and/or step_name")
        node: dict[str, Any] = {"name": str(name)}
        if rule and rule != {"step_name": str(name)}:
            node["match"] = {k: str(v) for k, v in rule.items()}
        nodes.append(node)
    known = [n["name"] for n in nodes]
    edges = []
    for edge in doc.get("edges") or []:
        if not (isinstance(edge, list | tuple) and len(edge) == 2 and set(map(str, edge)) <= set(known)):
            raise BadSpec(origin, f"edge {edge!r}: expected [upstream, downstream] spec nodes")
        edges.append({"source": str(edge[0]), "target": str(edge[1])})
    targets, sources = {e["target"] for e in edges}, {e["source"] for e in edges}
    out: dict[str, Any] = {
        "version": 1, "nodes": nodes, "edges": edges,
        "start": [n for n in known if n not in targets] or known[:1],
        "terminals": [n for n in known if n not in sources] or known[-1:],
    }
    if doc.get("required"):
        out["required"] = [str(r) for r in doc["required"]]
    return out


def load_spec(path: Path) -> WorkflowSpec:
    """Read a workflow spec from an agent-graph file (JSON or YAML); convert a retired one once."""
    import yaml  # here: ``tracedag build`` without --spec does without it (~20 ms CPU)

    try:
        text = path.read_text(encoding="utf-8")
        doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise BadSpec(str(path), str(e)) from e
    if isinstance(doc, dict) and isinstance(doc.get("nodes"), dict):
        doc = _convert_legacy_file(path, doc)
    return parse_spec(doc, str(path))


def _convert_legacy_file(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    graph = graph_from_legacy(doc, str(path))
    target = path.with_name(f"{path.stem}.graph.json")
    note = f"use {target} from now on"
    if not target.exists():
        try:
            target.write_text(json.dumps(graph, indent=2) + "\n", encoding="utf-8")
        except OSError as e:
            note = f"could not write {target} ({e.strerror}); the agent-graph form is:\n{json.dumps(graph)}"
    logger.warning(
        "workflow spec %s uses the retired workflow-spec format (nodes as a mapping); it was read as the "
        "agent-graph DSL, the one format for agent graphs and workflow specs: %s", path, note,
    )
    return graph
