"""The agent-graph DSL: the one format for the designed graph of an agent and for workflow specs.

Format (JSON Schema in ``schemas/agent_graph.schema.json``)::

    {"version": 1, "name": "recruiter",
     "nodes": [{"name": "router", "intents": ["greeting"]}, {"name": "faq"}, {"name": "end"}],
     "edges": [{"source": "router", "target": "faq", "condition": "asks a question"},
               {"source": "faq", "target": "end"}],
     "start": "router",            # or a list of entry nodes
     "terminals": ["end"]}

Validation raises ``GraphInvalid`` naming the bad node or edge. Importers build the same
structure from LangGraph's ``graph.get_graph().to_json()`` and from OpenLLMetry's
``gen_ai.workflow.nodes`` / ``gen_ai.workflow.edges`` span attributes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracedag.schemas.errors import TracedagError

logger = logging.getLogger(__name__)

LANGGRAPH_START = "__start__"
LANGGRAPH_END = "__end__"
_TOP_KEYS = {"version", "name", "description", "nodes", "edges", "start", "terminals", "required"}
_NODE_KEYS = {"name", "id", "description", "intents", "match", "role"}
STEP_ROLES = ("PLAN", "TOOLSEL", "PARAMGEN", "EXEC", "SYNTH")
"""AgentEval step roles (``dag_nodes.step_role``); a node's ``role`` gives its steps one of them."""
_MATCH_KEYS = {"step_type", "step_name"}
_EDGE_KEYS = {"source", "target", "condition"}


