"""Determinism of each side per scenario: the named query ``determinism`` over the side's runs.

The runs (conversations) come from ``analysis.trajectories.load_runs``; a run belongs to a side
when its traces are in the side's selection. The ``determinism`` query's exact-replay rows give
node / action / action+input consistency and coverage per agent and scenario; a side's value for a
scenario is the mean over its agents, so two agent variants can be compared on the same scenarios.
"""

from __future__ import annotations

import duckdb
import polars as pl

from tracedag import queries
from tracedag.pipeline.analysis.trajectories import Run, load_runs, runs_table

MEASURES = ("node_consistency", "node_coverage", "action_consistency", "action_coverage",
            "action_input_consistency", "action_input_coverage")


def load_all_runs(con: duckdb.DuckDBPyConnection) -> list[Run]:
    """Every run the views on ``con`` hold (one read, shared by both sides)."""
    return load_runs(con)


def scenario_values(runs: list[Run], trace_ids: set[str]) -> pl.DataFrame:
    """Long table ``case (= scenario), metric, value`` for the runs whose traces are all selected."""
    mine = [r for r in runs if r.trace_ids and all(t in trace_ids for t in r.trace_ids)]
    empty = pl.DataFrame(schema={"case": pl.String, "metric": pl.String, "value": pl.Float64})
    if not mine:
        return empty
    con = duckdb.connect(":memory:")
    try:
        con.register("run_paths", runs_table(mine))
        frame = pl.from_arrow(con.sql(queries.load("determinism")).to_arrow_table())
    finally:
        con.close()
    assert isinstance(frame, pl.DataFrame)
    rows = frame.filter(pl.col("comparison") == "replays")
    if rows.is_empty():
        return empty
    wide = rows.group_by("scenario").agg(*(pl.col(m).mean() for m in MEASURES))
    return wide.unpivot(index="scenario", variable_name="measure", value_name="value").select(
        pl.col("scenario").alias("case"), pl.format("determinism[{}]", pl.col("measure")).alias("metric"),
        pl.col("value").cast(pl.Float64))
