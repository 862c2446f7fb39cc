"""Counterfactual confirmation of root causes (AgentEval app. Q, DESIGN §8): which checks to run.

For each selected failed conversation with a root cause (``queries/root_causes.sql`` per
conversation, a chosen strategy), the check re-runs the conversation with only the root-cause
step's output replaced:

- a tool step: the recorded result of a passing call of the same tool with the same arguments
  (canonical JSON) from another conversation (``recorded_tool``); for a parameter-generation
  failure (taxonomy ``invalid_tool_arguments``, AgentEval's PARAMGEN) a passing call of the same
  tool in a passing conversation of the same scenario, the corrected call (``paramgen``); else the
  user's ``--replacement FILE`` (``file``);
- a model step that emitted a rejected tool call (PARAMGEN at the model step, where ``score.paramgen``
  puts it): that call is served the result of the same tool's passing call in a passing conversation of
  the same scenario, the corrected call (``paramgen``);
- another model step: the output of the same step (step name) in a passing conversation of the same
  scenario (``gold_step``), else a correction the judge writes (``judge``, ``confirm_judge``), served to an
  agent that asks ``confirm_serve.replacement(step_name)`` (an agent behind a URL: at its proxy call);
- nothing found: no run, the check is inconclusive.

The tool calls of the source that started before the root step are served from the recording
(``tracedag.instrument`` recorded tools), the root call gets the replacement, later calls run live.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracedag.instrument.recorded import RecordedCall, canonical
from tracedag.pipeline.replay.confirm_judge import CorrectionFailed, FailedStep, correction
from tracedag.pipeline.replay.source import (
    ReplaySourceError,
    Selection,
    SourceConversation,
    select_conversations,
)
from tracedag.pipeline.score.judge.config import JudgeConfig
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.views import connect

logger = logging.getLogger(__name__)

STRATEGIES = ("greedy", "full_path_min", "weighted", "agenteval")
PARAMGEN = "invalid_tool_arguments"

_ARGS = "coalesce(attributes['gen_ai.tool.call.arguments'], attributes['input.value'], input_text)"
_RESULT = "coalesce(attributes['gen_ai.tool.call.result'], attributes['output.value'], output_text)"

TOOL_SPANS_SQL = f"""
select span_id, tool_name, {_ARGS} as arguments, {_RESULT} as result, status_code = 2 as failed,
       coalesce(error_type, 'error') as error_type, status_message, start_time_unix_nano
from spans
where step_type = 'tool' and tool_name is not null and coalesce(conversation_id, trace_id) = $cid
order by start_time_unix_nano, span_id
"""

ROOT_SPAN_SQL = f"""
select tool_name, {_ARGS} as arguments, start_time_unix_nano, cast(step_type as varchar) as step_type,
       step_name, coalesce(scenario_id, coalesce(conversation_id, trace_id)) as scenario
from spans where trace_id = $trace_id and span_id = $span_id
"""

PASSING_TOOL_SQL = f"""
with conv as (
    select coalesce(conversation_id, trace_id) as cid, bool_or(status_code = 2) as failed,
           max(coalesce(scenario_id, coalesce(conversation_id, trace_id))) as scenario
    from spans group by 1
)
select s.span_id, coalesce(s.conversation_id, s.trace_id) as cid, {_ARGS} as arguments, {_RESULT} as result,
       not c.failed and c.scenario = $scenario as same_scenario_passing
from spans s join conv c on c.cid = coalesce(s.conversation_id, s.trace_id)
where s.step_type = 'tool' and s.tool_name = $tool and s.status_code != 2 and c.cid != $cid
order by s.start_time_unix_nano, s.span_id
"""

EMITTED_CALL_SQL = f"""
select s.tool_name, {_ARGS} as arguments
from dag_edges e join spans s on s.trace_id = e.trace_id and s.span_id = e.downstream_span_id
where e.trace_id = $trace_id and e.upstream_span_id = $span_id and e.edge_kind = 'tool_call'
  and s.tool_name is not null
order by s.status_code = 2 desc, s.start_time_unix_nano, s.span_id
limit 1
"""
"""The tool call a model step emitted (a failed one first: the call whose arguments were rejected)."""

GOLD_STEP_SQL = """
with conv as (
    select coalesce(conversation_id, trace_id) as cid, bool_or(status_code = 2) as failed,
           max(coalesce(scenario_id, coalesce(conversation_id, trace_id))) as scenario
    from spans group by 1
)
select s.output_text, c.cid, s.span_id
from spans s join conv c on c.cid = coalesce(s.conversation_id, s.trace_id)
where s.step_name = $step_name and cast(s.step_type as varchar) = $step_type and s.output_text is not null
  and not c.failed and c.scenario = $scenario and c.cid != $cid
