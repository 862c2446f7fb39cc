"""What ``tracedag demo`` prints: a few compact tables read from the store, then what to try next."""

from __future__ import annotations

import logging
import shlex
from collections import Counter
from typing import Any

import pyarrow as pa
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tracedag.pipeline.demo.config import DemoResult

logger = logging.getLogger(__name__)

TOP = 5


def _rows(result: DemoResult, name: str) -> list[dict[str, Any]]:
    table: pa.Table | None = result.tables.get(name)
    return table.to_pylist() if table is not None else []


def _ms(value: Any) -> str:
    """Milliseconds with one decimal."""
    return "—" if value is None else f"{float(value):.1f}"


def _table(title: str, columns: list[str]) -> Table:
    t = Table(title=title, title_justify="left", pad_edge=False, box=box.SIMPLE_HEAD, title_style="bold")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right", no_wrap=i == 0)
    return t


def root_cause_summary(rows: list[dict[str, Any]]) -> list[tuple[str, str, str, int, float]]:
    """Failed traces per root-cause step: (step name, type, categories, failed traces, mean hops)."""
    counts: Counter[tuple[str, str]] = Counter()
    hops: Counter[tuple[str, str]] = Counter()
    categories: dict[tuple[str, str], Counter[str]] = {}
    for r in rows:
        key = (str(r["root_step_name"]), str(r["root_step_type"]))
        counts[key] += 1
        hops[key] += int(r["hops_from_root"] or 0)
        categories.setdefault(key, Counter())[str(r.get("root_taxonomy_l3") or "unclassified")] += 1
    return [(*k, ", ".join(c for c, _ in categories[k].most_common()), n, hops[k] / n)
            for k, n in counts.most_common()]


def root_causes_table(result: DemoResult) -> Table:
    """Root causes of the failed traces, grouped by step."""
    rows = _rows(result, "root_causes")
    t = _table(f"root causes of the {len(rows)} failed traces",
               ["root-cause step", "type", "categories", "failed traces", "mean hops"])
    for name, kind, category, n, mean_hops in root_cause_summary(rows)[:TOP]:
        t.add_row(name, kind, category, str(n), f"{mean_hops:.1f}")
    return t


def propagation_line(result: DemoResult) -> str:
    """One line: failed steps, how many originate a failure and how many inherit one, longest chain."""
    rows = _rows(result, "propagation")
    originating = sum(1 for r in rows if r["kind"] == "originating")
    longest = max((int(r["longest_chain"] or 0) for r in rows), default=0)
    return (f"propagation: {len(rows)} failed steps: {originating} originating, "
            f"{len(rows) - originating} propagated; longest chain {longest} hops")


def attribution_line(result: DemoResult) -> str:
    """One line: failed conversations (attributed across turns), failures recovered by a retry or
    another route, cancelled steps, and the command that attributes across turns."""
    convs = _rows(result, "root_causes_conversation")
    fails = _rows(result, "failures")
    earlier = sum(1 for r in convs if r["root_trace_id"] != r["trace_id"])
    retried = sum(1 for r in fails if r["recovery"] == "retry")
    routed = sum(1 for r in fails if r["recovery"] == "route")
    cancelled = sum(1 for r in fails if r["cancelled"])
    return (f"attribution: {len(convs)} failed conversations ({earlier} caused in an earlier turn); "
            f"{retried + routed} failures recovered ({retried} by a retry, {routed} by another route), "
            f"{cancelled} cancelled steps (never a root cause); try: tracedag query root_causes "
            f"--data {shlex.quote(str(result.data))} -p per=conversation")


def roles_line(result: DemoResult) -> str:
    """One line: steps per AgentEval role with their mean score, tool-call edges, re-timed remote spans."""
    rows = [r for r in _rows(result, "step_roles") if r["step_role"] != "-"]
    first = _rows(result, "step_roles")[:1]
    edges = int(first[0]["tool_call_edges"]) if first else 0
    skew = int(first[0]["clock_skew"] or 0) if first else 0
    roles = ", ".join(f"{r['step_role']} {r['steps']} (mean {_f2(r['mean_score'])})" for r in rows)
    data = shlex.quote(str(result.data))
    return (f"step roles (AgentEval): {roles or 'none'}; {edges} tool-call edges (the model call that emitted "
            f"each tool call), {skew} spans re-timed for clock skew; a step's score is the lowest of its scores; "
            f"try: tracedag sql --data {data} \"{ROLES_HINT_SQL}\"")


