"""``GET /metrics``: analysis aggregates in the Prometheus text format (version 0.0.4).

The figures are computed once per build state (``statekey.state_key``: a build, a scoring round or a
compaction changes it) and the text is kept; a scrape between two builds costs one directory
walk. Every family has one sample per label set. ``agent`` is always the agent name (the one
``run_steps`` uses: the earliest ``agent_name`` of a trace's spans, else its service name) and
``service`` the OpenTelemetry service name. Families (all gauges, labels in brackets):

- ``tracedag_traces_built`` - built traces (latest build each);
- ``tracedag_failures{agent,service,step_type,category}`` - failed steps not recovered (failures.sql);
- ``tracedag_root_causes{agent,service,step_type,category}`` - failed traces by root cause (trace_summary);
- ``tracedag_workflow_score{agent,service}`` - histogram of workflow scores (1..5);
- ``tracedag_determinism{agent,service,agent_version,comparison,kind}`` - node/action/action-input
  consistency across runs of a scenario (0..1, determinism_agent);
- ``tracedag_response_consistency{agent,service,agent_version,comparison}`` - agreement of the
  responses across runs (1..4, determinism_agent);
- ``tracedag_step_latency_p50_seconds``/``_p90_seconds{step_type,step_name}`` - step durations
  (step_stats);
- ``tracedag_build_lag_seconds{agent,service}`` - histogram of last span received -> trace built
  (the acknowledgement-to-queryable lag of the live analysis);
- ``tracedag_metrics_compute_seconds`` - time the last recomputation took.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import duckdb

from tracedag import queries
from tracedag.pipeline.serve.data import Store, rerun_if_vanished
from tracedag.pipeline.serve.statekey import state_key
from tracedag.pipeline.serve.tracelist import SPAN_AGENTS_SQL
from tracedag.pipeline.store import current_rounds, freshness, materialized
from tracedag.pipeline.store.files import keep_newest
from tracedag.pipeline.store.querying import bind_params, query_doc
from tracedag.pipeline.store.views import connect, create_views
from tracedag.schemas.layout import state_dir

SCORE_BUCKETS = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0)
LAG_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
_KINDS = ("node_consistency", "action_consistency", "action_input_consistency")
logger = logging.getLogger(__name__)


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Mapping[str, object]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape("" if v is None else v)}"' for k, v in pairs.items()) + "}"


def _family(name: str, kind: str, help_text: str) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]


def _number(v: float) -> str:
    return repr(float(v)) if v != int(v) else str(int(v))


def _histogram(name: str, help_text: str, groups: list[dict[str, Any]], buckets: Iterable[float]) -> list[str]:
    """One histogram per group: its ``agent`` and ``service``, ``counts`` (at or below each bucket, in
    order), ``values`` (summed in their order, as the text always did) and ``n``; groups sorted by labels."""
    lines = _family(name, "histogram", help_text)
    bounds = list(buckets)
    for g in sorted(groups, key=lambda g: (g["agent"], g["service"])):
        labels = {"agent": g["agent"], "service": g["service"]}
        for b, count in zip(bounds, g["counts"], strict=True):
            lines.append(f"{name}_bucket{_labels({**labels, 'le': _number(b)})} {count}")
        lines.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {g['n']}")
        lines.append(f"{name}_sum{_labels(labels)} {_number(round(sum(g['values']), 6))}")
        lines.append(f"{name}_count{_labels(labels)} {g['n']}")
    return lines


def _counts(name: str, help_text: str, rows: list[dict[str, Any]]) -> list[str]:
    """One sample per (agent, service, step type, category) row, sorted by labels (``n`` the count)."""
    lines = _family(name, "gauge", help_text)
    for r in sorted(rows, key=lambda r: (r["agent"], r["service"], r["step_type"], r["category"])):
        labels = {"agent": r["agent"], "service": r["service"], "step_type": r["step_type"], "category": r["category"]}
        lines.append(f"{name}{_labels(labels)} {r['n']}")
    return lines


def compute(data: Path) -> str:
    """The whole exposition text for the store at ``data`` (a full pass: call it once per build state).

    Every family is read on one connection, each named query narrowed to the columns a family needs
    (from its stored rows when the store has them, ``store.materialized``) and aggregated in SQL, so that
    a cold scrape costs one connection and a few column scans, not a Python object per trace. A store whose
    stored rows answer every trace is read through the raw views of the tables read (``READ``) alone.
    """
    def once() -> str:
        con = connect(data, tables=READ)
        try:
            return _compute(con, data, freshness.fresh(con, data))
        finally:
            con.close()
    text: str = rerun_if_vanished(once)
    return text


READ = ("traces", "spans", "dag_nodes", "determinism",
        *(materialized.table_name(n) for n in ("trace_summary", "failures")), materialized.STATE)
"""The tables a fresh store's figures read (the stored rows of trace_summary and failures, the builds, the
spans' agent names, the steps' durations; determinism_agent's table when written)."""


