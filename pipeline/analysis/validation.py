"""Structural validation over a store: the library behind ``tracedag validate learn`` and ``check``.

``learn`` reads the runs (``validate_runs``), learns one skeleton per scenario from the passing
runs of one agent (``validate_learn``) and returns the model (``validate_model``); ``check`` reads
a model, checks the runs against it (``validate_check``) and writes the ``validations`` table.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from tracedag.pipeline.analysis.validate_check import check_runs, write_validations
from tracedag.pipeline.analysis.validate_learn import MERGES, LearnOptions, learn_model
from tracedag.pipeline.analysis.validate_model import Model, diff, load_model
from tracedag.pipeline.analysis.validate_runs import STATES, RunSteps, load_run_steps
from tracedag.pipeline.analysis.validate_semantic import SameStepAsker
from tracedag.pipeline.store.views import connect

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


def learn(data: Path, options: LearnOptions, selection: str | None = None, by: str | None = None,
          previous: Model | None = None, asker: SameStepAsker | None = None) -> Learned:
    """Learn a model from the passing runs in ``data``; with ``previous``, keep its edits and list changes;
    ``asker`` is the LLM of ``merge="semantic"``."""
    runs = read_runs(data, selection, by)
    origin = {"data": str(data), "runs": selection, "by": by,
              "at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    model = learn_model(runs, options, origin, previous, asker)
    changes = diff(previous, model) if previous is not None else []
    return Learned(model, len(runs), changes, updated=previous is not None)


def check(data: Path, model_path: Path, selection: str | None = None, write: bool = True) -> pa.Table:
    """Check the runs in ``data`` against the model at ``model_path``; write the ``validations`` table."""
    model = read_model(model_path)
    by = model.learned_from.get("by")
    runs = read_runs(data, selection, by if isinstance(by, str) else None)
    table = check_runs(runs, model, str(model_path))
    if write:
        write_validations(table, data)
    return table
