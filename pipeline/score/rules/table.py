"""Deterministic rules: one readable table (name, metric, score, taxonomy category, predicate).

Each step gets one row per metric: the metrics it always has (``execution`` for every step,
``output`` for llm and tool steps, ``arguments`` for tool steps whose schema is in the trace,
``termination`` for agent and chain steps) plus the metric of any rule that fired. When no rule
of a metric fired the score is 5 ("no rule fired"); otherwise the lowest-scoring fired rule
wins, ties going to the rule listed first (the more specific one).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tracedag.pipeline.score.rows import ScoreRow, categorize
from tracedag.pipeline.score.rules.format_hints import broken_arguments, says_nothing
from tracedag.pipeline.score.rules.result_errors import KEY_HINTS, error_message, result_error
from tracedag.pipeline.score.rules.toolschema import ArgsProblem, check_arguments, parse_arguments

PASS_SCORE = 5.0
PASS_RULE = "no_rule_fired"
PASS_EXPLANATION = "no rule fired"


@dataclass(slots=True)
class StepFacts:
    """What the rules look at for one built step (a dag_nodes row joined with its span)."""

    trace_id: str
    span_id: str
    build_id: str | None = None
    step_type: str | None = None
    step_name: str | None = None
    tool_name: str | None = None
    iteration: int | None = None
    status_code: int | None = None
    status_message: str | None = None
    error_type: str | None = None
    finish_reason: str | None = None
    output_text: str | None = None
    input_text: str | None = None
    output_tokens: int | None = None
    http_status: str | None = None
    tool_args: str | None = None
    task_status: str | None = None
    exceptions: list[str] = field(default_factory=list)
    tool_schema: dict[str, Any] | None = None  # parameters schema of tool_name, when defined in the trace
    max_iterations: int | None = None
    memo: dict[str, Any] = field(default_factory=dict, repr=False)  # derived signals, computed once


# ---- signals derived from the facts -------------------------------------------------------------

# the prefilter of the columnar scan (scan.py): a result holding none of these is no error payload
RESULT_KEY_HINTS = KEY_HINTS


def tool_result_reports_error(f: StepFacts) -> bool:
    """A tool result that says it failed: one of the shapes of ``result_errors.SHAPES``."""
    if f.step_type != "tool" or not f.output_text:
        return False
    if "result_error" not in f.memo:
        f.memo["result_error"] = _result_error(f.output_text)
    found: bool = f.memo["result_error"]
    return found


def _result_error(text: str) -> bool:
    return result_error(text) is not None


def http_status(f: StepFacts) -> int | None:
    """The HTTP response status recorded on the span, if any."""
    try:
        return int(f.http_status) if f.http_status else None
    except ValueError:
        return None


def failed_signal(f: StepFacts) -> bool:
    """The span itself says it failed (status, error.type, exception events, HTTP status, tool result)."""
    if "failed" not in f.memo:
        f.memo["failed"] = _failed(f)
    found: bool = f.memo["failed"]
    return found


def _failed(f: StepFacts) -> bool:
    status = http_status(f)
    return (
        f.status_code == 2
        or bool(f.error_type)
        or bool(f.exceptions)
        or (f.task_status or "").lower() == "failure"
        or (status is not None and status >= 400)
        or tool_result_reports_error(f)
    )


def error_text(f: StepFacts) -> str:
    """Every error string of a failed step in one lowercase text (empty when it did not fail)."""
    if "error_text" not in f.memo:
        parts: list[str] = []
        if failed_signal(f):
            parts = [f.error_type or "", f.status_message or "", *f.exceptions]
            if tool_result_reports_error(f):
                parts.append(error_message(f.output_text))
        f.memo["error_text"] = "\n".join(parts).lower()
    text: str = f.memo["error_text"]
    return text


def error_detail(f: StepFacts) -> str:
    """The error strings of a failed step as reported (case kept), each said once: a part that
    another part contains (error.type "ValueError" in the exception "ValueError: bad card") is left out."""
    if not failed_signal(f):
        return ""
    parts = [f.error_type or "", f.status_message or "", *f.exceptions]
    if tool_result_reports_error(f):
        parts.append(error_message(f.output_text))
    parts = list(dict.fromkeys(" | ".join(x.strip() for x in p.strip().splitlines() if x.strip()) for p in parts))
    kept = [p for i, p in enumerate(parts)
            if p and not any(p.lower() in q.lower() for j, q in enumerate(parts) if j != i and len(q) > len(p))]
    return " | ".join(kept)


def _matches(pattern: str, statuses: tuple[int, ...] = ()) -> Callable[[StepFacts], bool]:
    rx = re.compile(pattern, re.I | re.M)

    def check(f: StepFacts) -> bool:
        if http_status(f) in statuses:
            return True
        text = error_text(f)
        return bool(text) and bool(rx.search(text))

    return check


def _finish(*reasons: str) -> Callable[[StepFacts], bool]:
    wanted = set(reasons)

    def check(f: StepFacts) -> bool:
        if "finish" not in f.memo:
            f.memo["finish"] = {t.lower() for t in re.findall(r"[A-Za-z_]+", f.finish_reason or "")}
        return bool(f.memo["finish"] & wanted)

    return check


_EMPTY = ("", "null", "none", "[]", "{}", '""')
_TOOL_CALL_FINISH = _finish("tool_calls", "tool_call", "function_call", "tool_use")


def llm_output_empty(f: StepFacts) -> bool:
    """An LLM step that produced nothing: captured output empty or 0 output tokens, and no tool call."""
    if f.step_type != "llm" or _TOOL_CALL_FINISH(f):
        return False
    captured_empty = f.output_text is not None and f.output_text.strip().lower() in _EMPTY
    return captured_empty or f.output_tokens == 0


def tool_output_empty(f: StepFacts) -> bool:
    """A tool step whose captured result is empty."""
    return f.step_type == "tool" and f.output_text is not None and f.output_text.strip().lower() in _EMPTY


def args_problem(f: StepFacts) -> ArgsProblem | None:
    """The problem with a tool step's arguments (not JSON, failing the tool's schema, or, on a
    failed step whose error says nothing, breaking a format the schema states in words), if any."""
    if f.step_type != "tool":
        return None
    if "args" not in f.memo:
        args, problem = parse_arguments(f.tool_args, f.input_text)
        if problem is None and f.tool_schema is not None and args is not None:
            problem = check_arguments(args, f.tool_schema) or _format_problem(f, args, f.tool_schema)
        f.memo["args"] = problem
    found: ArgsProblem | None = f.memo["args"]
    return found


def _format_problem(f: StepFacts, args: Any, schema: dict[str, Any]) -> ArgsProblem | None:
    """A string argument breaking its parameter's stated format (``format_hints``), on a failed
    step whose error says nothing else (redacted, generic): the tool is taken to have rejected it."""
    if not failed_signal(f) or not says_nothing(error_text(f), (f.tool_name, f.step_name)):
        return None
    broken = broken_arguments(args, schema)
    if broken is None:
        return None
    return ArgsProblem("format", f"{broken.param}: {broken.value[:80]!r} is not {broken.hint}")


def _args(kind: str) -> Callable[[StepFacts], bool]:
    def check(f: StepFacts) -> bool:
        problem = args_problem(f)
        return problem is not None and problem.kind == kind

    return check


def over_iteration_bound(f: StepFacts) -> bool:
    """The step's loop iteration reached the configured bound (``--max-iterations``)."""
    return f.max_iterations is not None and (f.iteration or 0) >= f.max_iterations


