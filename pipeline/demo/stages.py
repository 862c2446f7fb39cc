"""The stages of ``tracedag demo``, each a thin call into the library that owns it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracedag.pipeline.analysis.determinism import analyze, write_outputs
from tracedag.pipeline.analysis.paths import enumerate_paths
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.demo import simulate as sim
from tracedag.pipeline.demo.agent import booking_graph
from tracedag.pipeline.demo.config import QUERIES, DemoConfig
from tracedag.pipeline.score import score_store
from tracedag.pipeline.service import CollectorConfig, RunningCollector, start_collector
from tracedag.pipeline.store.querying import run_named, run_sql
from tracedag.pipeline.validate.learning import LearnOptions
from tracedag.schemas.agent_graph import parse_graph
from tracedag.schemas.layout import graphs_dir

logger = logging.getLogger(__name__)

# The designed graph: determinism's structural adherence and the picture are measured against it.
DESIGN_VARIANT: booking_graph.Variant = "constrained"


def design_graph() -> Any:
    """The constrained agent graph, parsed by the agent-graph DSL."""
    return parse_graph(booking_graph.agent_graph(DESIGN_VARIANT))


def conversation_paths(max_visits: int) -> list[list[str]]:
    """Every conversation path of the designed graph (DFS, each node at most ``max_visits`` times)."""
    return [list(p) for p in enumerate_paths(design_graph(), max_visits)]


def planned_runs(config: DemoConfig) -> int:
    """How many conversations the simulation will hold (0 when the paths cannot be enumerated)."""
    try:
        paths = conversation_paths(config.max_visits)
    except Exception:
        logger.debug("paths not available yet", exc_info=True)
        return 0
    return len(sim.plan(sim_config(config, "unused"), sim.scenarios(paths)))


def sim_config(config: DemoConfig, endpoint: str) -> sim.SimulationConfig:
    """The simulation settings of a demo run."""
    return sim.SimulationConfig(
        endpoint=endpoint,
        seed=config.seed,
        replays=config.replays,
        variants=config.variants,
        fault_rate=config.fault_rate,
        latency_scale=config.latency_scale,
        simulation_id=f"demo-seed{config.seed}-{time.strftime('%Y%m%dT%H%M%S')}",
    )


def start(data: Path) -> RunningCollector:
    """Start the collector on free loopback ports, storing under ``data``, with the live analysis on."""
    return start_collector(CollectorConfig(data=data, host="127.0.0.1", http_port=0, grpc_port=0, build=True,
                                           build_interval=0.5, build_grace_seconds=0.5))


def live_root_causes(data: Path) -> int:
    """Root causes already queryable while the agent ran (the collector's live analysis), before any flush."""
    try:
        return int(run_named(data, "root_causes").num_rows)
    except Exception:  # nothing built yet: the derived views do not exist
        logger.debug("no live root causes yet", exc_info=True)
        return 0


def simulate(config: DemoConfig, collector: Any, progress: Callable[[int, int], None]) -> Any:
    """Run the simulation against the collector's OTLP/HTTP port."""
    endpoint = f"http://127.0.0.1:{collector.http_port}"
    return sim.simulate(sim_config(config, endpoint), conversation_paths(config.max_visits), progress)


def flush(collector: Any) -> None:
    """Make every acknowledged span visible as Parquet."""
    collector.flush()


def stop(collector: Any) -> None:
    """Stop the collector if it was started."""
    if collector is not None:
        collector.stop()


def build(data: Path) -> None:
    """Build the DAGs of every trace now (no idle wait: the simulation is over)."""
    build_store(data, idle_seconds=0)


def score(data: Path) -> None:
    """Score every built step with the offline rules and the evaluations in the spans."""
    score_store(data)


def named_queries(data: Path) -> dict[str, pa.Table]:
    """Run the named queries the demo prints (and the step roles line's figures)."""
    out = {name: run_named(data, name) for name in QUERIES}
    out["step_roles"] = run_sql(data, ROLES_SQL)
    out["failures"] = run_named(data, "failures")
    out["root_causes_conversation"] = run_named(data, "root_causes", {"per": "conversation"})
    out["data_edges"] = run_sql(data, DATA_EDGES_SQL)
    return out


# Value provenance: data edges (an argument value of a failed step traced to the output that first held it).
DATA_EDGES_SQL = """
select data_arg, data_from, count(*) as edges, count(distinct trace_id) as traces
from dag_edges where edge_kind = 'data' group by all order by edges desc, data_arg
"""


# Steps per AgentEval role with their mean lowest score, tool-call edges and re-timed remote spans.
ROLES_SQL = """
with s as (select trace_id, span_id, min(score) as score from step_scores group by all)
select coalesce(n.step_role, '-') as step_role, count(*) as steps, avg(s.score) as mean_score,
       (select count(*) from dag_edges where edge_kind = 'tool_call') as tool_call_edges,
       (select coalesce(sum(clock_skew_count), 0) from traces) as clock_skew
from dag_nodes n left join s using (trace_id, span_id) group by all order by 1
"""


_COUNTS_SQL = """
select (select count(*) from spans) as spans,
       (select count(*) from traces) as traces,
       (select count(distinct run_id) from spans where run_id is not null) as conversations,
       (select count(distinct trace_id) from spans where status_code = 2) as traces_with_errors
"""


def store_counts(data: Path) -> dict[str, int]:
    """Spans, traces, conversations and traces with an error span, read back from the store."""
    row = run_sql(data, _COUNTS_SQL).to_pylist()[0]
    return {k: int(v or 0) for k, v in row.items()}


def determinism(data: Path) -> tuple[dict[str, pa.Table], dict[str, Path]]:
    """Determinism and utility tables, written as Parquet, and the pictures of the agent graph."""
    result = analyze(data, graphs=[design_graph()])  # every agent against the designed (constrained) graph
    written = write_outputs(result, data)
    files = {name: Path(path) for name, path in written.items() if name.startswith("picture")}
    return dict(result.tables), files


def validation(data: Path) -> tuple[pa.Table, Path]:
    """Learn the designed agent's essential states from its passing runs, check every run of it
    (``tracedag validate learn`` then ``check``): the validations table and the model file."""
    from tracedag.pipeline.validate import check, learn
    from tracedag.pipeline.validate.model import save_model

    agent = booking_graph.agent_name(DESIGN_VARIANT)
    model = graphs_dir(data) / f"{agent}.validation.json"
    save_model(learn(data, LearnOptions(agent=agent, skip_thin=True)).model, model)
    return check(data, model), model


REGRESS_SIDES = tuple(f"agent_name={booking_graph.agent_name(v)}" for v in booking_graph.VARIANTS)
"""``tracedag regress`` selectors of the demo: the constrained agent (baseline) vs the permissive one."""


REGRESS_CONFIG = """\
# tracedag demo: how its regression gate compares the two agent variants (tracedag regress --config).
# The demo's agents are scripted and run in one process, so their durations measure this machine's load,
# not the agents: the latency families are left out. A real agent's gate keeps them (the defaults).
metrics:
  latency_p50: {enabled: false}
  latency_p95: {enabled: false}
  step_latency_p95: {enabled: false}
"""


def regress_config_path(data: Path) -> Path:
    """``<data>/regress.yaml``: the demo gate's config (``REGRESS_CONFIG``), which its printed command names."""
    return data / "regress.yaml"


def regress_variants(data: Path) -> pa.Table:
    """The regression gate over the two agent variants, paired by scenario and replay: one row per
    metric (``regress.MetricResult`` fields), alerts first. The two sides are different agents, so
    the gate keys both agent steps alike (``regress.gate.AGENT_KEY``) and every metric can pair.
    Its config (``regress_config_path``) leaves the latencies out."""
    from dataclasses import asdict

    from tracedag.pipeline.regress import run_regress
    from tracedag.pipeline.regress.config import load_config
    from tracedag.pipeline.regress.report import ordered, to_json
    from tracedag.pipeline.regress.saved import save_report

    config = regress_config_path(data)
    config.write_text(REGRESS_CONFIG, encoding="utf-8")
    result = run_regress(data, REGRESS_SIDES[0], REGRESS_SIDES[1], load_config(config))
    save_report(data, to_json(result))  # as tracedag regress does: the served demo's Regressions tab shows it
    return pa.Table.from_pylist([{**asdict(m), "exit_code": result.exit_code} for m in ordered(result)])


EXPECTED = "the permissive agent is less deterministic"
"""What the demo's gate is expected to find: the permissive agent may take transitions the constrained
one may not, so its replays of one scenario agree less often (determinism drops)."""


def gate_summary(rows: list[dict[str, Any]]) -> str:
    """The demo gate's outcome, labelled against what is expected (``EXPECTED``), from the rows of
    ``regress_variants``: FAIL as expected when determinism is what failed, PASS with the drop and
    why the gate could not call it, or the unexpected alerts."""
    compared = [r for r in rows if r["pairs"]]
    fails = [r for r in compared if r["status"] == "fail"]
    drops = sorted((r for r in compared if r["family"] == "determinism" and (r["delta"] or 0) < 0),
                   key=lambda r: float(r["delta"]))
    shown = ", ".join(f"{r['metric']} {float(r['delta']):+.2f}" for r in (fails or drops)[:3])
    counted = f"{len(fails)} of {len(compared)} metrics compared on both sides regressed"
    if fails and all(r["family"] == "determinism" for r in fails):
        return f"FAIL, as expected: {EXPECTED} ({shown}); {counted}"
    if fails:
        return f"FAIL, {counted} ({shown}); expected: only a determinism drop"
    if drops:
        ps = [float(r["p_adjusted"]) for r in drops if r["p_adjusted"] is not None]
        p = f" (adjusted p {min(ps):.2f})" if ps else ""
        units = max(int(r["pairs"]) for r in drops)
        return (f"PASS, {counted}; {EXPECTED}, as expected ({shown}), but {units} scenarios are too few for the "
                f"gate to be sure{p}")
    return f"PASS, {counted}; expected: a determinism drop, not seen with this seed"
