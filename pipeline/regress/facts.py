"""Per-case metric values of one side, read from the store through the named queries.

Each definition is the one of the query that owns it: workflow score, pass/fail, duration and root
cause per trace from ``trace_summary``; a step's score from the ``workflow_weights`` macro of
``_failure_graph.sql`` (lowest score, human labels override; unscored steps are left out); failed
steps and their taxonomy from ``failures``; tokens from the ``spans`` columns; cost from the
``span_costs`` macro of ``_costs.sql`` (the price list ``step_stats`` uses). A case's value is
the mean over its traces (or steps); the counting families (``step_visits``, ``failure_rate``,
``root_cause``) are 0 for a case without such a step, so a step that disappears reads as a drop.

``selection_connection`` opens the store's views with ``traces`` and ``spans`` shadowed by temporary
tables of the selected traces only, so every named query (and the views that semi-join ``traces``)
reads the two sides and nothing else of a large store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa

from tracedag import queries
from tracedag.pipeline.store import procdb
from tracedag.pipeline.store.querying import bind_params, query_doc
from tracedag.pipeline.store.views import connect
from tracedag.schemas.errors import QueryFailed

_STEPS_SQL = """
select n.trace_id, cast(n.step_type as varchar) as step_type, n.step_name, n.duration_ns / 1e6 as duration_ms,
       greatest(w.score, 1.0) as score
from dag_nodes n
left join workflow_weights((select list(trace_id) from traces), -1.0) w
       on w.trace_id = n.trace_id and w.span_id = n.span_id
"""
_TOKENS_SQL = """
select trace_id,
       case when count(input_tokens) + count(output_tokens) > 0
            then sum(coalesce(input_tokens, 0) + coalesce(output_tokens, 0)) end as tokens
from spans group by trace_id
"""
# USD per trace: the spans' tokens at the price list of queries/_costs.sql (null without token counts)
_COST_SQL = """
select trace_id, sum(cost_usd) as cost_usd
from span_costs((select list(trace_id) from traces), $default_input_per_mtok, $default_output_per_mtok)
group by trace_id
"""

# structural validation (``tracedag validate check``): the latest verdict on each selected trace's run
_VALIDATION_SQL = """
select trace_id, arg_max(passed, checked_unix_nano)::double as validation_pass_rate
from (select unnest(trace_ids) as trace_id, passed, checked_unix_nano from validations where passed is not null)
semi join traces using (trace_id)
group by trace_id
"""


@dataclass(frozen=True)
class StoreFacts:
    """What the store says about every built trace, once per regress run."""

    traces: pl.DataFrame
    steps: pl.DataFrame
    failures: pl.DataFrame


def _frame(table: pa.Table) -> pl.DataFrame:
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def selection_connection(data: Path, trace_ids: Sequence[str]) -> duckdb.DuckDBPyConnection:
    """The store's views, with ``traces`` and ``spans`` limited to ``trace_ids`` (temporary tables)."""
    con = connect(data)
    try:
        con.execute("set enable_progress_bar = false")
        con.execute("create temp table selected as select unnest($ids::varchar[]) as trace_id", {"ids": list(trace_ids)})
        con.execute("create temp table traces as select * from main.traces semi join selected using (trace_id)")
        con.execute("create temp table spans as select * from main.spans semi join selected using (trace_id)")
    except duckdb.Error as e:
        con.close()
        raise QueryFailed("regress selection", str(e).strip().splitlines()[0]) from e
    return con


def _named(con: duckdb.DuckDBPyConnection, name: str, params: Mapping[str, str]) -> pl.DataFrame:
    """A named query (``queries/<name>.sql``) on ``con``, its parameters bound as ``tracedag query`` does."""
    return _sql(con, name, queries.load(name), bind_params(query_doc(name), params))


def _sql(con: duckdb.DuckDBPyConnection, label: str, sql: str, params: Mapping[str, object] | None = None,
         ) -> pl.DataFrame:
    try:
        return _frame(con.sql(sql, params=dict(params) if params else None).to_arrow_table())
    except duckdb.Error as e:
        raise QueryFailed(label, str(e).strip().splitlines()[0]) from e


def load_facts(con: duckdb.DuckDBPyConnection, fail_threshold: float, pass_threshold: float,
               default_prices: tuple[float, float] = (0.0, 0.0)) -> StoreFacts:
    """Run the named queries once over the (selected) traces on ``con``; ``default_prices`` (USD per 1M
    input, output tokens) price a model the price list does not know."""
    params = {"fail_threshold": str(fail_threshold), "pass_threshold": str(pass_threshold)}
    summary = _named(con, "trace_summary", params).select(
        "trace_id", "workflow_score", pl.col("passed").cast(pl.Float64), "duration_ms", "root_cause_step",
        "root_cause_type")
    tokens = _sql(con, "tokens", _TOKENS_SQL)
    cost = _sql(con, "cost", _COST_SQL, {"default_input_per_mtok": float(default_prices[0]),
                                         "default_output_per_mtok": float(default_prices[1])})
    steps = _sql(con, "steps", _STEPS_SQL)
    failures = _named(con, "failures", {"fail_threshold": str(fail_threshold)}).select(
        "trace_id", pl.col("taxonomy_l1").fill_null("unclassified").alias("category"))
    traces = summary.join(tokens, on="trace_id", how="left").join(cost, on="trace_id", how="left").join(
        _validations(con), on="trace_id", how="left")
    return StoreFacts(traces, steps, failures)