def _keep(con: duckdb.DuckDBPyConnection, data: Path, table: str, name: str, columns: str, tail: str = "",
          fresh: bool = False) -> None:
    """Temporary table ``table``: ``select <columns> from <name's result> s <tail>`` (defaults): on a ``fresh``
    store its stored rows of every trace (``materialized.reader_sql``, their rounds registered by ``_latest``),
    else its SQL."""
    values = bind_params(query_doc(name), {})
    if fresh and name in materialized.SPECS and materialized.matches(name, values):
        sql = materialized.reader_sql(name, whole=True, current=current_rounds.RELATION)
        values = materialized.reader_values(name, values)
    else:
        sql = queries.load(name)
    con.execute(f"create or replace temp table {table} as select {columns} from ({sql.strip().rstrip(';')}) s {tail}",
                values or None)


def _named(con: duckdb.DuckDBPyConnection, data: Path, name: str, columns: str) -> list[dict[str, Any]]:
    """``select <columns> from <name's result>`` (defaults): its SQL (no stored rows: not in ``materialized.SPECS``)."""
    _keep(con, data, "m_named", name, columns)
    return _rows(con, "select * from m_named")


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = con.sql(sql).to_arrow_table().to_pylist()
    return rows


# Each trace's agent name (``who.agent``, else the row's own service name) and service label, as _who gave them.
_AGENT = "coalesce(nullif(w.agent, ''), nullif({t}.service_name, ''), '') as agent, coalesce({t}.service_name, '') as service"

_SUMMARY_COLUMNS = (f"{_AGENT.format(t='s')}, s.root_cause_span_id, s.root_cause_type, s.root_cause_category, "
                    "s.workflow_score, s.start_time_unix_nano, s.trace_id")
"""m_summary: trace_summary's columns the families read, with each trace's labels (joined with m_who once)."""

_FAILED_COLUMNS = (f"{_AGENT.format(t='s')}, coalesce(cast(s.step_type as varchar), '') as step_type, "
                   "coalesce(nullif(s.taxonomy_l1, ''), 'unclassified') as category, count(*) as n")
_FAILED_TAIL = "left join m_who w using (trace_id) where not coalesce(s.recovered, false) group by all"

_ROOTS_SQL = """
select agent, service, coalesce(root_cause_type, '') as step_type, coalesce(root_cause_category, '') as category,
       count(*) as n
from m_summary where coalesce(root_cause_span_id, '') <> '' group by all
"""


def _buckets(value: str, bounds: Iterable[float]) -> str:
    """SQL: the list of how many ``value``s are at or below each bound."""
    return "[" + ", ".join(f"count(*) filter (where {value} <= {float(b)!r})" for b in bounds) + "]"


_SCORES_SQL = f"""
select agent, service, {_buckets('workflow_score', SCORE_BUCKETS)} as counts, count(*) as n,
       list(workflow_score::double order by start_time_unix_nano, trace_id) as values
from m_summary where workflow_score is not null group by all
"""
"""The workflow score histogram: each (agent, service)'s scores in trace_summary's order (their sum is the text's)."""

_LAGS_SQL = f"""
select {_AGENT.format(t='w')}, {_buckets('greatest(0.0, w.lag)', LAG_BUCKETS)} as counts, count(*) as n,
       list(greatest(0.0, w.lag) order by w.trace_id) as values
from m_who w where w.lag is not null group by all
"""


