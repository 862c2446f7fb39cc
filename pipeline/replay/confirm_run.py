"""Run the planned counterfactual checks, judge them, store them in ``root_cause_checks``.

Each check's conversation is replayed ``times`` times (``runner.replay``, recorded tools: the
calls before the root step and the root call's replacement are served, later calls run live).
A run *fails again* when a step with the name of the source's final failure ends in ERROR. Of the
runs that ran to their end and used the replacement, a run is *resolved* when it did not fail
again or its downstream step scores rose by the AgentEval threshold (``confirm_scores``, once the
runs were built and scored): **confirmed** when most were resolved, **refuted** when most were not,
**inconclusive** on a tie, when no run counts, or when no replacement was found. ``downstream_failures_before`` counts the ERROR steps of the source that started after
the root step; ``downstream_failures_after`` the mean over the runs of their ERROR steps less the
source's before the root (served again from the recording).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from tracedag.instrument.recorded import RECORDED_ATTRIBUTE
from tracedag.pipeline.replay.confirm import PlannedCheck
from tracedag.pipeline.replay.confirm_scores import SCORE_THRESHOLD, Downstream, downstream_scores
from tracedag.pipeline.replay.confirm_serve import serving
from tracedag.pipeline.replay.runner import ReplayConfig, ReplayResult, RunRecord, replay
from tracedag.pipeline.replay.targets import Target
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.views import connect
from tracedag.schemas.layout import table_dir
from tracedag.schemas.tables import ROOT_CAUSE_CHECKS_V2

TABLE = "root_cause_checks"

RUN_SPANS_SQL = f"""
select coalesce(conversation_id, trace_id) as run_id, step_name, tool_name, status_code = 2 as failed,
       coalesce(attributes['{RECORDED_ATTRIBUTE}'], 'false') = 'true' as served
from spans where coalesce(conversation_id, trace_id) in (select unnest($ids))
"""

SOURCE_ERRORS_SQL = """
select count(*) filter (where start_time_unix_nano < $root_start),
       count(*) filter (where start_time_unix_nano >= $root_start and span_id != $root_span)
from spans where coalesce(conversation_id, trace_id) = $cid and status_code = 2
"""


@dataclass(frozen=True)
class RunSpans:
    """What one run's stored spans say: its failed step names, and whether the replacement was served."""

    failed_steps: tuple[str, ...]
    served_ok_tools: frozenset[str]


def default_confirm_id() -> str:
    """``confirm-<UTC time>-<random>``: two checks started in the same second keep their runs apart (a run's
    conversation id is ``<replay id>/<source>/r<i>``)."""
    return time.strftime("confirm-%Y%m%dT%H%M%SZ-", time.gmtime()) + secrets.token_hex(3)


def run_checks(checks: Sequence[PlannedCheck], target: Target, endpoint: str, times: int,
               replay_id: str, parallel: int = 1, set_global: bool = True) -> ReplayResult | None:
    """Replay every check that has a replacement ``times`` times; None when none has one.

    ``set_global``: install the replay's tracer provider as the global one (agents on plain OpenTelemetry).
    """
    runnable = [c for c in checks if c.replacement is not None]
    if not runnable:
        return None
    config = ReplayConfig(endpoint=endpoint, times=times, parallel=parallel, tools="recorded", unmatched="live",
                          replay_id=replay_id, labels={"confirm": "counterfactual"}, set_global=set_global)
    with _gold_outputs(runnable):
        return replay([c.source for c in runnable], target, config)


@contextmanager
def _gold_outputs(checks: Sequence[PlannedCheck]) -> Iterator[None]:
    with ExitStack() as stack:
        for c in checks:
            if c.replacement is not None and c.replacement.output is not None:
                stack.enter_context(serving(c.cause.conversation_id, c.cause.root_step_name, c.replacement.output))
        yield


def judge(data: Path, checks: Sequence[PlannedCheck], result: ReplayResult | None, agent: str,
          replay_id: str, runs_data: Path | None = None) -> list[dict[str, Any]]:
    """One ``root_cause_checks`` row per check, from the runs' stored spans (in ``runs_data``, default
    ``data``: the store of the sources)."""
    records = result.records if result is not None else []
    # one connection per store for every check (plain views: none of the SQL here calls a shared macro)
    con = connect(data, shared_macros=False)
    runs_con = con if runs_data is None else connect(runs_data, shared_macros=False)
    try:
        spans = _run_spans(runs_con, [r.run.run_id for r in records])
        return [_judged(con, runs_con, check, records, spans, (agent, replay_id)) for check in checks]
    finally:
        if runs_con is not con:
            runs_con.close()
        con.close()


