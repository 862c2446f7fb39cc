"""The demo's replay line: what it prints is what its replay store holds."""

from __future__ import annotations

from tests.dag.spanbuild import q
from tests.replay.replay_support import BOOKING_TURNS, INFO_TURNS, example_store
from tracedag.pipeline.demo.replay_example import DEMO_REPLAY_DIR, demo_replay, replay_line


def test_demo_replay_counts_match_its_store(tmp_path):
    data = example_store(tmp_path / "data", {"c-book": BOOKING_TURNS, "c-info": INFO_TURNS, "c-2": BOOKING_TURNS},
                         fault_rate=1.0)
    before = q(data, "select count(*) from spans")
    counts = demo_replay(data)
    assert q(data, "select count(*) from spans") == before  # the demo store is left as it was
    out = data / DEMO_REPLAY_DIR
    assert counts["replay_conversations"] == 2 and counts["replay_runs"] == 4  # c-book and c-2 failed
    assert q(out, "select count(distinct run_id) from spans") == [(4,)]
    served = q(out, "select count(*) from spans where attributes['tracedag.tool.recorded'] = 'true'")[0][0]
    assert served == counts["replay_served"] > 0
    assert q(out, "select count(*) from spans where step_type = 'tool'")[0][0] == counts["replay_tool_calls"]
    line = replay_line(data, counts)
    assert f"{counts['replay_served']} of {counts['replay_tool_calls']} tool calls served" in line
    assert f"try: tracedag replay --data {data} --agent example" in line
