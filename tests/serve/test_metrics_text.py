"""#31 ``/metrics`` aggregated in SQL: the text is the one computed in Python from the named queries' whole
results, as ``metrics.compute`` did before (one dict per trace): ``trace_summary``, ``failures``, ``step_stats``,
each trace's agent (its earliest span ``agent_name``, else its service) and build lag from the ``traces`` view.

Two stores: the generated serve store (agent names apart from services) and hand-built turns whose spans carry
no agent name, from their stored rows and from their SQL.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.score.score_support import StoreBuilder, agent_turn
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.runner import score_store
from tracedag.pipeline.serve.metrics import LAG_BUCKETS, SCORE_BUCKETS, compute
from tracedag.pipeline.store import freshness, materialized
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.views import connect
from tracedag.schemas.layout import tables_dir


def _num(v: float) -> str:
    return repr(float(v)) if v != int(v) else str(int(v))


def _lab(pairs: dict[str, Any]) -> str:
    text = ",".join(f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                    for k, v in pairs.items())
    return "{" + text + "}"


def _hist(name: str, help_text: str, groups: dict[tuple[str, str], list[float]], bounds: tuple[float, ...]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for (agent, service), values in sorted(groups.items()):
        labels = {"agent": agent, "service": service}
        lines += [f"{name}_bucket{_lab({**labels, 'le': _num(b)})} {sum(v <= b for v in values)}" for b in bounds]
        lines += [f"{name}_bucket{_lab({**labels, 'le': '+Inf'})} {len(values)}",
                  f"{name}_sum{_lab(labels)} {_num(round(sum(values), 6))}", f"{name}_count{_lab(labels)} {len(values)}"]
    return lines


def _gauge(name: str, help_text: str, counts: Counter[tuple[str, ...]]) -> list[str]:
    keys = ("agent", "service", "step_type", "category")
    return [f"# HELP {name} {help_text}", f"# TYPE {name} gauge",
            *(f"{name}{_lab(dict(zip(keys, k, strict=True)))} {n}" for k, n in sorted(counts.items()))]


def _traces(data: Path) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """trace id -> earliest span agent name; the traces rows (latest build) by id."""
    con = connect(data)
    try:
        spans = con.sql("select trace_id, agent_name, start_time_unix_nano from spans "
                        "where agent_name is not null").to_arrow_table().to_pylist()
        traces = con.sql("select trace_id, service_name, built_unix_nano, last_received_unix_nano from traces "
                         "order by trace_id").to_arrow_table().to_pylist()
    finally:
        con.close()
    first: dict[str, tuple[int, str]] = {}
    for s in spans:
        if s["trace_id"] not in first or s["start_time_unix_nano"] < first[s["trace_id"]][0]:
            first[s["trace_id"]] = (s["start_time_unix_nano"], s["agent_name"])
    return {t: a for t, (_, a) in first.items()}, traces


def reference(data: Path) -> str:
    """The text without its compute-time line, from whole results and Python, family by family."""
    span_agents, traces = _traces(data)
    agents = {t["trace_id"]: span_agents.get(t["trace_id"]) or t["service_name"] or "" for t in traces}

    def who(trace_id: str, service: str | None) -> tuple[str, str]:
        return agents.get(trace_id) or service or "", service or ""

    summary = run_named(data, "trace_summary", {}).to_pylist()
    failures = [f for f in run_named(data, "failures", {}).to_pylist() if not f["recovered"]]
    lines = ["# HELP tracedag_traces_built Built traces (latest build of each).", "# TYPE tracedag_traces_built gauge",
             f"tracedag_traces_built {len(summary)}"]
    lines += _gauge("tracedag_failures", "Failed steps not recovered, by agent, service, step type and taxonomy category.",
                    Counter((*who(f["trace_id"], f["service_name"]), f["step_type"] or "",
                             f["taxonomy_l1"] or "unclassified") for f in failures))
    lines += _gauge("tracedag_root_causes", "Failed traces by agent, service, and their root cause's step type and "
                    "category.", Counter((*who(s["trace_id"], s["service_name"]), s["root_cause_type"] or "",
                                          s["root_cause_category"] or "") for s in summary if s["root_cause_span_id"]))
    scores: dict[tuple[str, str], list[float]] = {}
    for s in summary:
        if s["workflow_score"] is not None:
            scores.setdefault(who(s["trace_id"], s["service_name"]), []).append(float(s["workflow_score"]))
    lines += _hist("tracedag_workflow_score", "Workflow score of each built trace (1..5).", scores, SCORE_BUCKETS)
    lines += ["# HELP tracedag_determinism Consistency across runs of a scenario (0..1): kind = node, action or "
              "action-input consistency.", "# TYPE tracedag_determinism gauge",
              "# HELP tracedag_response_consistency Agreement of the responses across runs of a scenario (1..4 scale).",
              "# TYPE tracedag_response_consistency gauge"]
    steps = [r for r in run_named(data, "step_stats", {}).to_pylist() if r["grain"] == "step"]
    for q in ("p50", "p90"):
        name = f"tracedag_step_latency_{q}_seconds"
        lines += [f"# HELP {name} {q} of step duration, by step type and name (seconds).", f"# TYPE {name} gauge"]
        lines += [f"{name}{_lab({'step_type': r['step_type'], 'step_name': r['step_name']})} "
                  f"{float(r[f'{q}_ms']) / 1000:.6f}" for r in steps if r[f"{q}_ms"] is not None]
    lags: dict[tuple[str, str], list[float]] = {}
    for t in traces:
        if t["last_received_unix_nano"] is not None:
            lag = (t["built_unix_nano"] - t["last_received_unix_nano"]) / 1e9
            lags.setdefault(who(t["trace_id"], t["service_name"]), []).append(max(0.0, lag))
    lines += _hist("tracedag_build_lag_seconds", "Last span received to trace built, per trace (seconds).", lags,
                   LAG_BUCKETS)
    lines += ["# HELP tracedag_metrics_compute_seconds Seconds the last recomputation of these figures took.",
              "# TYPE tracedag_metrics_compute_seconds gauge"]
    return "\n".join(lines) + "\n"


def _untimed(text: str) -> str:
    return re.sub(r"^tracedag_metrics_compute_seconds .*\n", "", text, flags=re.M)


@pytest.fixture(scope="module")
def turns_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Hand-built turns of three conversations (spans without agent name), built and scored."""
    data = tmp_path_factory.mktemp("metrics-turns") / "data"
    b = StoreBuilder(data)
    for i, (conv, failing) in enumerate((("c1", "search"), ("c1", "fetch"), ("c2", "lookup"), ("c3", "search"))):
        b.spans(agent_turn(f"t{i}", conv, (i + 1) * 1_000_000, failing))
    build_store(data, idle_seconds=0)
    score_store(data)
    return data


@pytest.mark.parametrize("name", ["serve_store", "turns_store"])
def test_the_text_is_the_named_queries_figures_from_stored_rows_and_from_sql(
        name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    data: Path = request.getfixturevalue(name)
    con = connect(data)
    try:
        assert freshness.fresh(con, data)  # the stored rows answer: the first text reads them
    finally:
        con.close()
    want = reference(data)
    assert "tracedag_failures{" in want and "tracedag_workflow_score_sum{" in want and "_seconds_bucket{" in want
    assert _untimed(compute(data)) == want
    computed = tmp_path / "sql"  # the same store without stored rows: every family from the SQL
    shutil.copytree(data, computed)
    for d in tables_dir(computed).glob(materialized.PREFIX + "*"):
        shutil.rmtree(d)
    assert _untimed(compute(computed)) == reference(computed) == want
