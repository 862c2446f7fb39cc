"""Optional workflow spec: step types/names mapped to spec nodes, and the dependencies allowed between them.

A spec is a small YAML or JSON file::

    nodes:                       # spec node -> match rule (step_type and/or step_name, exact)
      classify: {step_name: classify}
      agent: {step_name: agent}
      tools: {step_name: tools}
    edges:                       # allowed dependencies, upstream -> downstream
      - [classify, agent]
      - [agent, tools]
      - [tools, agent]
    required: [classify, agent]  # spec nodes every trace must contain (optional)

Each DAG node is mapped to the first spec node whose rule matches (``dag_nodes.spec_node``). A trace
is deviant when a sequence/explicit edge joins two mapped nodes whose pair is not allowed, or a
required spec node never ran; ``traces.deviation_reason`` says which.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

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


def parse_spec(doc: Any, origin: str = "<spec>") -> WorkflowSpec:
    """Build a ``WorkflowSpec`` from a parsed YAML/JSON document."""
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), dict):
        raise BadSpec(origin, "expected a mapping with a 'nodes' mapping")
    nodes = []
    for name, rule in doc["nodes"].items():
        rule = rule or {}
        if not isinstance(rule, dict) or not (set(rule) <= {"step_type", "step_name"}):
            raise BadSpec(origin, f"node {name}: rule must use step_type and/or step_name")
        nodes.append((str(name), rule.get("step_type"), rule.get("step_name", None if rule else str(name))))
    known = {n for n, _, _ in nodes}
    allowed = set()
    for edge in doc.get("edges") or []:
        if not (isinstance(edge, list | tuple) and len(edge) == 2 and set(map(str, edge)) <= known):
            raise BadSpec(origin, f"edge {edge!r}: expected [upstream, downstream] spec nodes")
        allowed.add((str(edge[0]), str(edge[1])))
    required = tuple(str(r) for r in doc.get("required") or [])
    if not set(required) <= known:
        raise BadSpec(origin, f"required names unknown nodes: {sorted(set(required) - known)}")
    return WorkflowSpec(tuple(nodes), frozenset(allowed), required)


def load_spec(path: Path) -> WorkflowSpec:
    """Read a workflow spec from a YAML or JSON file."""
    try:
        text = path.read_text(encoding="utf-8")
        doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise BadSpec(str(path), str(e)) from e
    return parse_spec(doc, str(path))