class GraphInvalid(TracedagError):  # type: ignore[misc,unused-ignore]
    """An agent graph does not follow the DSL; ``where`` names the bad node or edge."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"agent graph: {where}: {reason}")
        self.where = where
        self.reason = reason


@dataclass(frozen=True)
class Node:
    """One node of the agent graph."""

    name: str
    description: str | None = None
    intents: tuple[str, ...] = ()
    match_type: str | None = None  # as a workflow spec: the steps this node stands for (default: by name)
    match_name: str | None = None
    role: str | None = None  # as a workflow spec: the AgentEval role of the steps it stands for


@dataclass(frozen=True)
class Edge:
    """An allowed transition ``source -> target``, with an optional condition text."""

    source: str
    target: str
    condition: str | None = None


@dataclass(frozen=True)
class AgentGraph:
    """A validated agent graph."""

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    start: tuple[str, ...]
    terminals: tuple[str, ...]
    name: str | None = None
    description: str | None = None
    required: tuple[str, ...] = ()  # as a workflow spec: nodes every trace must contain
    _succ: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def node_names(self) -> list[str]:
        """Node names in declaration order."""
        return [n.name for n in self.nodes]

    def successors(self, node: str) -> tuple[str, ...]:
        """Targets of the edges leaving ``node``, in declaration order, without duplicates."""
        if not self._succ:
            succ: dict[str, list[str]] = {n.name: [] for n in self.nodes}
            for e in self.edges:
                if e.target not in succ[e.source]:
                    succ[e.source].append(e.target)
            self._succ.update({k: tuple(v) for k, v in succ.items()})
        return self._succ.get(node, ())

    def allows(self, source: str, target: str) -> bool:
        """True when the edge ``source -> target`` is declared."""
        return target in self.successors(source)

    def to_dict(self) -> dict[str, Any]:
        """The DSL JSON object of this graph."""
        out: dict[str, Any] = {"version": 1}
        if self.name:
            out["name"] = self.name
        if self.description:
            out["description"] = self.description
        out["nodes"] = [_node_dict(n) for n in self.nodes]
        out["edges"] = [_edge_dict(e) for e in self.edges]
        out["start"] = self.start[0] if len(self.start) == 1 else list(self.start)
        out["terminals"] = list(self.terminals)
        if self.required:
            out["required"] = list(self.required)
        return out


def graph_for(graphs: Sequence[AgentGraph], agent: str) -> AgentGraph | None:
    """The graph of ``agent``: the one named like it, else the only graph given, else None."""
    for g in graphs:
        if g.name == agent:
            return g
    return graphs[0] if len(graphs) == 1 else None


def _node_dict(n: Node) -> dict[str, Any]:
    d: dict[str, Any] = {"name": n.name}
    if n.description:
        d["description"] = n.description
    if n.intents:
        d["intents"] = list(n.intents)
    match = {k: v for k, v in (("step_type", n.match_type), ("step_name", n.match_name)) if v}
    if match:
        d["match"] = match
    if n.role:
        d["role"] = n.role
    return d


def _edge_dict(e: Edge) -> dict[str, Any]:
    d: dict[str, Any] = {"source": e.source, "target": e.target}
    if e.condition:
        d["condition"] = e.condition
    return d


def _require_str(value: object, where: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise GraphInvalid(where, f"{what} must be a non-empty string, got {value!r}")
    return value


def _extra_keys(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise GraphInvalid(where, f"unknown key(s) {', '.join(extra)}")


def _parse_node(raw: object, index: int) -> Node:
    where = f"nodes[{index}]"
    if not isinstance(raw, dict):
        raise GraphInvalid(where, "must be an object with a name")
    name = _require_str(raw.get("name", raw.get("id")), where, "name")
    where = f"node {name!r}"
    _extra_keys(raw, _NODE_KEYS, where)
    intents = raw.get("intents", [])
    if not isinstance(intents, list) or not all(isinstance(i, str) for i in intents):
        raise GraphInvalid(where, "intents must be a list of strings")
    desc = raw.get("description")
    if desc is not None and not isinstance(desc, str):
        raise GraphInvalid(where, "description must be a string")
    match_type, match_name = _parse_match(raw.get("match"), where)
    role = raw.get("role")
    if role is not None and role not in STEP_ROLES:
        raise GraphInvalid(where, f"role must be one of {', '.join(STEP_ROLES)}, got {role!r}")
    return Node(name, desc, tuple(intents), match_type, match_name, role)


def _parse_match(raw: object, where: str) -> tuple[str | None, str | None]:
    if raw is None:
        return None, None
    if not isinstance(raw, dict) or not raw or not set(raw) <= _MATCH_KEYS:
        raise GraphInvalid(where, "match must be an object with step_type and/or step_name")
    values = [raw.get(k) for k in ("step_type", "step_name")]
    for v in values:
        if v is not None and (not isinstance(v, str) or not v):
            raise GraphInvalid(where, "match values must be non-empty strings")
    return values[0], values[1]


def _parse_nodes(raw: object) -> tuple[Node, ...]:
    if not isinstance(raw, list) or not raw:
        raise GraphInvalid("nodes", "must be a non-empty list")
    nodes = tuple(_parse_node(r, i) for i, r in enumerate(raw))
    seen: set[str] = set()
    for n in nodes:
        if n.name in seen:
            raise GraphInvalid(f"node {n.name!r}", "declared twice")
        seen.add(n.name)
    return nodes


def _parse_edge(raw: object, index: int, names: set[str]) -> Edge:
    where = f"edges[{index}]"
    if not isinstance(raw, dict):
        raise GraphInvalid(where, "must be an object with source and target")
    src = _require_str(raw.get("source"), where, "source")
    dst = _require_str(raw.get("target"), where, "target")
    where = f"edge {src!r} -> {dst!r}"
    _extra_keys(raw, _EDGE_KEYS, where)
    for end in (src, dst):
        if end not in names:
            raise GraphInvalid(where, f"unknown node {end!r}")
    cond = raw.get("condition")
    if cond is not None and not isinstance(cond, str):
        raise GraphInvalid(where, "condition must be a string")
    return Edge(src, dst, cond)


def _parse_refs(raw: object, key: str, names: set[str]) -> tuple[str, ...]:
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        raise GraphInvalid(key, "must name at least one node")
    out = tuple(_require_str(x, key, "node name") for x in items)
    for name in out:
        if name not in names:
            raise GraphInvalid(key, f"unknown node {name!r}")
    return out


def parse_graph(raw: object) -> AgentGraph:
    """Validate a DSL JSON object and return the graph; ``GraphInvalid`` names what is wrong."""
    if not isinstance(raw, dict):
        raise GraphInvalid("graph", "must be a JSON object")
    _extra_keys(raw, _TOP_KEYS, "graph")
    for key in ("nodes", "edges", "start", "terminals"):
        if key not in raw:
            raise GraphInvalid("graph", f"missing {key!r}")
    if raw.get("version", 1) != 1:
        raise GraphInvalid("version", f"unsupported version {raw.get('version')!r}")
    nodes = _parse_nodes(raw["nodes"])
    names = {n.name for n in nodes}
    if not isinstance(raw["edges"], list):
        raise GraphInvalid("edges", "must be a list")
    edges = tuple(_parse_edge(e, i, names) for i, e in enumerate(raw["edges"]))
    start = _parse_refs(raw["start"], "start", names)
    terminals = _parse_refs(raw["terminals"], "terminals", names)
    required = _parse_refs(raw["required"], "required", names) if raw.get("required") else ()
    name, desc = raw.get("name"), raw.get("description")
    return AgentGraph(
        nodes, edges, start, terminals, name if isinstance(name, str) else None,
        desc if isinstance(desc, str) else None, required,
    )


def load_graph(path: Path) -> AgentGraph:
    """Read and validate a DSL JSON file."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise GraphInvalid(str(path), f"cannot read JSON: {e}") from e
    return parse_graph(raw)