def _judged(con: duckdb.DuckDBPyConnection, runs_con: duckdb.DuckDBPyConnection, check: PlannedCheck,
            records: list[RunRecord], spans: dict[str, RunSpans], ids: tuple[str, str]) -> dict[str, Any]:
    """The ``root_cause_checks`` row of ``check`` (``ids``: the agent and the replay id)."""
    mine = [r for r in records if r.run.source.conversation_id == check.cause.conversation_id]
    found = con.execute(SOURCE_ERRORS_SQL, {
        "cid": check.cause.conversation_id, "root_start": check.root_start_ns,
        "root_span": check.cause.root_span_id}).fetchone()
    before_root, after_root = found if found is not None else (0, 0)  # an aggregate: always one row
    cause = check.cause
    scores = downstream_scores(con, runs_con, cause.conversation_id, cause.root_span_id, cause.root_step_name,
                               check.root_start_ns, [r.run.run_id for r in mine])
    return _row(check, mine, spans, (int(before_root), int(after_root)), scores, *ids)


def _run_spans(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> dict[str, RunSpans]:
    failed: dict[str, list[str]] = {r: [] for r in run_ids}
    served: dict[str, set[str]] = {r: set() for r in run_ids}
    rows: list[Any] = con.execute(RUN_SPANS_SQL, {"ids": run_ids}).fetchall() if run_ids else []
    for run_id, step_name, tool_name, is_failed, is_served in rows:
        if is_failed:
            failed.setdefault(str(run_id), []).append(str(step_name))
        elif is_served and tool_name is not None:
            served.setdefault(str(run_id), set()).add(str(tool_name))
    return {r: RunSpans(tuple(failed.get(r, ())), frozenset(served.get(r, ()))) for r in run_ids}


def _row(check: PlannedCheck, records: list[RunRecord], spans: dict[str, RunSpans], errors: tuple[int, int],
         scores: Downstream, agent: str, replay_id: str) -> dict[str, Any]:
    cause, replacement = check.cause, check.replacement
    before_root, after_root = errors
    counted = [r.run.run_id for r in records
               if not r.outcome.stopped and _used(check, spans[r.run.run_id])]
    again = sum(1 for r in counted if cause.failed_step_name in spans[r].failed_steps)
    improved = sum(1 for r in counted if scores.improved(r))
    resolved = sum(1 for r in counted if cause.failed_step_name not in spans[r].failed_steps or scores.improved(r))
    verdict, reason = _verdict(check, len(records), len(counted), again, resolved)
    after = (sum(max(0, len(spans[r].failed_steps) - before_root) for r in counted) / len(counted)) if counted else None
    score_after = scores.after(counted)
    return {
        "conversation_id": cause.conversation_id, "trace_id": cause.trace_id, "root_trace_id": cause.root_trace_id,
        "root_span_id": cause.root_span_id, "root_step_name": cause.root_step_name,
        "root_step_type": cause.root_step_type, "failed_step_name": cause.failed_step_name,
        "strategy": cause.strategy, "replacement_kind": replacement.kind if replacement else None,
        "replacement_source": replacement.source if replacement else None, "runs": len(counted),
        "failures_after": again, "verdict": verdict, "reason": reason,
        "downstream_failures_before": after_root, "downstream_failures_after": after,
        "agent": agent, "replay_id": replay_id if replacement else None, "checked_unix_nano": time.time_ns(),
        "replacement_output": replacement.output if replacement else None, "runs_improved": improved,
        "downstream_score_before": scores.before, "downstream_score_after": score_after,
        "downstream_score_delta": None if score_after is None or scores.before is None else score_after - scores.before,
        "score_threshold": SCORE_THRESHOLD,
    }


def _used(check: PlannedCheck, spans: RunSpans) -> bool:
    """Whether the run reached the root step and was served its replacement (a tool: a served call of it
    that passed; a model step's replacement cannot be seen in the spans, so it counts)."""
    replacement = check.replacement
    if replacement is None or replacement.call is None:
        return True
    return replacement.call.name in spans.served_ok_tools


def _verdict(check: PlannedCheck, planned: int, counted: int, again: int, resolved: int) -> tuple[str, str]:
    """Confirmed when most counted runs were resolved (the final failure gone, or the downstream step
    scores up by the threshold), refuted when most were not, inconclusive on a tie or with no run."""
    if check.replacement is None:
        return "inconclusive", check.reason or "no replacement"
    if counted == 0:
        return "inconclusive", f"none of {planned} runs ran to its end and reached the replaced step"
    name, gone = check.cause.failed_step_name, counted - again
    if resolved * 2 > counted:
        if gone * 2 > counted:
            return "confirmed", f"the failure of {name} disappeared in {gone} of {counted} runs"
        return "confirmed", (f"the failure of {name} disappeared or the downstream step scores rose by "
                             f"{SCORE_THRESHOLD:.2f} or more in {resolved} of {counted} runs")
    if (counted - resolved) * 2 > counted:
        return "refuted", f"{name} failed again in {again} of {counted} runs"
    return "inconclusive", f"{name} failed again in {again} of {counted} runs (no majority)"


def write_checks(data: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Append the checks to the store's ``root_cause_checks`` table; the file written."""
    table = pa.Table.from_pylist(list(rows), schema=ROOT_CAUSE_CHECKS_V2)
    written: Path = write_parquet_atomic(table, table_dir(data, TABLE))
    return written