order by s.start_time_unix_nano, s.span_id
limit 1
"""

STEP_TEXT_SQL = """
select input_text, output_text, coalesce(status_message, error_type) from spans where trace_id = $trace_id and span_id = $span_id
"""
"""What the judge sees of a model step it corrects."""

ORDINAL_SQL = """
select count(*) from spans
where coalesce(conversation_id, trace_id) = $cid and step_name = $step_name and start_time_unix_nano < $start
"""


class ConfirmError(ReplaySourceError):  # type: ignore[misc,unused-ignore]
    """A strategy or replacement file that cannot be used, or nothing to check."""


@dataclass(frozen=True)
class RootCause:
    """The root cause ``root_causes`` names for one failed conversation."""

    conversation_id: str
    trace_id: str
    root_trace_id: str
    root_span_id: str
    root_step_name: str
    root_step_type: str
    failed_step_name: str
    taxonomy: str | None
    strategy: str


@dataclass(frozen=True)
class Replacement:
    """What the root step's output is replaced with, and where it came from."""

    kind: str  # recorded_tool | paramgen | file | gold_step
    source: str
    call: RecordedCall | None = None  # a tool step's replacement, keyed by the root call's name and arguments
    output: str | None = None  # a model step's replacement
    ordinal: int = 1  # a model step's place among the conversation's steps of its name (the proxy's n-th call)


@dataclass(frozen=True)
class PlannedCheck:
    """One conversation to check: its source (with the tool calls to serve) and the replacement."""

    cause: RootCause
    source: SourceConversation
    replacement: Replacement | None
    reason: str = ""
    root_start_ns: int = 0