def provenance_line(result: DemoResult) -> str:
    """One line: data edges (argument values of failed steps traced to where they were first written) and
    the root causes that moved to a silent producer (a step that passed but wrote the value that failed)."""
    rows = _rows(result, "data_edges")
    edges = sum(int(r["edges"]) for r in rows)
    args = ", ".join(f"{r['data_arg']} {r['edges']}x" for r in rows[:3]) or "none"
    silent = sum(1 for r in _rows(result, "root_causes_conversation") if r.get("silent_producer"))
    return (f"value provenance: {edges} data edges from the step output or user message that first held a failed "
            f"step's argument ({args}); {silent} root causes are silent producers (a step that passed but wrote "
            f"the value that failed); try: tracedag sql --data {shlex.quote(str(result.data))} "
            f"\"{PROVENANCE_HINT_SQL}\"")


PROVENANCE_HINT_SQL = ("select trace_id, src_span_id, dst_span_id, data_arg, data_from from dag_edges "
                       "where edge_kind = 'data' limit 10")


# The roles line's hint: mean step score per role, a step's score being the minimum over its step_scores rows.
ROLES_HINT_SQL = ("select step_role, count(*) as steps, avg(score) as mean_step_score from dag_nodes join "
                  "(select trace_id, span_id, min(score) as score from step_scores group by all) "
                  "using (trace_id, span_id) group by 1 order by 1")


def amplification_table(result: DemoResult) -> Table:
    """Per failure category: failures, share propagated, downstream failures per originating one."""
    t = _table("amplification by failure category",
               ["category", "failures", "originating", "propagated", "amplification"])
    for r in _rows(result, "amplification")[:TOP]:
        factor = r["amplification_factor"]
        t.add_row(str(r["category"]), str(r["failures"]), str(r["originating"]),
                  f"{100 * float(r['propagated_share'] or 0):.0f}%", "—" if factor is None else f"{factor:.2f}")
    return t


def slowest_table(result: DemoResult) -> Table:
    """The steps with the highest p90 latency."""
    rows = [r for r in _rows(result, "step_stats") if r["grain"] == "step" and r["step_type"] != "agent"]
    rows.sort(key=lambda r: -(r["p90_ms"] or 0.0))
    t = _table("slowest steps (p90)", ["step", "type", "runs", "failure rate", "p50 ms", "p90 ms"])
    for r in rows[:TOP]:
        t.add_row(str(r["step_name"]), str(r["step_type"]), str(r["runs"]),
                  f"{100 * float(r['failure_rate'] or 0):.0f}%", _ms(r["p50_ms"]), _ms(r["p90_ms"]))
    return t


def _agent(row: dict[str, Any]) -> str:
    """The agent variant's short name (``court_booking.constrained`` -> ``constrained``)."""
    return str(row["agent"]).rsplit(".", 1)[-1]


def _f2(value: Any) -> str:
    return "—" if value is None else f"{float(value):.2f}"


def _pct(value: Any) -> str:
    return "—" if value is None else f"{100 * float(value):.0f}%"


def determinism_table(result: DemoResult) -> Table:
    """Determinism per agent: exact replays and variants against the base path."""
    t = _table("determinism per agent (1 = all runs alike; reply on 1-4)",
               ["agent", "vs", "runs", "nodes", "node cov", "tools", "args", "reply"])
    for r in _rows(result, "determinism_agent"):
        t.add_row(_agent(r), str(r["comparison"]), str(r["runs"]), _f2(r["node_consistency"]),
                  _f2(r["node_coverage"]), _f2(r["action_consistency"]), _f2(r["action_input_consistency"]),
                  _f2(r["response_consistency"]))
    return t


def design_takeaway(result: DemoResult) -> str | None:
    """One line comparing the node consistency of the two variants over exact replays and variants."""
    by = {(_agent(r), r["comparison"]): r["node_consistency"] for r in _rows(result, "determinism_agent")}
    parts = [
        f"{comparison}: constrained {_f2(by[('constrained', comparison)])} vs permissive "
        f"{_f2(by[('permissive', comparison)])}"
        for comparison in ("replays", "variants")
        if ("constrained", comparison) in by and ("permissive", comparison) in by
    ]
    return "graph design -> node-path consistency, " + "; ".join(parts) if parts else None


def agent_table(result: DemoResult) -> Table:
    """Per agent: transitions per turn, adherence to the designed graph, convergence, completion."""
    t = _table("agent graph per agent (adherence to the designed, constrained graph)",
               ["agent", "conv", "moves/turn", "failed", "adherence", "converged", "completed"])
    for r in _rows(result, "agent_utility"):
        t.add_row(_agent(r), str(r["conversations"]), _f2(r["transitions_per_turn"]), str(r["failed_visits"]),
                  _pct(r["adherence"]), _pct(r["convergence_rate"]), _pct(r["completion_rate"]))
    return t