def _tool_step_failed(f: StepFacts) -> bool:
    return f.step_type == "tool" and failed_signal(f)


def tool_rejected_arguments(f: StepFacts) -> bool:
    """A tool step that failed because of its arguments (the error says so: validation, call signature)."""
    return f.step_type == "tool" and bool(_ARGS_REJECTED.search(error_text(f)))


def _status_error(f: StepFacts) -> bool:
    return f.status_code == 2 or bool(f.error_type) or (f.task_status or "").lower() == "failure"


# ---- the rule table -----------------------------------------------------------------------------

_TIMEOUT = r"time[d ]?out|deadline[_ ]?exceeded"
_RATE = r"rate[_ ]?limit|too many requests|quota|\b429\b"
_NOT_FOUND = r"not a valid tool|tool\W*not\W*found|unknown tool|no such tool|tool .{1,80} (?:does not exist|not found)"
_CONNECTION = r"connect(?:ion)?[_ ]?error|connection (?:refused|reset|aborted)|name or service not known|network is unreachable|name resolution"
_HTTP = r"http(?:status)?error|apistatuserror|badrequesterror|internalservererror|notfounderror|authenticationerror|permissiondeniederror|unprocessableentityerror|serviceunavailable|^[45]\d\d$"
# a tool that raised or reported because of its arguments (validation libraries, Python call errors)
_BAD_ARGS = (r"validation ?error|invalid (?:tool )?(?:argument|parameter|input|param)s?\b|invalid_argument"
             r"|unexpected keyword argument|missing \d+ required (?:positional |keyword-only )?argument"
             r"|is a required property|(?:field|property|argument|parameter) required|required (?:field|property|argument|parameter)"
             r"|jsondecodeerror|arguments? (?:is|are) not (?:valid )?json|additional properties are not allowed"
             r"|input should be|\bmust be\b[^\n]{1,80}\bgot\b")  # pydantic; "time must be HH:MM, got 'six'"
