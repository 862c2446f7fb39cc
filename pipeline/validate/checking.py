"""Check runs against a validation model: essential states reached, in order; explain what is not.

A run passes when the essential states of its scenario appear in its state sequence as an ordered
subsequence; every other state is noise. The row of a run (``VALIDATIONS_V1``) says how many
essential states it matched in order (coverage = matched / essential; matched is the longest run of
essential states reached in the model's order), which it never reached, which pairs it reached in
the wrong order, and one sentence such as "State 'check_availability' never reached after
'ask_details'". Two reports do not fail a run: essential states slower than ``duration_slack``
times the slowest learned visit (``too_slow``), and transitions only failed runs took when the
model was learned (``failure_paths``).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.validate.learning import ACCEPT, START, Visit, visits
from tracedag.pipeline.validate.model import Model, ScenarioModel
from tracedag.pipeline.validate.runs import RunSteps, agents_of
from tracedag.schemas.errors import TracedagError
from tracedag.schemas.layout import table_dir
from tracedag.schemas.tables import VALIDATIONS_V1

logger = logging.getLogger(__name__)

TABLE = "validations"


class WrongAgent(TracedagError):  # type: ignore[misc,unused-ignore]
    """The model was learned for another agent than the runs to check."""

    def __init__(self, model_path: str, agent: str, found: list[str]) -> None:
        super().__init__(f"validation model {model_path} was learned for agent {agent!r}; the selected runs are "
                         f"of {', '.join(repr(a) for a in found) or 'no agent'} (learn a model for that agent)")
        self.agent = agent
        self.found = found


@dataclass(frozen=True)
class Outcome:
    """The verdict on one run."""

    passed: bool | None
    coverage: float | None
    matched: int
    missing: list[str]
    out_of_order: list[tuple[str, str]]
    explanation: str
    too_slow: list[str]
    failure_paths: list[str]


def _longest_in_order(positions: list[int]) -> int:
    """Length of the longest increasing subsequence of ``positions``."""
    tails: list[int] = []
    for p in positions:
        i = bisect.bisect_left(tails, p)
        if i == len(tails):
            tails.append(p)
        else:
            tails[i] = p
    return len(tails)


def judge(seq: Sequence[Visit], scenario: ScenarioModel, slack: float) -> Outcome:
    """Check one run's merged states against the scenario's essential states."""
    essential = scenario.essential
    where = {v.name: i for i, v in reversed(list(enumerate(seq)))}  # first visit of each name
    present = [e for e in essential if e in where]
    missing = [e for e in essential if e not in where]
    disorder = [(a, b) for i, a in enumerate(present) for b in present[i + 1:] if where[a] > where[b]]
    matched = _longest_in_order([where[e] for e in present])
    passed = not missing and not disorder
    coverage = matched / len(essential) if essential else 1.0
    return Outcome(passed, coverage, matched, missing, disorder, _explain(essential, where, missing, disorder),
                   _too_slow(seq, scenario, slack), _failure_paths(seq, scenario))


def _explain(essential: list[str], where: dict[str, int], missing: list[str],
             disorder: list[tuple[str, str]]) -> str:
    if missing:
        first = missing[0]
        before = [e for e in essential[: essential.index(first)] if e in where]
        text = f"State '{first}' never reached" + (f" after '{before[-1]}'" if before else "")
        if len(missing) > 1:
            text += f" (also missing: {', '.join(repr(m) for m in missing[1:])})"
        return text
    if disorder:
        a, b = disorder[0]
        more = f" ({len(disorder) - 1} more pair(s) out of order)" if len(disorder) > 1 else ""
        return f"State '{b}' reached before '{a}', which must come first{more}"
    return f"all {len(essential)} essential states reached in order"


def _too_slow(seq: Sequence[Visit], scenario: ScenarioModel, slack: float) -> list[str]:
    out: list[str] = []
    for v in seq:
        spec = scenario.state(v.name)
        if spec is None or not spec.essential or not spec.max_duration_ms:
            continue
        took = v.step.duration_ns / 1e6
        bound = spec.max_duration_ms * slack
        if took > bound:
            out.append(f"'{v.name}' took {took:.1f} ms (learned bound {bound:.1f} ms)")
    return out


def _failure_paths(seq: Sequence[Visit], scenario: ScenarioModel) -> list[str]:
    bad = {(t["from"], t["to"]) for t in scenario.failure_transitions}
    path = [START, *(v.name for v in seq), ACCEPT]
    return [f"{a} -> {b}" for a, b in dict.fromkeys(zip(path, path[1:], strict=False)) if (a, b) in bad]


def check_runs(runs: Sequence[RunSteps], model: Model, model_path: str) -> pa.Table:
    """One ``validations`` row per run of the model's agent; ``WrongAgent`` when there is none."""
    mine = [r for r in runs if r.agent == model.agent]
    if not mine:
        raise WrongAgent(model_path, model.agent, agents_of(runs))
    now = time.time_ns()
    rows = [_row(r, model, model_path, now) for r in mine]
    logger.info("checked %d runs against %s (%d of other agents skipped)", len(mine), model_path,
                len(runs) - len(mine))
    return pa.Table.from_pylist(rows, schema=VALIDATIONS_V1)


def _row(run: RunSteps, model: Model, model_path: str, now: int) -> dict[str, Any]:
    scenario = model.scenarios.get(run.scenario)
    if scenario is None:
        known = ", ".join(sorted(model.scenarios))
        outcome = Outcome(None, None, 0, [], [], f"no model for scenario '{run.scenario}' (the model has {known})",
                          [], [])
    else:
        outcome = judge(visits(run, model.state, model.merge, scenario.renames), scenario, model.duration_slack)
    return {
        "run_key": run.run_key, "agent": run.agent, "agent_version": run.agent_version, "scenario": run.scenario,
        "trace_ids": run.trace_ids, "passed": outcome.passed, "coverage": outcome.coverage,
        "essential_states": len(scenario.essential) if scenario else None, "matched_states": outcome.matched,
        "missing": outcome.missing,
        "out_of_order": [{"expected_first": a, "expected_second": b} for a, b in outcome.out_of_order],
        "explanation": outcome.explanation, "too_slow": outcome.too_slow, "failure_paths": outcome.failure_paths,
        "run_failed": not run.passed, "model": model_path, "state": model.state,
        "start_time_unix_nano": run.start_ns, "checked_unix_nano": now,
    }


def write_validations(table: pa.Table, data: Path) -> Path:
    """Replace the ``validations`` table of the store with ``table``."""
    return write_parquet_atomic(table, table_dir(data, TABLE), stem=TABLE)
