"""Run one step of the user's agent on a captured case, in a span that carries the eval results."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tracedag.testing.case import Case

EVENT = "gen_ai.evaluation.result"


@dataclass
class StepResult:
    """What one call of the step did."""

    output: Any
    error: BaseException | None
    seconds: float

    @property
    def ok(self) -> bool:
        """True when the step returned without raising."""
        return self.error is None


def _call(fn: Callable[..., Any], case: Case, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    out = fn(case, *args, **kwargs)
    if inspect.isawaitable(out):
        async def wait() -> Any:
            return await out

        return asyncio.run(wait())
    return out


def run_step(fn: Callable[..., Any], case: Case, *args: Any, **kwargs: Any) -> StepResult:
    """Call ``fn(case, *args, **kwargs)`` (sync or async) once, inside a span named after the step
    when ``tracedag.instrument`` is configured; an exception is returned, not raised."""
    with step_span(case):
        start = time.perf_counter()
        try:
            return StepResult(_call(fn, case, args, kwargs), None, time.perf_counter() - start)
        except Exception as e:  # the test decides what a failing step means
            return StepResult(None, e, time.perf_counter() - start)


@contextmanager
def step_span(case: Case) -> Iterator[Any]:
    """A ``node`` span for the rerun of the captured step, labelled with the case (scenario = case id)."""
    from tracedag import instrument as td

    with td.run_labels(scenario_id=case.id), td.node(case.step.name or "step") as step:
        step.set("tracedag.case.trace_id", case.source.get("trace_id"))
        step.set("tracedag.case.span_id", case.source.get("span_id"))
        yield step


def record_evaluation(name: str, score: float | None = None, label: str | None = None,
                      explanation: str | None = None, span: Any = None) -> None:
    """Add a ``gen_ai.evaluation.result`` event to ``span`` (default: the current span), the form
    ``tracedag score`` reads into ``step_scores`` (score on 1-5, label pass/fail)."""
    from opentelemetry import trace

    target = span if span is not None else trace.get_current_span()
    attributes: dict[str, Any] = {"gen_ai.evaluation.name": name}
    if score is not None:
        attributes["gen_ai.evaluation.score.value"] = float(score)
    if label is not None:
        attributes["gen_ai.evaluation.score.label"] = label
    if explanation:
        attributes["gen_ai.evaluation.explanation"] = explanation
    target.add_event(EVENT, attributes)