_ARGS_REJECTED = re.compile(_BAD_ARGS, re.I | re.M)
_LOOP = r"graphrecursionerror|recursion ?limit|recursionerror|maxturnsexceeded|max(?:imum)?[_ ]?(?:iterations|turns|steps)|iteration limit"


@dataclass(frozen=True)
class Rule:
    """A deterministic check: when ``fires`` holds, the step scores ``score`` on ``metric``."""

    name: str
    metric: str
    score: float
    category: str  # taxonomy L3 id
    fires: Callable[[StepFacts], bool]
    explain: str
    needs_failure: bool = False
    """Can only fire on a step that reports a failure (``failed_signal``): skipped on the others."""


def F(name: str, metric: str, score: float, category: str, fires: Callable[[StepFacts], bool], explain: str) -> Rule:
    """A rule that looks at the error of a failed step (status, error.type, exceptions, HTTP status)."""
    return Rule(name, metric, score, category, fires, explain, needs_failure=True)


RULES: tuple[Rule, ...] = (
    # F(...) = a rule that can only fire on a step reporting a failure (skipped on the others)
    #     name                      metric        score  taxonomy L3               predicate, explanation
    F(   "timeout",                "execution",  1,     "timeout",                _matches(_TIMEOUT, (408, 504)), "the call timed out"),
    F(   "rate_limited",           "execution",  1,     "rate_limited",           _matches(_RATE, (429,)), "the call was rate limited"),
    F(   "tool_not_found",         "execution",  1,     "tool_not_found",         _matches(_NOT_FOUND), "the requested tool does not exist"),
    F(   "connection_error",       "execution",  1,     "connection_error",       _matches(_CONNECTION), "the connection failed"),
    F(   "loop_bound",             "termination",1,     "loop_limit_reached",     _matches(_LOOP), "a loop hit its bound"),
    F(   "http_error",             "execution",  1,     "http_error",             _matches(_HTTP, tuple(range(400, 600))), "an HTTP error status"),
    F(   "tool_status_error",      "execution",  1,     "tool_error",             _tool_step_failed, "the tool raised or reported an error"),
    F(   "status_error",           "execution",  1,     "unhandled_exception",    _status_error, "span status ERROR"),
    F(   "exception_event",        "execution",  1,     "unhandled_exception",    lambda f: bool(f.exceptions), "an exception was recorded"),
    Rule("finish_content_filter",  "output",     1,     "content_filtered",       _finish("content_filter", "safety", "blocked", "prohibited_content"), "the provider's filter stopped the output"),
    Rule("finish_error",           "output",     1,     "unhandled_exception",    _finish("error"), "the model stopped with finish reason error"),
    Rule("finish_length",          "output",     2,     "output_truncated",       _finish("length", "max_tokens", "max_output_tokens"), "generation stopped at the token limit"),
    Rule("empty_llm_output",       "output",     2,     "empty_output",           llm_output_empty, "the model produced no output"),
    Rule("empty_tool_output",      "output",     3,     "empty_output",           tool_output_empty, "the tool returned an empty result"),
    Rule("tool_args_not_json",     "arguments",  1,     "malformed_arguments",    _args("not_json"), "the tool arguments are not JSON"),
    Rule("tool_args_unknown_field","arguments",  2,     "hallucinated_arguments", _args("unknown_field"), "the arguments name a field the tool does not have"),
    Rule("tool_args_schema",       "arguments",  2,     "malformed_arguments",    _args("schema"), "the arguments fail the tool's JSON schema"),
    F(   "tool_args_rejected",     "arguments",  2,     "malformed_arguments",    tool_rejected_arguments, "the tool rejected its arguments"),
    F(   "tool_args_format",       "arguments",  2,     "malformed_arguments",    _args("format"), "an argument breaks the format the tool's description states, and the error says nothing else"),
    Rule("iteration_bound",        "termination",2,     "loop_limit_reached",     over_iteration_bound, "the loop reached --max-iterations"),
)  # fmt: skip

