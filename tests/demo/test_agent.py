"""The example booking agent: seeded determinism, the faulty calendar, propagation, variants."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tracedag import instrument as td
from tracedag.pipeline.analysis.paths import enumerate_paths
from tracedag.pipeline.demo import simulate as sim
from tracedag.pipeline.demo.agent import booking_graph as graph
from tracedag.pipeline.demo.agent.booking_agent import BookingAgent
from tracedag.schemas.agent_graph import parse_graph


def _paths():
    return list(enumerate_paths(parse_graph(graph.agent_graph("constrained")), 2))


def _config(seed=7, **kw):
    return sim.SimulationConfig(endpoint="unused", seed=seed, latency_scale=0.0, **kw)


def _simulate(seed=7, **kw):
    exp = InMemorySpanExporter()
    result = sim.simulate(_config(seed, **kw), _paths(), exporter=exp)
    return result, exp.get_finished_spans()


def test_graph_variants_are_valid_dsl_and_paths_cover_the_design():
    constrained = parse_graph(graph.agent_graph("constrained"))
    permissive = parse_graph(graph.agent_graph("permissive"))
    assert constrained.allows("ask_details", "ask_details")  # the re-ask loop
    assert not constrained.allows("router", "book_court")
    assert permissive.allows("router", "book_court")
    paths = _paths()
    assert len(paths) == 5
    assert ["router", "club_info", "finalize"] in paths
    assert ["router", "ask_details", "ask_details", "check_availability", "propose_slot", "book_court",
            "finalize"] in paths


def test_scenario_turns_follow_the_intended_path():
    scenario = sim.Scenario("p", ("router", "ask_details", "ask_details", "check_availability",
                                  "propose_slot", "book_court", "finalize"))
    base, variant = scenario.user_turns(0), scenario.user_turns(1)
    assert len(base) == len(variant) == 4
    assert base != variant
    agent = BookingAgent.create("constrained", random.Random(1), random.Random(1), fault_rate=0.0,
                                noise=0.0, latency_scale=0.0)
    td.configure(exporter=InMemorySpanExporter(), set_global=False)
    try:
        for turns in (base, variant):
            out = agent.run(turns)
            assert out.path == scenario.intended_path
            assert not out.failed and out.booking_id
    finally:
        td.shutdown()


def _signature(result):
    return [(run.conversation_id, out.path, out.replies, out.errors) for run, out in result.results]


def test_agent_is_deterministic_per_seed_and_differs_across_seeds():
    first, _ = _simulate(seed=3)
    again, _ = _simulate(seed=3)
    other, _ = _simulate(seed=4)
    assert _signature(first) == _signature(again)
    assert _signature(first) != _signature(other)


def test_faulty_calendar_fails_in_some_runs_and_propagates():
    result, spans = _simulate(seed=7, agent_variants=("constrained",))
    assert result.runs == 5 * 3 * 3
    assert 0 < result.calendar_faults < result.runs
    by_trace: dict[str, list] = {}
    for span in spans:
        by_trace.setdefault(span.context.trace_id, []).append(span)
    faulted = [
        ss for ss in by_trace.values()
        if any(s.attributes.get("gen_ai.tool.name") == "calendar_search" and s.status.status_code == StatusCode.ERROR
               and s.attributes["error.type"].endswith(("CalendarTimeout", "CalendarUnavailable")) for s in ss)
    ]
    assert faulted
    for spans_of_trace in faulted:
        failed = {s.name for s in spans_of_trace if s.status.status_code == StatusCode.ERROR}
        assert "invoke_node check_availability" in failed
        root = next(s for s in spans_of_trace if s.parent is None)
        assert root.status.status_code == StatusCode.ERROR  # the conversation failed
    # downstream: with no slots the proposal fails in the runs that reach it
    propose_failures = sum(
        1 for ss in faulted for s in ss
        if s.name == "invoke_node propose_slot" and s.status.status_code == StatusCode.ERROR
    )
    assert propose_failures >= len(faulted) // 2


def test_no_faults_no_failures_on_the_constrained_agent_without_noise():
    result, _ = _simulate(seed=7, fault_rate=0.0, noise=0.0, agent_variants=("constrained",))
    assert result.failed == 0


@pytest.mark.parametrize("seed", [7, 11])
def test_constrained_agent_is_more_deterministic(seed):
    result, _ = _simulate(seed=seed)
    share: dict[str, list[float]] = {"constrained": [], "permissive": []}
    groups: dict[tuple, list] = {}
    for run, out in result.results:
        groups.setdefault((run.agent_variant, run.scenario.scenario_id), []).append(out.path)
    for (variant, _), paths in groups.items():
        share[variant].append(Counter(paths).most_common(1)[0][1] / len(paths))
    mean = {k: sum(v) / len(v) for k, v in share.items()}
    assert mean["constrained"] > mean["permissive"] + 0.1


def test_a_failure_made_good_by_a_later_visit_does_not_fail_the_conversation():
    result, spans = _simulate(seed=7, agent_variants=("permissive",))
    recovered = [(run, out) for run, out in result.results if out.failed_nodes and not out.failed]
    assert recovered, "seed 7 has a permissive run that retried a failed node successfully"
    run, out = recovered[0]
    root = next(s for s in spans if s.parent is None
                and s.attributes["gen_ai.conversation.id"] == run.conversation_id)
    assert root.status.status_code != StatusCode.ERROR
    assert out.path.count(out.failed_nodes[0]) >= 2


def test_final_reply_sums_up_the_conversation():
    """EDGE's response consistency compares final replies: they carry what the conversation came to."""
    agent = BookingAgent.create("constrained", random.Random(3), random.Random(3), fault_rate=0.0,
                                noise=0.0, latency_scale=0.0)
    td.configure(exporter=InMemorySpanExporter(), set_global=False)
    try:
        booked = agent.run(sim.Scenario("b", ("router", "ask_details", "ask_details", "check_availability",
                                              "propose_slot", "book_court", "finalize")).user_turns(0))
        info = agent.run(sim.Scenario("i", ("router", "club_info", "finalize")).user_turns(0))
    finally:
        td.shutdown()
    assert booked.booking_id and booked.path[-1] == info.path[-1] == "finalize"
    assert "You are booked on court" in booked.replies[-1], booked.replies[-1]
    assert "You asked about our" in info.replies[-1], info.replies[-1]
    assert booked.replies[-1].split(".")[0] != info.replies[-1].split(".")[0]
