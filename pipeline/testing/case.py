"""A captured case (``tracedag capture`` -> case.json): the state before one step of a stored trace."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "tracedag.case/v1"


class CaseError(ValueError):
    """A case file that cannot be read or is not a tracedag case."""


@dataclass(frozen=True)
class CaseStep:
    """The captured step: what it is, what it was given, what it produced in the trace."""

    type: str | None
    name: str | None
    input: Any
    expected_output: Any
    expected_status: str
    tool_name: str | None = None
    model: str | None = None
    span_id: str | None = None


@dataclass(frozen=True)
class Case:
    """The state before a step: the conversation so far and the step's inputs."""

    step: CaseStep
    history: list[dict[str, Any]]
    source: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def id(self) -> str:
        """``<trace_id>:<span_id>`` of the captured step (or the file name)."""
        trace, span = self.source.get("trace_id"), self.source.get("span_id")
        return f"{trace}:{span}" if trace and span else (self.path.stem if self.path else "case")

    @property
    def messages(self) -> list[dict[str, str]]:
        """The messages so far, in order: ``[{"role": ..., "content": ...}]``."""
        return [{"role": h["role"], "content": h["content"]} for h in self.history if h.get("kind") == "message"]

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The tool calls so far, in order, with arguments, result and status."""
        return [h for h in self.history if h.get("kind") == "tool_call"]

    def tool_result(self, name: str, arguments: Any = None) -> Any:
        """The recorded result of the last call of tool ``name`` (with these arguments, when given),
        to stub a tool with what it returned in the trace; ``KeyError`` when there is none."""
        for call in reversed(self.tool_calls):
            if call.get("name") == name and (arguments is None or call.get("arguments") == arguments):
                return call.get("result")
        raise KeyError(f"no recorded call of tool {name!r}" + ("" if arguments is None else f" with {arguments!r}"))


def load_case(path: str | Path) -> Case:
    """Read a case file written by ``tracedag capture``."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CaseError(f"{p}: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CaseError(f"{p}: not a tracedag case (expected \"format\": \"{FORMAT}\")")
    return case_from_dict(doc, p)


def case_from_dict(doc: dict[str, Any], path: Path | None = None) -> Case:
    """A ``Case`` from the parsed document."""
    step = doc.get("step") or {}
    expected = step.get("expected") or {}
    history = doc.get("history") or []
    if not isinstance(history, list):
        raise CaseError(f"{path or 'case'}: history must be a list")
    return Case(
        step=CaseStep(type=step.get("type"), name=step.get("name"), input=step.get("input"),
                      expected_output=expected.get("output"), expected_status=expected.get("status", "ok"),
                      tool_name=step.get("tool_name"), model=step.get("model"), span_id=step.get("span_id")),
        history=[h for h in history if isinstance(h, dict)], source=dict(doc.get("source") or {}), path=path,
    )