# Metrics a step always has (a passing row with score 5 when no rule of that metric fired).
BASE_METRICS: dict[str, tuple[str, ...]] = {
    "llm": ("execution", "output"),
    "tool": ("execution", "output"),
    "agent": ("execution", "termination"),
    "chain": ("execution", "termination"),
}


DEFAULT_METRICS = ("execution",)


def metrics_for(f: StepFacts) -> list[str]:
    """The metrics every step of this type is scored on, even when no rule fires."""
    metrics = list(BASE_METRICS.get(f.step_type or "", DEFAULT_METRICS))
    if f.step_type == "tool" and f.tool_schema is not None:
        metrics.append("arguments")
    return metrics


def _detail(rule: Rule, f: StepFacts) -> str:
    own = not rule.needs_failure or rule.name == "tool_args_format"  # the problem, not the (redacted) error
    problem = args_problem(f) if rule.metric == "arguments" and own else None
    if problem is not None:
        return f"{rule.explain}: {problem.detail}"
    text = error_detail(f)
    return f"{rule.explain}: {text[:300]}" if text else rule.explain


def _row(f: StepFacts, metric: str, fired: list[Rule]) -> ScoreRow:
    row = ScoreRow(f.trace_id, f.span_id, f.build_id, metric, PASS_SCORE, "rule", rule_name=PASS_RULE,
                   explanation=PASS_EXPLANATION)
    if not fired:
        return row
    best = min(fired, key=lambda r: r.score)  # min() keeps the first of equal scores: table order
    row.score, row.rule_name = float(best.score), best.name
    others = [r.name for r in fired if r is not best]
    row.explanation = _detail(best, f) + (f" (also fired: {', '.join(others)})" if others else "")
    row.category, _ = categorize(row.score, best.category, "")
    return row


def score_step(f: StepFacts) -> list[ScoreRow]:
    """Apply every rule to one step; return one row per metric."""
    fired: dict[str, list[Rule]] = {}
    failed = failed_signal(f)
    for rule in RULES:
        if (failed or not rule.needs_failure) and rule.fires(f):
            fired.setdefault(rule.metric, []).append(rule)
    metrics = metrics_for(f)
    metrics += [m for m in fired if m not in metrics]
    return [_row(f, m, fired.get(m, [])) for m in metrics]