def save_graph(graph: AgentGraph, path: Path) -> None:
    """Write ``graph`` as DSL JSON."""
    Path(path).write_text(json.dumps(graph.to_dict(), indent=2) + "\n", encoding="utf-8")


def _graph_from_pairs(
    names: list[str], pairs: list[tuple[str, str, str | None]], name: str | None
) -> AgentGraph:
    """Build a graph from node names and edges that may use LangGraph's __start__/__end__."""
    real = [n for n in names if n not in (LANGGRAPH_START, LANGGRAPH_END)]
    for src, dst, _ in pairs:
        for end in (src, dst):
            if end not in (LANGGRAPH_START, LANGGRAPH_END) and end not in real:
                real.append(end)
    start = [d for s, d, _ in pairs if s == LANGGRAPH_START and d != LANGGRAPH_END]
    terminals = [s for s, d, _ in pairs if d == LANGGRAPH_END and s != LANGGRAPH_START]
    inner = [(s, d, c) for s, d, c in pairs if LANGGRAPH_START not in (s, d) and LANGGRAPH_END not in (s, d)]
    raw = {
        "nodes": [{"name": n} for n in real],
        "edges": [{"source": s, "target": d, **({"condition": c} if c else {})} for s, d, c in inner],
        "start": list(dict.fromkeys(start)) or real[:1],
        "terminals": list(dict.fromkeys(terminals)) or [n for n in real if not any(s == n for s, _, _ in inner)],
    }
    if name:
        raw["name"] = name
    return parse_graph(raw)


def from_langgraph(graph_json: dict[str, Any], name: str | None = None) -> AgentGraph:
    """Import LangGraph's ``compiled.get_graph().to_json()`` (``nodes`` with ids, ``edges``)."""
    nodes = graph_json.get("nodes")
    edges = graph_json.get("edges")
    if not isinstance(nodes, list) or not isinstance(edges, list):
        raise GraphInvalid("langgraph", "expected an object with 'nodes' and 'edges' lists")
    names = [str(n["id"]) for n in nodes if isinstance(n, dict) and "id" in n]
    pairs: list[tuple[str, str, str | None]] = []
    for e in edges:
        if not isinstance(e, dict) or "source" not in e or "target" not in e:
            raise GraphInvalid("langgraph edge", f"cannot read {e!r}")
        cond = e.get("data") if isinstance(e.get("data"), str) else None
        if cond is None and e.get("conditional"):
            cond = "conditional"
        pairs.append((str(e["source"]), str(e["target"]), cond))
    return _graph_from_pairs(names, pairs, name)


def _json_list(text: str, key: str) -> list[Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise GraphInvalid(key, f"not JSON: {e}") from e
    if not isinstance(value, list):
        raise GraphInvalid(key, "must be a JSON list")
    return value


def _workflow_edge(item: object) -> tuple[str, str, str | None]:
    if isinstance(item, str) and "->" in item:
        src, dst = item.split("->", 1)
        return src.strip(), dst.strip(), None
    if isinstance(item, list | tuple) and len(item) == 2:
        return str(item[0]), str(item[1]), None
    if isinstance(item, dict) and "source" in item and "target" in item:
        return str(item["source"]), str(item["target"]), item.get("condition")
    raise GraphInvalid("gen_ai.workflow.edges", f"cannot read edge {item!r}")


def from_workflow_attributes(nodes_json: str, edges_json: str, name: str | None = None) -> AgentGraph:
    """Import OpenLLMetry's ``gen_ai.workflow.nodes`` / ``gen_ai.workflow.edges`` (JSON strings)."""
    names = [str(n) for n in _json_list(nodes_json, "gen_ai.workflow.nodes")]
    pairs = [_workflow_edge(e) for e in _json_list(edges_json, "gen_ai.workflow.edges")]
    return _graph_from_pairs(names, pairs, name)