def node_table(result: DemoResult) -> Table:
    """Node utilization, one row per node, one column group per agent: conversations, visits, failures."""
    rows = _rows(result, "node_utility")
    agents = sorted({_agent(r) for r in rows})
    cells = {(_agent(r), r["node"]): r for r in rows}
    order = sorted({r["node"] for r in rows}, key=lambda n: -sum(int(r["visits"]) for r in rows if r["node"] == n))
    t = _table("node utilization (conversations / visits / failed)",
               ["node"] + [f"{a}" for a in agents])
    for node in order:
        t.add_row(node, *[_utility_cell(cells.get((a, node))) for a in agents])
    return t


def _utility_cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "—"
    return f"{_pct(r['conversation_share'])} / {r['visits']} / {r['failures']}"


def headline(result: DemoResult) -> list[str]:
    """Simulated conversations and what the store holds (one line each)."""
    sim, c = result.simulation, result.counts
    parts = []
    if sim is not None:
        parts.append(f"simulated {sim.runs} conversations ({sim.failed} failed, "
                     f"{sim.calendar_faults} with a calendar fault)")
    if c:
        line = (f"store: {c['spans']} spans, {c['traces']} traces, {c['conversations']} conversations, "
                f"{c['traces_with_errors']} traces with an error span")
        if "root_causes" in result.tables:
            recovered = c["traces_with_errors"] - result.tables["root_causes"].num_rows
            line += f" ({recovered} of them recovered by a retry)"
        parts.append(line)
    if "live_root_causes" in c and "root_causes" in result.tables:
        parts.append(f"live: {c['live_root_causes']} of the {result.tables['root_causes'].num_rows} root causes were "
                     "queryable while the agent still ran (the collector builds and scores as spans arrive: "
                     "tracedag collect --build)")
    return parts


def example_trace(result: DemoResult) -> str | None:
    """A failed trace whose root cause is the faulty calendar, else any failed trace."""
    rows = _rows(result, "root_causes")
    calendar = [r["trace_id"] for r in rows if r["root_step_name"] == "calendar_search"]
    found = calendar or [r["trace_id"] for r in rows]
    return str(found[0]) if found else None


def print_demo(console: Console, result: DemoResult) -> None:
    """Print the demo's findings, where the data is, and three commands to try next."""
    for stage, status in result.stages.items():
        if status != "ok":
            console.print(f"[yellow]stage {stage}: {escape(status)}[/yellow]")
    for line in headline(result):
        console.print(line, soft_wrap=True)
    if result.ok("queries"):
        console.print(root_causes_table(result))
        console.print(propagation_line(result), soft_wrap=True)
        if "root_causes_conversation" in result.tables:
            console.print(attribution_line(result), soft_wrap=True, highlight=False)
        console.print(macros_line(result), soft_wrap=True, highlight=False, markup=False)
        if "step_roles" in result.tables:
            console.print(roles_line(result), soft_wrap=True, highlight=False)
        if "data_edges" in result.tables:
            console.print(provenance_line(result), soft_wrap=True, highlight=False, markup=False)
        console.print(amplification_table(result))
    if result.ok("determinism"):
        console.print(determinism_table(result))
        takeaway = design_takeaway(result)
        if takeaway:
            console.print(takeaway, soft_wrap=True)
        console.print(agent_table(result))
        console.print(node_table(result))
    if result.ok("queries"):
        console.print(slowest_table(result))
    if result.ok("validate"):
        console.print(validation_line(result), soft_wrap=True, highlight=False)
        console.print(semantic_merge_line(result), soft_wrap=True, highlight=False, markup=False)
    if result.ok("regress"):
        console.print(regress_line(result), soft_wrap=True, highlight=False, markup=False)
    if result.ok("replay"):
        from tracedag.pipeline.demo.replay_example import replay_line

        console.print(replay_line(result.data, result.counts), soft_wrap=True, highlight=False, markup=False)
    if result.ok("confirm"):
        from tracedag.pipeline.demo.confirm_example import confirm_line

        console.print(confirm_line(result.data, result.counts), soft_wrap=True, highlight=False, markup=False)
    if result.ok("usersim"):
        from tracedag.pipeline.demo.usersim_example import usersim_line

        console.print(usersim_line(result.data, result.counts), soft_wrap=True, highlight=False, markup=False)
    if result.ok("objstore"):
        from tracedag.pipeline.demo.objstore_example import objstore_line

        console.print(objstore_line(result.data, result.counts), soft_wrap=True, highlight=False, markup=False)
    console.print(serve_line(result), soft_wrap=True, highlight=False, markup=False)
    console.print(engine_line(result), soft_wrap=True, highlight=False, markup=False)
    _print_next(console, result)


