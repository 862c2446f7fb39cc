"""``GET /metrics``: analysis aggregates in the Prometheus text format (version 0.0.4).

The figures are computed once per build state (``data.state_key``: a build, a scoring round or a
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
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from tracedag import queries
from tracedag.pipeline.serve.data import Store, rerun_if_vanished, state_key
from tracedag.pipeline.serve.tracelist import SPAN_AGENTS_SQL
from tracedag.pipeline.store import materialized
from tracedag.pipeline.store.files import keep_newest
from tracedag.pipeline.store.latest import LATEST_BUILDS_SQL
from tracedag.pipeline.store.querying import bind_params, query_doc
from tracedag.pipeline.store.views import connect, create_shared_macros
from tracedag.schemas.layout import state_dir

SCORE_BUCKETS = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0)
LAG_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
_KINDS = ("node_consistency", "action_consistency", "action_input_consistency")
Labels = tuple[tuple[str, str], ...]
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


def _histogram(name: str, help_text: str, groups: dict[Labels, list[float]], buckets: Iterable[float]) -> list[str]:
    lines = _family(name, "histogram", help_text)
    bounds = list(buckets)
    for key in sorted(groups):
        values, labels = groups[key], dict(key)
        for b in bounds:
            lines.append(f"{name}_bucket{_labels({**labels, 'le': _number(b)})} {sum(1 for v in values if v <= b)}")
        lines.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {len(values)}")
        lines.append(f"{name}_sum{_labels(labels)} {_number(round(sum(values), 6))}")
        lines.append(f"{name}_count{_labels(labels)} {len(values)}")
    return lines


def _counts(name: str, help_text: str, counter: Counter[tuple[str, str, str, str]]) -> list[str]:
    lines = _family(name, "gauge", help_text)
    for (agent, service, step, category), n in sorted(counter.items()):
        labels = {"agent": agent, "service": service, "step_type": step, "category": category}
        lines.append(f"{name}{_labels(labels)} {n}")
    return lines


def _who(agents: Mapping[str, str], trace_id: str, service: str | None) -> tuple[str, str]:
    """(agent name, service name) of a trace."""
    return agents.get(trace_id) or service or "", service or ""


def compute(data: Path) -> str:
    """The whole exposition text for the store at ``data`` (a full pass: call it once per build state).

    Every family is read on one connection, each named query narrowed to the columns a family needs
    (from its stored rows when the store has them, ``store.materialized``), so that a cold scrape costs
    one connection and a few column scans instead of a connection and a full result per query.
    """
    def once() -> str:
        con = connect(data, shared_macros=False)
        try:
            if not materialized.fresh(con, data):  # the named queries compute from their SQL, which calls them
                create_shared_macros(con)
            return _compute(con, data)
        finally:
            con.close()
    text: str = rerun_if_vanished(once)
    return text


def _named(con: duckdb.DuckDBPyConnection, data: Path, name: str, columns: str, tail: str = "") -> list[dict[str, Any]]:
    """``select <columns> from <name's result> <tail>`` (defaults): its stored rows when current, else its SQL."""
    values = bind_params(query_doc(name), {})
    sql, params = materialized.named_statement(con, data, name, values) or (queries.load(name), values)
    rows: list[dict[str, Any]] = con.sql(f"select {columns} from ({sql.strip().rstrip(';')}) {tail}",
                                         params=params or None).to_arrow_table().to_pylist()
    return rows