def root_causes(data: Path, strategy: str) -> dict[str, RootCause]:
    """Conversation id -> its root cause (per conversation, by ``strategy``)."""
    if strategy not in STRATEGIES:
        raise ConfirmError(f"--strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    rows = run_named(data, "root_causes", {"per": "conversation", "strategy": strategy}).to_pylist()
    out: dict[str, RootCause] = {}
    for r in rows:
        cid = str(r["conversation_id"] or r["trace_id"])
        out[cid] = RootCause(cid, str(r["trace_id"]), str(r["root_trace_id"]), str(r["root_span_id"]),
                             str(r["root_step_name"]), str(r["root_step_type"]), str(r["failed_step_name"]),
                             r["root_taxonomy_l3"], strategy)
    return out


def select_checks(data: Path, selection: Selection, strategy: str) -> tuple[list[SourceConversation], dict[str, RootCause]]:
    """The selected conversations that have a root cause, and the root causes."""
    causes = root_causes(data, strategy)
    if not causes:
        raise ConfirmError(f"no failed conversation with a root cause in {data} (build and score it first: "
                           f"tracedag build --data {data} --idle 0 && tracedag score --data {data})")
    sources = select_conversations(data, selection)
    kept = [s for s in sources if s.conversation_id in causes]
    if not kept:
        raise ConfirmError("none of the selected conversations failed with a root cause")
    return kept, causes


def plan_checks(data: Path, sources: Sequence[SourceConversation], causes: Mapping[str, RootCause],
                replacement_file: Path | None = None, judge: JudgeConfig | None = None) -> list[PlannedCheck]:
    """A check for every source: the tool calls before its root step, and the root's replacement (``judge``
    writes a model step's correction when no passing run of the scenario has the step)."""
    file_result = _read_replacement(replacement_file) if replacement_file is not None else None
    con = connect(data, shared_macros=False)  # plain views: the plan's SQL calls no shared query macro
    try:
        return [_plan_one(con, s, causes[s.conversation_id], (replacement_file, file_result), judge) for s in sources]
    finally:
        con.close()


def _read_replacement(path: Path) -> str:
    """The file's text; an unreadable or empty file, or one that starts as JSON and does not parse, is an error."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfirmError(f"--replacement {path}: cannot read it: {e}") from e
    if not text.strip():
        raise ConfirmError(f"--replacement {path}: the file is empty")
    if text.lstrip()[:1] in ("{", "["):
        try:
            json.loads(text)
        except ValueError as e:
            raise ConfirmError(f"--replacement {path}: starts as JSON but does not parse: {e}") from e
    return text


def _plan_one(con: Any, source: SourceConversation, cause: RootCause, file: tuple[Path | None, str | None],
              judge: JudgeConfig | None) -> PlannedCheck:
    root = con.execute(ROOT_SPAN_SQL, {"trace_id": cause.root_trace_id, "span_id": cause.root_span_id}).fetchone()
    if root is None:
        return PlannedCheck(cause, source, None, "the root span is not in the store")
    tool, arguments, start_ns, step_type, step_name, scenario = root
    upstream = _upstream_calls(con, source.conversation_id, int(start_ns))
    replacement: Replacement | None
    if step_type == "tool" and tool is not None:
        replacement = _tool_replacement(con, cause, str(tool), arguments, str(scenario), *file)
        reason = "" if replacement else f"no passing call of {tool} with the same arguments, and no --replacement"
    elif step_type == "llm" and cause.taxonomy == PARAMGEN:
        replacement = _corrected_call(con, cause, str(scenario))
        reason = "" if replacement else f"no passing run of scenario {scenario} made the call {step_name} emitted"
    elif step_type == "llm":
        replacement, reason = _model_step(con, cause, str(step_name), str(scenario), int(start_ns), judge)
    else:
        replacement, reason = None, f"a {step_type} step: only tool and model steps can be replaced"
    calls = [*upstream, replacement.call] if replacement is not None and replacement.call is not None else upstream
    planned = dataclasses.replace(source, tool_calls=tuple(calls))
    return PlannedCheck(cause, planned, replacement, reason, int(start_ns))


def _upstream_calls(con: Any, cid: str, root_start_ns: int) -> list[RecordedCall]:
    """The source's tool calls that started before the root step, as recordings."""
    out: list[RecordedCall] = []
    for _span, name, arguments, result, failed, error_type, message, start in con.execute(
            TOOL_SPANS_SQL, {"cid": cid}).fetchall():
        if int(start) >= root_start_ns:
            break
        out.append(RecordedCall(str(name), arguments, None if failed else result,
                                str(error_type) if failed else None, str(message or "")))
    return out


def _tool_replacement(con: Any, cause: RootCause, tool: str, arguments: str | None, scenario: str,
                      file_path: Path | None, file_result: str | None) -> Replacement | None:
    rows = con.execute(PASSING_TOOL_SQL, {"tool": tool, "cid": cause.conversation_id, "scenario": scenario}).fetchall()
    wanted = canonical(arguments or {})
    for span_id, cid, args, result, _same in rows:
        if canonical(args or {}) == wanted:
            return Replacement("recorded_tool", f"{cid}/{span_id}", RecordedCall(tool, arguments, result))
    if cause.taxonomy == PARAMGEN:
        for span_id, cid, _args, result, same in rows:
            if same:
                return Replacement("paramgen", f"{cid}/{span_id}", RecordedCall(tool, arguments, result))
    if file_path is not None and file_result is not None:
        return Replacement("file", str(file_path), RecordedCall(tool, arguments, _as_result(file_result)))
    return None


def _corrected_call(con: Any, cause: RootCause, scenario: str) -> Replacement | None:
    """PARAMGEN at a model step: the tool call it emitted (its ``tool_call`` edge) is served the result of
    the same tool's passing call in a passing run of the scenario, as if the model had written that call's
    arguments."""
    emitted = con.execute(EMITTED_CALL_SQL, {"trace_id": cause.root_trace_id, "span_id": cause.root_span_id}).fetchone()
    if emitted is None:
        return None
    tool, arguments = str(emitted[0]), emitted[1]
    rows = con.execute(PASSING_TOOL_SQL, {"tool": tool, "cid": cause.conversation_id, "scenario": scenario}).fetchall()
    for span_id, cid, _args, result, same in rows:
        if same:
            return Replacement("paramgen", f"{cid}/{span_id}", RecordedCall(tool, arguments, result))
    return None


def _as_result(text: str) -> str:
    """A replacement file's text as a recorded result: JSON stays as written, other text as it is."""
    try:
        json.loads(text)
    except ValueError:
        return text.strip()
    return text


def _gold_step(con: Any, cause: RootCause, step_name: str, scenario: str, start_ns: int) -> Replacement | None:
    row = con.execute(GOLD_STEP_SQL, {"step_name": step_name, "step_type": "llm", "scenario": scenario,
                                      "cid": cause.conversation_id}).fetchone()
    if row is None:
        return None
    return Replacement("gold_step", f"{row[1]}/{row[2]}", output=str(row[0]),
                       ordinal=step_ordinal(con, cause.conversation_id, step_name, start_ns))


def _model_step(con: Any, cause: RootCause, step_name: str, scenario: str, start_ns: int,
                judge: JudgeConfig | None) -> tuple[Replacement | None, str]:
    """A passing run's output of the step (gold reference), else the judge's correction; the reason when neither."""
    gold = _gold_step(con, cause, step_name, scenario, start_ns)
    if gold is not None:
        return gold, ""
    missing = f"no passing conversation of scenario {scenario} has a {step_name} step"
    if judge is None:
        return None, f"{missing}, and no judge to write a correction (TRACEDAG_JUDGE_MODEL)"
    row = con.execute(STEP_TEXT_SQL, {"trace_id": cause.root_trace_id, "span_id": cause.root_span_id}).fetchone()
    step = FailedStep(step_name, *(row if row is not None else (None, None, None)))
    try:
        text = correction(judge, step)
    except CorrectionFailed as e:
        logger.warning("conversation %s: %s", cause.conversation_id, e)
        return None, f"{missing}; {e}"
    return Replacement("judge", f"judge:{judge.model}", output=text,
                       ordinal=step_ordinal(con, cause.conversation_id, step_name, start_ns)), ""


def step_ordinal(con: Any, cid: str, step_name: str, start_ns: int) -> int:
    """The root step's place (1, 2, ...) among the conversation's steps named ``step_name``."""
    row = con.execute(ORDINAL_SQL, {"cid": cid, "step_name": step_name, "start": start_ns}).fetchone()
    return 1 + int(row[0]) if row is not None else 1
