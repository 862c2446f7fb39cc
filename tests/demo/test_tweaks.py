"""The example agent's default-off update knobs (``tweaks``), used by the regression-gate evidence."""

from __future__ import annotations

import random

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracedag.pipeline.analysis.paths import enumerate_paths
from tracedag.pipeline.demo import simulate as sim
from tracedag.pipeline.demo.agent import booking_graph as graph
from tracedag.pipeline.demo.agent.booking_agent import BookingAgent
from tracedag.pipeline.demo.agent.tweaks import BadTweak, Tweaks
from tracedag.schemas.agent_graph import parse_graph


def _run(tweaks=None, **kw):
    paths = list(enumerate_paths(parse_graph(graph.agent_graph("constrained")), 2))
    exporter = InMemorySpanExporter()
    config = sim.SimulationConfig(endpoint="unused", seed=5, latency_scale=0.0, agent_variants=("constrained",),
                                  replays=2, variants=1, tweaks=tweaks or Tweaks(), **kw)
    return sim.simulate(config, paths, exporter=exporter), exporter.get_finished_spans()


def test_parse_agent_opts():
    t = Tweaks.from_pairs(["drop_time_rate=0.3", "rephrase=true", "calendar_latency=4"])
    assert (t.drop_time_rate, t.rephrase, t.calendar_latency, t.skip_availability_rate) == (0.3, True, 4.0, 0.0)
    assert t.as_labels() == {"drop_time_rate": "0.3", "calendar_latency": "4.0", "rephrase": "True"}
    for bad in ("nope=1", "drop_time_rate", "drop_time_rate=2", "rephrase=maybe", "calendar_latency=fast"):
        with pytest.raises(BadTweak):
            Tweaks.from_pairs([bad])


def test_defaults_change_nothing():
    plain, _ = _run()
    default, _ = _run(Tweaks())
    assert [r for _, r in plain.results] == [r for _, r in default.results]


def test_dropped_argument_fails_every_calendar_search():
    result, spans = _run(Tweaks(drop_time_rate=1.0), fault_rate=0.0)
    calls = [s for s in spans if s.name == "execute_tool calendar_search"]
    assert calls and all("time_of_day" not in s.attributes["gen_ai.tool.call.arguments"] for s in calls)
    assert all(s.attributes.get("error.type") for s in calls)
    assert {n for _, r in result.results for n in r.failed_nodes} >= {"check_availability"}


def test_router_skips_the_calendar_search():
    result, _ = _run(Tweaks(skip_availability_rate=1.0), fault_rate=0.0)
    booking = [r for run, r in result.results if "check_availability" in run.scenario.intended_path]
    assert booking and all("check_availability" not in r.path for r in booking)
    assert all("propose_slot" in r.failed_nodes for r in booking)  # nothing to propose


def test_rephrased_replies_keep_the_paths():
    plain, _ = _run(fault_rate=0.0)
    reworded, _ = _run(Tweaks(rephrase=True), fault_rate=0.0)
    assert [r.path for _, r in plain.results] == [r.path for _, r in reworded.results]
    assert [r.replies for _, r in plain.results] != [r.replies for _, r in reworded.results]


def test_calendar_latency_scales_only_the_calendar():
    agent = BookingAgent.create("constrained", random.Random(1), random.Random(1), latency_scale=2.0,
                                tweaks=Tweaks(calendar_latency=4.0))
    assert (agent.calendar.latency_scale, agent.bookings.latency_scale, agent.llm.latency_scale) == (8.0, 2.0, 2.0)