def _compute(con: duckdb.DuckDBPyConnection, data: Path, fresh: bool) -> str:
    t0 = time.perf_counter()
    fresh = _latest(con, data, fresh)
    if not fresh:  # the named queries compute from their SQL, over the refined views and the shared macros
        create_views(con, data, shared_macros=True)
    con.execute(f"create or replace temp table m_who as {_WHO_SQL}")
    _keep(con, data, "m_summary", "trace_summary", _SUMMARY_COLUMNS, "left join m_who w using (trace_id)", fresh)
    _keep(con, data, "m_failed", "failures", _FAILED_COLUMNS, _FAILED_TAIL, fresh)
    lines = _family("tracedag_traces_built", "gauge", "Built traces (latest build of each).")
    lines.append(f"tracedag_traces_built {con.execute('select count(*) from m_summary').fetchall()[0][0]}")
    lines += _counts("tracedag_failures", "Failed steps not recovered, by agent, service, step type and taxonomy category.",
                     _rows(con, "select * from m_failed"))
    lines += _counts("tracedag_root_causes", "Failed traces by agent, service, and their root cause's step type and category.",
                     _rows(con, _ROOTS_SQL))
    lines += _histogram("tracedag_workflow_score", "Workflow score of each built trace (1..5).", _rows(con, _SCORES_SQL),
                        SCORE_BUCKETS)
    lines += _determinism(con, data, _services(_rows(con, "select distinct agent, service from m_summary")))
    lines += _step_latency(con)
    lines += _histogram("tracedag_build_lag_seconds", "Last span received to trace built, per trace (seconds).",
                        _rows(con, _LAGS_SQL), LAG_BUCKETS)
    lines += _family("tracedag_metrics_compute_seconds", "gauge", "Seconds the last recomputation of these figures took.")
    lines.append(f"tracedag_metrics_compute_seconds {time.perf_counter() - t0:.6f}")
    return "\n".join(lines) + "\n"


def _services(rows: list[dict[str, Any]]) -> dict[str, str]:
    """agent name -> its service names (comma separated when an agent runs in several services)."""
    found: dict[str, set[str]] = {}
    for r in rows:
        found.setdefault(r["agent"], set()).add(r["service"])
    return {a: ",".join(sorted(v)) for a, v in found.items()}


def _determinism(con: duckdb.DuckDBPyConnection, data: Path, services: Mapping[str, str]) -> list[str]:
    lines = _family("tracedag_determinism", "gauge",
                    "Consistency across runs of a scenario (0..1): kind = node, action or action-input consistency.")
    response = _family("tracedag_response_consistency", "gauge",
                       "Agreement of the responses across runs of a scenario (1..4 scale).")
    try:
        rows = _named(con, data, "determinism_agent", "*")
    except duckdb.CatalogException:  # no determinism table yet (tracedag determinism writes it)
        return lines + response
    for r in rows:
        labels = {"agent": r.get("agent"), "service": services.get(str(r.get("agent") or ""), ""),
                  "agent_version": r.get("agent_version"), "comparison": r.get("comparison")}
        for kind in _KINDS:
            if r.get(kind) is not None:
                lines.append(f"tracedag_determinism{_labels({**labels, 'kind': kind})} {r[kind]}")
        if r.get("response_consistency") is not None:
            response.append(f"tracedag_response_consistency{_labels(labels)} {r['response_consistency']}")
    return lines + response


# step_stats' 'step' rows narrowed to their latency (its p50_ms/p90_ms: quantile_cont of the duration over
# the steps of every latest build, both quantiles from one sort of each group); the whole query also joins
# scores, tokens and costs (4.5 s of a 5 s scrape on 1M spans). tests/serve/test_metrics_cold.py checks both
# give the same figures.
_LATENCY_SQL = """
select step_type, step_name, q[1] as p50_ms, q[2] as p90_ms
from (select cast(n.step_type as varchar) as step_type, n.step_name,
             quantile_cont(n.duration_ns / 1e6, [0.5, 0.9]) as q, count(*) as steps
      from dag_nodes_all n semi join m_latest t using (trace_id, build_id)
      group by all)
order by steps desc, step_type, step_name  -- step_stats' order
"""


def _step_latency(con: duckdb.DuckDBPyConnection) -> list[str]:
    rows = con.sql(_LATENCY_SQL).to_arrow_table().to_pylist()
    lines: list[str] = []
    for q in ("p50", "p90"):
        name = f"tracedag_step_latency_{q}_seconds"
        lines += _family(name, "gauge", f"{q} of step duration, by step type and name (seconds).")
        for r in rows:
            if r[f"{q}_ms"] is not None:
                labels = _labels({"step_type": r["step_type"], "step_name": r["step_name"]})
                lines.append(f"{name}{labels} {float(r[f'{q}_ms']) / 1000:.6f}")
    return lines


