"""Determinism over replays and variants, and graph utility: the library behind ``tracedag determinism``.

``analyze`` reads the runs from the store (``trajectories.load_runs``), registers them as the
relations ``run_paths`` and ``node_visits`` and runs the named queries ``determinism``,
``determinism_agent``, ``node_utility``, ``edge_utility`` and ``agent_utility`` over them. Response
consistency (judge or offline, see ``response``) is added to the determinism rows in Python.
``write_outputs`` writes every table (the two relations included, so the named queries can be
run again over the store) as Parquet, and one picture per agent.

Every step is linear in the runs: the two pairwise means (replay coverage in SQL, offline response
consistency in Python) are exact up to 40,000 pairs of distinct sets per group and estimated from
a seeded sample of 40,000 pairs above that (``pairs``); the rows say which figures are estimates
(``coverage_estimated``, ``response_consistency_method``). ``progress`` callbacks report each
phase (see ``Progress``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

import duckdb
import pyarrow as pa

from tracedag import queries
from tracedag.pipeline.analysis.response import (
    Agreement,
    ResponseScorer,
    TokenJaccardScorer,
    replay_consistency,
    variant_consistency,
)
from tracedag.pipeline.analysis.trajectories import Run, load_runs, runs_table, visits_table
from tracedag.pipeline.progress import Advance, no_progress
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.views import connect
from tracedag.schemas.agent_graph import AgentGraph, graph_for
from tracedag.schemas.errors import QueryFailed
from tracedag.schemas.layout import pictures_dir, table_dir
from tracedag.schemas.spans import SCHEMA_KEY

logger = logging.getLogger(__name__)

QUERIES = ("determinism", "determinism_agent", "node_utility", "edge_utility", "agent_utility")
"""The named queries run over the relations ``run_paths`` and ``node_visits``, in this order."""
GroupKey = tuple[str, str | None, str]
Progress: TypeAlias = Advance


@dataclass
class AnalysisResult:
    """Every output table of one analysis, plus the runs it was computed from."""

    tables: dict[str, pa.Table]
    runs: list[Run]
    graphs: tuple[AgentGraph, ...] = ()
    pictures: dict[str, Path] = field(default_factory=dict)

    def graph_of(self, agent: str) -> AgentGraph | None:
        """The agent graph used for ``agent`` (see ``agent_graph.graph_for``)."""
        return graph_for(self.graphs, agent)


def _run_query(con: duckdb.DuckDBPyConnection, name: str) -> pa.Table:
    try:
        return con.sql(queries.load(name)).to_arrow_table()
    except duckdb.Error as e:
        raise QueryFailed(name, str(e)) from e


def _row_agreement(row: dict[str, object], members: list[Run], scorer: ResponseScorer) -> Agreement | None:
    """The response consistency of one determinism row (replays, or variants against the base)."""
    base = [r for r in members if r.is_base]
    if row["comparison"] == "replays":
        key = f"{row['agent']}|{row['agent_version']}|{row['scenario']}|response"
        return replay_consistency(scorer, [r.final_response for r in base], key)
    # each variant against each exact replay (EDGE), not against one reference reply
    value = variant_consistency(scorer, [r.final_response for r in base],
                                [r.final_response for r in members if not r.is_base])
    return None if value is None else Agreement(value, scorer.method)


def _response_columns(det: pa.Table, runs: list[Run], scorer: ResponseScorer, progress: Progress) -> pa.Table:
    """Add response_consistency and response_consistency_method to the determinism rows."""
    groups: dict[GroupKey, list[Run]] = defaultdict(list)
    for r in runs:
        groups[(r.agent, r.agent_version, r.scenario)].append(r)
    found: list[Agreement | None] = []
    progress("response consistency", 0, det.num_rows)
    for row in det.to_pylist():
        found.append(_row_agreement(row, groups[(row["agent"], row["agent_version"], row["scenario"])], scorer))
        progress("response consistency", 1, det.num_rows)
    values = [a.value if a is not None else None for a in found]
    methods = [a.method if a is not None else None for a in found]
    det = det.append_column("response_consistency", pa.array(values, pa.float64()))
    return det.append_column("response_consistency_method", pa.array(methods, pa.string()))


def analyze(
    data: Path,
    group_by: str | None = None,
    graphs: Sequence[AgentGraph] = (),
    scorer: ResponseScorer | None = None,
    progress: Progress = no_progress,
) -> AnalysisResult:
    """Compute determinism and utility tables over every run in ``data``.

    ``graphs``: agent graphs for adherence and the pictures; each agent uses the graph named like
    it, else the only graph given (``agent_graph.graph_for``).
    """
    con = connect(data, shared_macros=False)  # run_steps calls no shared query macro
    try:
        con.execute("set enable_progress_bar = false")  # the caller's bars, not DuckDB's
        progress("reading run steps", 0, None)
        runs = load_runs(con, group_by, lambda n: progress("reading run steps", n, None))
    finally:
        con.close()
    return analyze_runs(runs, graphs, scorer, progress)


def analyze_runs(
    runs: list[Run], graphs: Sequence[AgentGraph] = (), scorer: ResponseScorer | None = None,
    progress: Progress = no_progress,
) -> AnalysisResult:
    """Compute the same tables over runs already in memory (tests, simulations)."""
    con = duckdb.connect(":memory:")
    try:
        con.execute("set enable_progress_bar = false")
        return _analyze_runs(con, runs, tuple(graphs), scorer or TokenJaccardScorer(), progress)
    finally:
        con.close()


def _analyze_runs(
    con: duckdb.DuckDBPyConnection, runs: list[Run], graphs: tuple[AgentGraph, ...], scorer: ResponseScorer,
    progress: Progress,
) -> AnalysisResult:
    steps = len(QUERIES) + 1
    progress("determinism and utility queries", 0, steps)
    tables = {"run_paths": runs_table(runs), "node_visits": visits_table(runs, graphs)}
    con.register("run_paths", tables["run_paths"])
    con.register("node_visits", tables["node_visits"])
    progress("determinism and utility queries", 1, steps)
    det = _run_query(con, "determinism")
    progress("determinism and utility queries", 1, steps)
    det = _response_columns(det, runs, scorer, progress)
    con.register("determinism", det)
    tables["determinism"] = det
    for name in QUERIES[1:]:
        tables[name] = _run_query(con, name)
        progress("determinism and utility queries", 1, steps)
    logger.info("determinism over %d runs, %d scenario rows", len(runs), det.num_rows)
    return AnalysisResult(tables, runs, graphs)


def _out_path(data: Path, output: Path | None, name: str) -> tuple[Path, str]:
    if output is not None:
        return output, name
    return table_dir(data, name), name


def write_outputs(
    result: AnalysisResult, data: Path, output: Path | None = None, progress: Progress = no_progress
) -> dict[str, Path]:
    """Write each table as Parquet (replacing the previous one) and one SVG picture per agent."""
    from tracedag.pipeline.analysis.picture import write_pictures

    written: dict[str, Path] = {}
    steps = len(result.tables) + 1
    for name, table in result.tables.items():
        directory, stem = _out_path(data, output, name)
        tagged = table.replace_schema_metadata({SCHEMA_KEY: f"{name}/v1".encode()})
        written[name] = write_parquet_atomic(tagged, directory, stem=stem)
        progress("writing tables and pictures", 1, steps)
    folder = output if output is not None else pictures_dir(data)
    result.pictures = write_pictures(result, folder)
    progress("writing tables and pictures", 1, steps)
    written.update({f"picture {agent}": p for agent, p in result.pictures.items()})
    return written
