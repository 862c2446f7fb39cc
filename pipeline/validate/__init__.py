"""Structural validation over a store: the library behind ``tracedag validate learn`` and ``check``.

``learn`` reads the runs (``runs``), learns one skeleton per scenario from the passing
runs of one agent (``learning``) and returns the model (``model``); ``check`` reads
a model, checks the runs against it (``checking``) and writes the ``validations`` table.

Replays (``tracedag replay`` runs: their spans carry ``tracedag.source_trace_id``) are left out of
learning unless ``LearnOptions.include_replays``: a model describes the traffic, and the replays are
what gets checked against it. A replay keeps its source's ``scenario_id``; a replay of a conversation
without one (its scenario is then the source conversation) is checked under its source run's
scenario when the model has no scenario of its own name.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracedag.pipeline.store.views import connect
from tracedag.pipeline.validate.checking import check_runs, write_validations
from tracedag.pipeline.validate.learning import MERGES, LearnOptions, learn_model
from tracedag.pipeline.validate.model import Model, diff, load_model
from tracedag.pipeline.validate.runs import STATES, RunSteps, load_run_steps
from tracedag.pipeline.validate.semantic import SameStepAsker
from tracedag.schemas.errors import TracedagError

logger = logging.getLogger(__name__)


def read_model(path: Path) -> Model:
    """Load and check a model file (``ModelInvalid`` names a bad field)."""
    return load_model(path, tuple(STATES), MERGES)


def read_runs(data: Path, selection: str | None = None, by: str | None = None) -> list[RunSteps]:
    """The runs of the store (those ``selection`` picks), scenario by ``by`` if given."""
    con = connect(data)
    try:
        con.execute("set enable_progress_bar = false")
        return load_run_steps(con, by, selection)
    finally:
        con.close()


@dataclass
class Learned:
    """A learned model, what changed against the previous one, and how many runs were read."""

    model: Model
    runs_read: int
    changes: list[str] = field(default_factory=list)
    updated: bool = False
    """Learned over a previous model (``changes`` lists what differs)."""


class OnlyReplays(TracedagError):  # type: ignore[misc,unused-ignore]
    """Every selected run is a replay, and replays are not learned from unless asked."""


# the replayed traces (tracedag replay labels them with the trace they replay) and their source traces
_REPLAYS_SQL = """
select trace_id, max(nullif(coalesce(attributes['tracedag.source_trace_id'],
                                     resource_attributes['tracedag.source_trace_id']), '')) as source
from spans group by trace_id having source is not null
"""


def replay_sources(data: Path) -> dict[str, str]:
    """``trace id -> source trace id`` of every replayed trace in the store."""
    con = connect(data, shared_macros=False)  # plain views: this SQL calls no shared query macro
    try:
        con.execute("set enable_progress_bar = false")
        return {str(t): str(s) for t, s in con.execute(_REPLAYS_SQL).fetchall()}
    finally:
        con.close()


def without_replays(runs: list[RunSteps], replayed: Mapping[str, str]) -> list[RunSteps]:
    """The runs none of whose traces is a replay."""
    return [r for r in runs if not any(t in replayed for t in r.trace_ids)]


def learn(data: Path, options: LearnOptions, selection: str | None = None, by: str | None = None,
          previous: Model | None = None, asker: SameStepAsker | None = None) -> Learned:
    """Learn a model from the passing runs in ``data`` (replays left out unless ``options.include_replays``);
    with ``previous``, keep its edits and list changes; ``asker`` is the LLM of ``merge="semantic"``."""
    runs = read_runs(data, selection, by)
    origin: dict[str, Any] = {"data": str(data), "runs": selection, "by": by,
                              "at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if not options.include_replays:
        kept = without_replays(runs, replay_sources(data))
        if runs and not kept:
            raise OnlyReplays(f"the {len(runs)} selected run(s) are all replays (tracedag replay): learn from the "
                              "traffic they replay, or pass --include-replays to learn from them")
        origin["replays_left_out"] = len(runs) - len(kept)
        runs = kept
    model = learn_model(runs, options, origin, previous, asker)
    changes = diff(previous, model) if previous is not None else []
    return Learned(model, len(runs), changes, updated=previous is not None)


def check(data: Path, model_path: Path, selection: str | None = None, write: bool = True) -> pa.Table:
    """Check the runs in ``data`` against the model at ``model_path``; write the ``validations`` table."""
    model = read_model(model_path)
    by = model.learned_from.get("by")
    runs = read_runs(data, selection, by if isinstance(by, str) else None)
    as_sources(data, runs, model, by if isinstance(by, str) else None)
    table = check_runs(runs, model, str(model_path))
    if write:
        write_validations(table, data)
    return table


def as_sources(data: Path, runs: list[RunSteps], model: Model, by: str | None) -> None:
    """Give each replay whose scenario the model lacks the scenario of the run it replays, when the
    model has that one (a replay of an unlabelled conversation is named after it; its source's
    scenario is what the model learned)."""
    unknown = [r for r in runs if r.scenario not in model.scenarios]
    replayed = replay_sources(data) if unknown else {}
    lost = [r for r in unknown if any(t in replayed for t in r.trace_ids)]
    if not lost:
        return
    scenario_of = {t: r.scenario for r in read_runs(data, None, by) for t in r.trace_ids}
    for run in lost:
        source = next((replayed[t] for t in run.trace_ids if t in replayed), None)
        scenario = scenario_of.get(source) if source else None
        if scenario is not None and scenario in model.scenarios:
            logger.info("run %s (a replay) checked under its source's scenario %s", run.run_key, scenario)
            run.scenario = scenario
