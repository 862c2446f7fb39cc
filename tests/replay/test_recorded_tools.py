"""Recorded tools: tracedag.instrument tools serve the source's results in a replay (``--tools recorded``)."""

from __future__ import annotations

import shutil

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.dag.spanbuild import q
from tests.replay.replay_support import BOOKING_TURNS, INFO_TURNS, example_store, in_process
from tests.replay.test_replay_cli import _tracedag
from tracedag import instrument as td
from tracedag.instrument.recorded import RecordedToolError, UnmatchedToolCall


@pytest.fixture()
def tools_exporter():
    exporter = InMemorySpanExporter()
    td.configure(service_name="t", exporter=exporter, set_global=False, schedule_delay_millis=10)
    yield exporter
    td.shutdown()


def test_decorated_and_block_tools_serve_in_order_and_count(tools_exporter):
    calls = []

    @td.tool("weather")
    def weather(city: str) -> dict:
        calls.append(city)
        return {"city": city, "live": True}

    rec = td.ToolRecording([td.RecordedCall("weather", '{"city": "Paris"}', '{"t": 21}'),
                            td.RecordedCall("weather", '{"city":"Paris"}', '{"t": 22}'),
                            td.RecordedCall("book", '{"id": 1}', None, "BookingRejected", "slot taken")])
    with td.recorded_tools(rec):
        assert weather("Paris") == {"t": 21}
        assert weather(city="Paris") == {"t": 22}
        assert weather("Paris") == {"t": 22}  # used up: the last one again
        assert weather("Lyon") == {"city": "Lyon", "live": True}  # no match: live
        with pytest.raises(RecordedToolError, match="slot taken"), td.tool("book", arguments={"id": 1}) as step:
            step.run(lambda **_: pytest.fail("the recorded failure is raised, the tool never runs"), id=1)
    assert calls == ["Lyon"]
    assert (rec.served, rec.live, rec.failed) == (4, 1, 0)
    assert weather("Paris") == {"city": "Paris", "live": True}  # outside a replay tools run
    td.force_flush()
    spans = {(s.name, s.attributes.get("gen_ai.tool.call.arguments")): s for s in tools_exporter.get_finished_spans()}
    served = [s for s in tools_exporter.get_finished_spans() if s.attributes.get("tracedag.tool.recorded")]
    assert len(served) == 4
    book = spans[("execute_tool book", '{"id":1}')]
    assert book.attributes["error.type"] == "BookingRejected" and not book.status.is_ok


def test_unmatched_fail_raises(tools_exporter):
    rec = td.ToolRecording([], unmatched="fail")
    with td.recorded_tools(rec), pytest.raises(UnmatchedToolCall), td.tool("x", arguments={"a": 1}) as step:
        step.run(lambda **_: 1, a=1)
    assert rec.failed == 1


def test_replay_serves_every_recorded_call_of_the_example_agent(tmp_path):
    """The source conversations hit calendar faults; replayed with a healthy calendar and recorded tools,
    every call is served from the recording, so the replays fail where the source did."""
    data = example_store(tmp_path / "data", {"c-book": BOOKING_TURNS, "c-info": INFO_TURNS}, fault_rate=1.0)
    recorded = q(data, "select count(*) from spans where step_type = 'tool' and run_id is null")[0][0]
    res = in_process("replay", "--data", data, "--agent", "example", "--agent-opt", "fault_rate=0",
                     "--agent-opt", "noise=0", "--tools", "recorded", "--unmatched", "fail", "--times", "3",
                     "--replay-id", "rt")
    assert res.returncode == 0, res.stdout + res.stderr  # c-book fails as its source did: a result
    assert "6 of 6 runs finished, 3 failed, 0 could not run" in res.stdout
    served = 3 * recorded
    assert f"tool calls: {served} served from the recording, 0 ran live, 0 unmatched" in res.stdout
    rows = q(data, """select count(*), count(*) filter (where attributes['tracedag.tool.recorded'] = 'true'),
                             count(*) filter (where status_code = 2)
                      from spans where step_type = 'tool' and run_id like 'rt/%'""")
    src_failed = q(data, "select count(*) from spans where step_type = 'tool' and run_id is null and status_code = 2")
    assert rows == [(served, served, 3 * src_failed[0][0])]


def test_unmatched_calls_run_live_or_fail(tmp_path):
    data = example_store(tmp_path / "data", {"c-book": BOOKING_TURNS})
    live_dir = tmp_path / "live"
    shutil.copytree(data, live_dir)
    drop = ("--agent-opt", "drop_time_rate=1", "--agent-opt", "noise=0", "--agent-opt", "fault_rate=0")
    failing = in_process("replay", "--data", data, "--agent", "example", *drop, "--tools", "recorded",
                         "--unmatched", "fail")
    # the unmatched call fails its run (a result in the table); --fail-on-failure makes it the exit code
    assert failing.returncode == 0 and "UnmatchedToolCall" in failing.stdout, failing.stdout + failing.stderr
    strict = _tracedag("replay", "--data", data, "--agent", "example", *drop, "--tools", "recorded",
                       "--unmatched", "fail", "--fail-on-failure")
    assert strict.returncode == 1 and "1 failed, 0 could not run" in strict.stdout, strict.stdout + strict.stderr
    live = in_process("replay", "--data", live_dir, "--agent", "example", *drop, "--tools", "recorded")
    assert "0 unmatched" in live.stdout and "ran live" in live.stdout
    # calendar_search without its time is not recorded (it fails live), nor create_booking without a slot
    assert "0 served from the recording, 2 ran live, 0 unmatched" in live.stdout