def serve_line(result: DemoResult) -> str:
    """One line: the built traces a dashboard can show, and the commands that serve or report them."""
    data = shlex.quote(str(result.data))
    return (f"dashboards: {result.counts.get('traces', 0)} built traces with DAGs, scores and root causes, served as a "
            f"web UI at http://127.0.0.1:8080/ with Prometheus /metrics; try: tracedag serve --data {data}\n"
            f"  or, as one self-contained HTML file: tracedag report --data {data} --out report.html")


def engine_line(result: DemoResult) -> str:
    """One line: the demo built and scored in this process; the command that does the same on Ray
    (not started in the demo: a cluster takes seconds to start)."""
    import importlib.util

    data = shlex.quote(str(result.data))
    ready = "" if importlib.util.find_spec("ray") else " (pip install 'tracedag[ray]')"
    return (f"beyond one machine: the demo built {result.counts.get('traces', 0)} traces in this process; the same "
            f"build and score run as one Ray task per trace-id bucket, with the same rows{ready}; try: tracedag "
            f"build --data {data} --full --idle 0 --engine ray --workers 2 && tracedag score --data {data} --engine ray")


def regress_line(result: DemoResult) -> str:
    """One line: the regression gate's verdict on the permissive agent against the constrained one,
    its worst alerts, and the command that runs it."""
    from tracedag.pipeline.demo.stages import REGRESS_SIDES, gate_summary, regress_config_path

    return (f"regression gate, permissive vs constrained agent: {gate_summary(_rows(result, 'regress'))}; try: "
            f"tracedag regress --data {shlex.quote(str(result.data))} --baseline {REGRESS_SIDES[0]} "
            f"--candidate {REGRESS_SIDES[1]} --config {shlex.quote(str(regress_config_path(result.data)))}")


def semantic_merge_line(result: DemoResult) -> str:
    """One line: learning can also merge states an LLM calls the same step, and the command (the demo runs offline)."""
    return ("structural validation, semantic merge: off in the demo (no LLM); steps named differently for the same "
            "action (check_availability / availability_check) merge when the judge's LLM is confident (set "
            "TRACEDAG_JUDGE_MODEL, and TRACEDAG_JUDGE_BASE_URL for an OpenAI-compatible server); try: "
            f"tracedag validate learn --data {shlex.quote(str(result.data))} --agent {_design_agent()} "
            "--merge semantic --out model.json")


def _design_agent() -> str:
    """The designed (constrained) agent's name: validation learns one agent's essential states."""
    from tracedag.pipeline.demo.agent import booking_graph
    from tracedag.pipeline.demo.stages import DESIGN_VARIANT

    return str(booking_graph.agent_name(DESIGN_VARIANT))


def macros_line(result: DemoResult) -> str:
    """One line: every named query is also a table macro, composable in any SQL, and a statement to try."""
    statement = "select root_step_name, count(*) as conversations from root_causes(per := 'conversation') group by 1"
    return ("SQL composes: every named query is a table macro (tracedag queries lists them with their parameters); "
            f"try: tracedag sql --data {shlex.quote(str(result.data))} \"{statement}\"")


def validation_line(result: DemoResult) -> str:
    """One line: runs of the designed agent that reach every essential state in order, a failing
    run's explanation, and the command that checks them."""
    rows = _rows(result, "validations")
    judged = [r for r in rows if r["passed"] is not None]
    failing = [r for r in judged if not r["passed"]]
    model = shlex.quote(str(result.files.get("validation model", "MODEL")))
    example = f"; e.g. {failing[0]['explanation']}" if failing else ""
    return (f"structural validation: {len(judged) - len(failing)} of {len(judged)} {_agent(rows[0]) if rows else ''} "
            f"runs reach every essential state in order{example}; try: tracedag validate check "
            f"--data {shlex.quote(str(result.data))} --model {model}")


def _print_next(console: Console, result: DemoResult) -> None:
    data = shlex.quote(str(result.data))
    console.print(f"data: {result.data}  (Parquet tables under {result.data}/tables)", soft_wrap=True)
    for name, path in result.files.items():
        console.print(f"{name}: {path}", soft_wrap=True)
    trace = example_trace(result) or "TRACE_ID"
    console.print("try next:")
    for command in (f"query root_causes --data {data}", f"show {trace} --data {data}", f"sql --data {data}"):
        console.print(f"  tracedag {command}", soft_wrap=True, highlight=False)