def _compute(con: duckdb.DuckDBPyConnection, data: Path) -> str:
    t0 = time.perf_counter()
    summary = _named(con, data, "trace_summary", "trace_id, service_name, root_cause_span_id, root_cause_type, "
                                                 "root_cause_category, workflow_score")
    failures = _named(con, data, "failures", "trace_id, service_name, step_type, taxonomy_l1, count(*) as n",
                      "where not coalesce(recovered, false) group by all")
    who = con.sql(_WHO_SQL).to_arrow_table()
    agents = dict(zip(who["trace_id"].to_pylist(), (a or "" for a in who["agent"].to_pylist()), strict=True))
    lines = _family("tracedag_traces_built", "gauge", "Built traces (latest build of each).")
    lines.append(f"tracedag_traces_built {len(summary)}")
    failed: Counter[tuple[str, str, str, str]] = Counter()
    for f in failures:
        failed[(*_who(agents, f["trace_id"], f["service_name"]), f["step_type"] or "",
                f["taxonomy_l1"] or "unclassified")] += int(f["n"])
    lines += _counts("tracedag_failures", "Failed steps not recovered, by agent, service, step type and taxonomy category.",
                     failed)
    lines += _counts("tracedag_root_causes", "Failed traces by agent, service, and their root cause's step type and category.",
                     Counter((*_who(agents, s["trace_id"], s["service_name"]), s["root_cause_type"] or "",
                              s["root_cause_category"] or "") for s in summary if s["root_cause_span_id"]))
    scores: dict[Labels, list[float]] = {}
    for s in summary:
        if s["workflow_score"] is not None:
            agent, service = _who(agents, s["trace_id"], s["service_name"])
            scores.setdefault((("agent", agent), ("service", service)), []).append(float(s["workflow_score"]))
    lines += _histogram("tracedag_workflow_score", "Workflow score of each built trace (1..5).", scores, SCORE_BUCKETS)
    lines += _determinism(con, data, _services(agents, summary))
    lines += _step_latency(con)
    lines += _histogram("tracedag_build_lag_seconds", "Last span received to trace built, per trace (seconds).",
                        _lags(who, agents), LAG_BUCKETS)
    lines += _family("tracedag_metrics_compute_seconds", "gauge", "Seconds the last recomputation of these figures took.")
    lines.append(f"tracedag_metrics_compute_seconds {time.perf_counter() - t0:.6f}")
    return "\n".join(lines) + "\n"


def _services(agents: Mapping[str, str], summary: list[dict[str, object]]) -> dict[str, str]:
    """agent name -> its service names (comma separated when an agent runs in several services)."""
    found: dict[str, set[str]] = {}
    for s in summary:
        service = str(s["service_name"] or "")
        agent, _ = _who(agents, str(s["trace_id"]), service)
        found.setdefault(agent, set()).add(service)
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
# the steps of every latest build); the whole query also joins scores, tokens and costs (4.5 s of a
# 5 s scrape on 1M spans). tests/serve/test_metrics_cold.py checks both give the same figures.
_LATENCY_SQL = f"""
select cast(n.step_type as varchar) as step_type, n.step_name,
       quantile_cont(n.duration_ns / 1e6, 0.5) as p50_ms, quantile_cont(n.duration_ns / 1e6, 0.9) as p90_ms
from dag_nodes_all n semi join ({LATEST_BUILDS_SQL}) t using (trace_id, build_id)
group by all
order by count(*) desc, step_type, step_name  -- step_stats' order
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


# Per trace: its agent name (tracelist.AGENTS_SQL), service name and build lag, from its latest build (one scan
# of traces_all for both; the traces view keeps each trace's whole latest row: three of its columns cost a third).
_WHO_SQL = f"""
select t.trace_id, coalesce(a.agent, t.service_name) as agent, t.service_name, t.lag
from (select trace_id, arg_max(service_name, (built_unix_nano, build_id)) as service_name,
             arg_max((built_unix_nano - last_received_unix_nano) / 1e9, (built_unix_nano, build_id)) as lag
      from traces_all group by trace_id) t
left join ({SPAN_AGENTS_SQL}) a using (trace_id)
order by t.trace_id
"""


def _lags(who: pa.Table, agents: Mapping[str, str]) -> dict[Labels, list[float]]:
    out: dict[Labels, list[float]] = {}
    for tid, service, lag in zip(who["trace_id"].to_pylist(), who["service_name"].to_pylist(),
                                 who["lag"].to_pylist(), strict=True):
        if lag is None:
            continue
        agent, svc = _who(agents, tid, service)
        out.setdefault((("agent", agent), ("service", svc)), []).append(max(0.0, float(lag)))
    return out


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
