"""tracedag.instrument against the real collector: spans arrive over OTLP with the right attributes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracedag import instrument as td
from tracedag.pipeline.service import CollectorConfig, start_collector
from tracedag.pipeline.store.querying import run_sql

EXAMPLE = Path(__file__).with_name("readme_example.py")


@pytest.fixture()
def collector(tmp_path):
    running = start_collector(CollectorConfig(data=tmp_path / "data", http_port=0, grpc_port=0))
    yield running
    running.stop()


def _rows(data, sql):
    return run_sql(data, sql).to_pylist()


def test_readme_example_runs_verbatim_against_the_collector(collector):
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.http_port}"}
    subprocess.run([sys.executable, str(EXAMPLE)], check=True, env=env, timeout=120)
    collector.flush()
    rows = _rows(collector.data, """
        select name::varchar as name, step_type::varchar as step_type, tool_name, model, conversation_id,
               scenario_id, replay_index, service_name::varchar as service, service_version,
               input_tokens, output_tokens, attributes['gen_ai.tool.call.arguments'] as args,
               attributes['gen_ai.operation.name'] as op
        from spans order by start_time_unix_nano""")
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == {"invoke_agent support", "invoke_node answer", "execute_tool lookup_order", "chat gpt-4o-mini"}
    assert all(r["conversation_id"] == "conv-42" for r in rows)
    assert all(r["scenario_id"] == "where-is-my-order" and r["replay_index"] == 0 for r in rows)
    assert all(r["service"] == "support-bot" and r["service_version"] == "1.2.0" for r in rows)
    tool = by_name["execute_tool lookup_order"]
    assert tool["step_type"] == "tool" and tool["tool_name"] == "lookup_order"
    assert tool["args"] == '{"order_id":"A-17"}'
    chat = by_name["chat gpt-4o-mini"]
    assert chat["step_type"] == "llm" and chat["model"] == "gpt-4o-mini"
    assert (chat["input_tokens"], chat["output_tokens"]) == (42, 9)
    assert by_name["invoke_agent support"]["step_type"] == "agent"
    assert by_name["invoke_node answer"]["op"] == "invoke_node"


def test_grpc_export_and_error_attributes_reach_the_store(collector):
    td.configure(f"127.0.0.1:{collector.grpc_port}", protocol="grpc", service_name="grpc-agent", set_global=False)
    try:
        labels = td.run_labels(run_id="run-g", variant_id="v2")
        with labels, td.agent("g"), pytest.raises(TimeoutError), td.tool("calendar", call_id="call-1"):
            raise TimeoutError("calendar did not answer")
    finally:
        td.shutdown()
    collector.flush()
    rows = _rows(collector.data, """
        select name::varchar as name, status_code, error_type, tool_call_id, run_id, variant_id,
               len(events) as n_events, events[1].name as event
        from spans where service_name = 'grpc-agent'""")
    by_name = {r["name"]: r for r in rows}
    tool = by_name["execute_tool calendar"]
    assert tool["status_code"] == 2 and tool["error_type"] == "TimeoutError"
    assert tool["tool_call_id"] == "call-1" and tool["event"] == "exception"
    assert all(r["run_id"] == "run-g" and r["variant_id"] == "v2" for r in rows)


def test_simulate_command_sends_labelled_conversations(collector):
    from click.testing import CliRunner

    from tracedag.pipeline.cli import cli

    endpoint = f"127.0.0.1:{collector.grpc_port}"
    out = CliRunner().invoke(cli, ["simulate", "--endpoint", endpoint, "--protocol", "grpc",
                                   "--replays", "2", "--variants", "1", "--seed", "5"])
    assert out.exit_code == 0, out.output
    assert "40 conversations sent" in out.output  # 2 agents x 5 paths x (base + 1 variant) x 2 replays
    collector.flush()
    rows = _rows(collector.data, """
        select count(distinct trace_id) as traces, count(distinct run_id) as runs,
               count(distinct scenario_id) as scenarios, count(distinct variant_id) as variants,
               count(distinct replay_index) as replays,
               count(distinct attributes['tracedag.intended_path']) as intended,
               count(distinct attributes['tracedag.simulation_id']) as simulations
        from spans""")
    assert rows == [{"traces": 40, "runs": 40, "scenarios": 5, "variants": 1, "replays": 2, "intended": 5,
                     "simulations": 1}]