def _validations(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Structural validation verdicts (1.0 passed, 0.0 failed) of the selected traces, when the store has them."""
    has = con.execute(f"select count(*) from duckdb_views() where view_name = 'validations' and {procdb.SEEN}").fetchall()
    if not has[0][0]:
        return pl.DataFrame(schema={"trace_id": pl.String, "validation_pass_rate": pl.Float64})
    return _sql(con, "validations", _VALIDATION_SQL)


def case_values(facts: StoreFacts, cases: pl.DataFrame) -> pl.DataFrame:
    """Long table ``case, metric, value`` for one side; ``cases`` maps ``trace_id -> case``."""
    traces = cases.join(facts.traces, on="trace_id", how="inner")
    steps = cases.join(facts.steps, on="trace_id", how="inner").with_columns(
        pl.concat_str([pl.col("step_type").fill_null("other"), pl.lit(":"), pl.col("step_name").fill_null("?")])
        .alias("step_key"))
    failures = cases.join(facts.failures, on="trace_id", how="inner")
    sizes = traces.group_by("case").agg(pl.len().alias("n_traces")).join(
        steps.group_by("case").agg(pl.len().alias("n_steps")), on="case", how="left").fill_null(0)
    parts = [_trace_level(traces), _step_level(steps, "type", "step_type"), _step_level(steps, "name", "step_key"),
             _visits(steps, sizes, "type", "step_type"), _visits(steps, sizes, "name", "step_key"),
             _shares(failures, sizes, "failure_rate", "category", "n_steps"),
             _shares(traces.filter(pl.col("root_cause_step").is_not_null()).with_columns(
                 pl.concat_str([pl.col("root_cause_type").fill_null("other"), pl.lit(":"),
                                pl.col("root_cause_step")]).alias("root")),
                 sizes, "root_cause", "root", "n_traces")]
    return pl.concat([p.select("case", "metric", pl.col("value").cast(pl.Float64)) for p in parts])


def _trace_level(traces: pl.DataFrame) -> pl.DataFrame:
    wide = traces.group_by("case").agg(
        pl.col("workflow_score").mean(), pl.col("passed").mean().alias("pass_rate"),
        pl.col("duration_ms").median().alias("latency_p50"),
        pl.col("duration_ms").quantile(0.95, interpolation="linear").alias("latency_p95"),
        pl.col("tokens").mean(), pl.col("cost_usd").mean(), pl.col("validation_pass_rate").mean(),
    )
    return wide.unpivot(index="case", variable_name="metric", value_name="value")


def _label(family: str, by: str, column: str) -> pl.Expr:
    """``step_score[type=tool]`` for a type, ``step_score[tool=calendar_search]`` for a name."""
    if by == "type":
        return pl.format(family + "[type={}]", pl.col(column))
    return pl.format(family + "[{}]", pl.col(column).str.replace(":", "="))


def _step_level(steps: pl.DataFrame, by: str, column: str) -> pl.DataFrame:
    grouped = steps.filter(pl.col(column).is_not_null()).group_by("case", column).agg(
        pl.col("score").mean().alias("step_score"),
        pl.col("duration_ms").quantile(0.95, interpolation="linear").alias("step_latency_p95"),
    )
    return pl.concat([
        grouped.select("case", _label(family, by, column).alias("metric"), pl.col(family).alias("value"))
        for family in ("step_score", "step_latency_p95")
    ])


def _visits(steps: pl.DataFrame, sizes: pl.DataFrame, by: str, column: str) -> pl.DataFrame:
    counts = steps.group_by("case", column).agg(pl.len().alias("n"))
    return _fill(counts, sizes, column, "n_traces").select(
        "case", _label("step_visits", by, column).alias("metric"), "value")


def _shares(rows: pl.DataFrame, sizes: pl.DataFrame, family: str, column: str, per: str) -> pl.DataFrame:
    counts = rows.group_by("case", column).agg(pl.len().alias("n"))
    label = (pl.format(family + "[category={}]", pl.col(column)) if family == "failure_rate"
             else _label(family, "name", column))
    return _fill(counts, sizes, column, per).select("case", label.alias("metric"), "value")


def _fill(counts: pl.DataFrame, sizes: pl.DataFrame, column: str, per: str) -> pl.DataFrame:
    """Every case x every key seen: count / case size, 0 where the case has none."""
    keys = counts.select(column).unique()
    grid = sizes.join(keys, how="cross").join(counts, on=["case", column], how="left")
    return grid.with_columns((pl.col("n").fill_null(0) / pl.col(per)).alias("value")).filter(pl.col(per) > 0)