# Each trace's latest build (``latest.LATEST_BUILDS_SQL``) with its service name and build lag: one scan of
# traces_all for every family (the agents, the lags, the step latency).
_LATEST_SQL = """
select trace_id, arg_max(build_id, (built_unix_nano, build_id)) as build_id,
       arg_max(service_name, (built_unix_nano, build_id)) as service_name,
       arg_max((built_unix_nano - last_received_unix_nano) / 1e9, (built_unix_nano, build_id)) as lag
from traces_all group by trace_id
"""

# The same rows on a fresh store: its current rounds' builds are the latest builds (``freshness.freshness``), and
# their traces_all rows are joined instead of every trace's rows aggregated (45 vs 105 ms CPU on 1M spans); when
# traces_all has as many rows as there are current rounds (its Parquet footers say, no column read), those rows are
# the current builds, one each, and are read as they are (~20 ms).
_FRESH_LATEST_SQL = f"""
select c.trace_id, c.build_id, t.service_name, (t.built_unix_nano - t.last_received_unix_nano) / 1e9 as lag
from {current_rounds.RELATION} c join traces_all t on t.trace_id = c.trace_id
where t.build_id = c.build_id
"""
_ONLY_LATEST_SQL = """
select trace_id, build_id, service_name, (built_unix_nano - last_received_unix_nano) / 1e9 as lag from traces_all
"""


def _latest(con: duckdb.DuckDBPyConnection, data: Path, fresh: bool) -> bool:
    """``m_latest``: each trace's latest build, service name and build lag; on a fresh store, its current rounds
    registered (``current_rounds.RELATION``) for the stored rows' readers too (returns whether they were)."""
    current = current_rounds.register(con, data) if fresh else None
    if current is not None:
        rounds = current.table.num_rows
        only = con.execute("select count(*) from traces_all").fetchall()[0][0] == rounds
        con.execute(f"create or replace temp table m_latest as {_ONLY_LATEST_SQL if only else _FRESH_LATEST_SQL}")
        if con.execute("select count(*) from m_latest").fetchall()[0][0] == rounds:
            return True  # one traces_all row per current round: each trace's latest
        logger.info("metrics: a current round's build has several traces_all rows: latest builds aggregated")
    con.execute(f"create or replace temp table m_latest as {_LATEST_SQL}")
    return current is not None


# Per trace: its agent name (tracelist.AGENTS_SQL), service name and build lag.
_WHO_SQL = f"""
select t.trace_id, coalesce(a.agent, t.service_name) as agent, t.service_name, t.lag
from m_latest t left join ({SPAN_AGENTS_SQL}) a using (trace_id)
"""


DISK = "metrics"
"""``<data>/state/metrics/<build state>.prom``: the text of the newest build state computed, for the next process."""


def kept_text(data: Path, state: str) -> str | None:
    """The text computed for the build state ``state`` by an earlier process, if it kept one."""
    path: Path = state_dir(data) / DISK / f"{state}.prom"
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def keep_text(data: Path, state: str, text: str) -> None:
    """Keep ``text`` as the build state ``state``'s; the older states' texts are removed (``files.keep_newest``)."""
    keep_newest(data, state_dir(data) / DISK / f"{state}.prom", text)


def text_of(data: Path, state: str) -> str:
    """The text of the build state ``state``: kept by an earlier process, else computed (and kept when no file
    changed meanwhile, so that the text is exactly that state's)."""
    found = kept_text(data, state)
    if found is not None:
        return found
    text = compute(data)
    if state_key(data) == state:
        keep_text(data, state, text)
    return text


class Metrics:
    """The exposition text of one store, recomputed only when its build state changed.

    A build state's text is also kept on disk (``keep_text``): a server started again on a store that did
    not change since answers its first scrape without computing; any write under ``tables/`` (a build,
    a scoring round, labels, a collection) is a new state, computed again."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def text(self) -> str:
        state = self.store.state()
        text: str = self.store.cache.get(state, "metrics", lambda: text_of(self.store.data, state))
        return text
