"""``tracedag confirm``: root causes checked by counterfactual replay, through the real collector, build,
score, DuckDB and CLI."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.replay import confirm_agents
from tests.replay.replay_support import BOOKING_TURNS
from tracedag import instrument as td
from tracedag.pipeline.cli import cli
from tracedag.pipeline.demo.agent.booking_agent import BookingAgent
from tracedag.pipeline.service import CollectorConfig, start_collector
from tracedag.pipeline.store.views import connect


def _build_and_score(data: Path) -> None:
    from tracedag.pipeline.dag import build_store
    from tracedag.pipeline.score import score_store

    build_store(data, idle_seconds=0)
    score_store(data)


def _record(data: Path, service: str, hold: Callable[[], Iterator[str]]) -> Path:
    """Store the conversations ``hold`` holds (it yields each conversation id inside its conversation)."""
    collector = start_collector(CollectorConfig(data=data, http_port=0, grpc_port=None))
    try:
        td.configure(f"http://127.0.0.1:{collector.http_port}", service_name=service, set_global=False,
                     schedule_delay_millis=50)
        try:
            for _ in hold():
                pass
            assert td.force_flush(30_000)
        finally:
            td.shutdown()
        collector.flush()
    finally:
        collector.stop()
    _build_and_score(data)
    return data


TRAVEL = {  # conversation -> (its message, the tools down while it was held)
    "c-ok": ("I am alex, find flights to Paris", set()),
    "c-search": ("I am alex, find flights to Paris", {"flight_search"}),
    "c-decoy": ("I am alex, find flights to Atlantis", {"profile_lookup"}),
}


def _travel_store(data: Path, without: str = "") -> Path:
    def hold() -> Iterator[str]:
        for cid, (message, broken) in TRAVEL.items():
            if cid == without:
                continue
            confirm_agents.BROKEN.clear()
            confirm_agents.BROKEN.update(broken)
            with td.conversation(cid):
                confirm_agents.travel([{"role": "user", "content": message}])
            yield cid
        confirm_agents.BROKEN.clear()

    return _record(data, "travel", hold)


def _checks(data: Path) -> dict[str, dict[str, object]]:
    con = connect(data, shared_macros=False)  # views only, no query macro
    try:
        rel = con.execute("select * from root_cause_checks order by checked_unix_nano")
        cols = [d[0] for d in rel.description]
        return {str(r[0]): dict(zip(cols, r, strict=True)) for r in rel.fetchall()}
    finally:
        con.close()


def _root_causes(data: Path) -> dict[str, dict[str, object]]:
    out = CliRunner().invoke(cli, ["query", "root_causes", "--data", str(data), "--param", "per=conversation",
                                   "--format", "json"])
    assert out.exit_code == 0, out.output
    return {str(r["conversation_id"]): r for r in json.loads(out.output)}


@pytest.fixture(scope="module")
def travel_built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The travel store, recorded, built and scored once for the module: tests write checks into a copy."""
    return _travel_store(tmp_path_factory.mktemp("travel") / "travel")


@pytest.fixture(name="travel_data")
def travel_data_fixture(travel_built: Path, tmp_path: Path) -> Path:
    """A private copy of the travel store (``confirm`` and ``write_checks`` write into it)."""
    return Path(shutil.copytree(travel_built, tmp_path / "travel", symlinks=True))


def test_callable_agent_root_cause_confirmed_and_decoy_refuted(travel_data: Path) -> None:
    before = _root_causes(travel_data)
    assert before["c-search"]["root_step_name"] == "flight_search"
    assert before["c-decoy"]["root_step_name"] == "profile_lookup"  # greedy names the decoy upstream
    assert {r["confirmed"] for r in before.values()} == {None}  # never checked: null, and the query binds
    out = CliRunner().invoke(cli, ["confirm", "--data", str(travel_data), "--agent",
                                   "tests.replay.confirm_agents:travel", "--times", "3"])
    assert out.exit_code == 0, out.output
    checks = _checks(travel_data)
    assert set(checks) == {"c-search", "c-decoy"}
    search, decoy = checks["c-search"], checks["c-decoy"]
    assert (search["verdict"], search["runs"], search["failures_after"]) == ("confirmed", 3, 0)
    assert search["replacement_kind"] == "recorded_tool"
    assert str(search["replacement_source"]).startswith("c-ok/")
    assert search["downstream_failures_before"] > 0 and search["downstream_failures_after"] == 0
    assert (decoy["verdict"], decoy["runs"], decoy["failures_after"]) == ("refuted", 3, 3)
    after = _root_causes(travel_data)
    assert after["c-search"]["confirmed"] == "confirmed"
    assert after["c-decoy"]["confirmed"] == "refuted"
    assert "2 root causes checked: 1 confirmed, 1 refuted, 0 inconclusive" in out.output


def test_no_replacement_is_inconclusive_and_a_file_replaces_it(tmp_path: Path) -> None:
    data = _travel_store(tmp_path / "travel", without="c-ok")  # no passing flight_search to Paris recorded
    runner = CliRunner()
    agent = "tests.replay.confirm_agents:travel"
    out = runner.invoke(cli, ["confirm", "--data", str(data), "--agent", agent, "--where", "conversation_id = 'c-search'"])
    assert out.exit_code == 0, out.output
    check = _checks(data)["c-search"]
    assert (check["verdict"], check["runs"], check["replacement_kind"]) == ("inconclusive", 0, None)
    assert "no passing call of flight_search" in str(check["reason"])
    assert _root_causes(data)["c-search"]["confirmed"] == "inconclusive"
    replacement = tmp_path / "flights.json"
    replacement.write_text(json.dumps(["TD1 to Paris"]))
    out = runner.invoke(cli, ["confirm", "--data", str(data), "--agent", agent, "--conversation", "c-search",
                              "--times", "2", "--replacement", str(replacement), "--strategy", "full_path_min"])
    assert out.exit_code == 0, out.output
    check = _checks(data)["c-search"]  # the latest check counts
    assert (check["verdict"], check["runs"], check["replacement_kind"]) == ("confirmed", 2, "file")
    assert (check["strategy"], check["replacement_source"]) == ("full_path_min", str(replacement))
    assert _root_causes(data)["c-search"]["confirmed"] == "confirmed"
    assert set(_checks(data)) == {"c-search"}  # --where and --conversation picked it alone


def test_bad_input_is_a_clear_error(travel_data: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(cli, ["confirm", "--data", str(travel_data), "--agent", "tests.replay.confirm_agents:travel",
                              "--conversation", "c-ok"])
    assert out.exit_code == 1 and "none of the selected conversations failed with a root cause" in out.output
    out = runner.invoke(cli, ["confirm", "--data", str(travel_data), "--agent", "no_such_module:f"])
    assert out.exit_code == 1 and "cannot import no_such_module" in out.output
    out = runner.invoke(cli, ["confirm", "--data", str(travel_data), "--agent", "tests.replay.confirm_agents:travel",
                              "--conversation", "no-such-conversation"])
    assert out.exit_code == 1 and "conversation no-such-conversation: not found in the store" in out.output
    bad, empty = travel_data.parent / "bad.json", travel_data.parent / "empty.json"
    bad.write_text('{"flights": [')
    empty.write_text("\n")
    for path, said in ((bad, "starts as JSON but does not parse"), (empty, "the file is empty")):
        out = runner.invoke(cli, ["confirm", "--data", str(travel_data), "--agent",
                                  "tests.replay.confirm_agents:travel", "--replacement", str(path)])
        assert out.exit_code == 1 and f"--replacement {path}: {said}" in out.output, out.output
        assert len(out.output.strip().splitlines()) == 1  # one line
    assert not _checks(travel_data)


def _booking_store(data: Path) -> Path:
    def hold() -> Iterator[str]:
        for i, (cid, fault_rate) in enumerate((("b-pass", 0.0), ("b-fail", 1.0))):
            agent = BookingAgent.create("constrained", random.Random(i), random.Random(100 + i),
                                        fault_rate=fault_rate, noise=0.0, latency_scale=0.0)
            with td.conversation(cid):
                agent.run(list(BOOKING_TURNS))
            yield cid

    return _record(data, "court-booking-agent", hold)


@pytest.fixture(scope="module")
def booking_built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The booking store (b-pass, b-fail), recorded, built and scored once for the module."""
    return _booking_store(tmp_path_factory.mktemp("booking") / "booking")


@pytest.fixture(name="booking_data")
def booking_data_fixture(booking_built: Path, tmp_path: Path) -> Path:
    """A private copy of the booking store (``confirm`` writes its checks and runs into it)."""
    return Path(shutil.copytree(booking_built, tmp_path / "booking", symlinks=True))


def test_example_agent_calendar_fault_confirmed(booking_data: Path) -> None:
    data = booking_data
    before = _root_causes(data)
    assert set(before) == {"b-fail"}
    assert before["b-fail"]["root_step_name"] == "calendar_search"
    out = CliRunner().invoke(cli, ["confirm", "--data", str(data), "--agent", "example", "--agent-opt", "noise=0",
                                   "--agent-opt", "latency_scale=0", "--failed", "--times", "3"])
    assert out.exit_code == 0, out.output
    check = _checks(data)["b-fail"]
    assert (check["verdict"], check["runs"], check["failures_after"]) == ("confirmed", 3, 0)
    assert check["replacement_kind"] == "recorded_tool" and str(check["replacement_source"]).startswith("b-pass/")
    assert _root_causes(data)["b-fail"]["confirmed"] == "confirmed"


def test_demo_confirm_line(booking_data: Path) -> None:
    from tracedag.pipeline.demo.confirm_example import DEMO_CONFIRM_DIR, confirm_line, demo_confirm

    data = booking_data
    counts = demo_confirm(data, times=2)
    assert counts == {"confirm_checked": 1, "confirm_times": 2, "confirm_confirmed": 1, "confirm_refuted": 0,
                      "confirm_inconclusive": 0}
    assert (data / DEMO_CONFIRM_DIR / "tables" / "spans").is_dir()  # the runs are not in the demo's store
    con = connect(data, shared_macros=False)  # views only, no query macro
    try:
        assert con.execute("select count(*) from spans where conversation_id like 'demo-confirm/%'").fetchone() == (0,)
    finally:
        con.close()
    assert _root_causes(data)["b-fail"]["confirmed"] == "confirmed"
    line = confirm_line(data, counts)
    assert line.startswith("confirm: 1 root causes re-run 2x with only the root step's output replaced: 1 confirmed")
    assert line.endswith(f"try: tracedag confirm --data {data} --agent example --failed --times 3")


def test_model_step_replaced_by_a_passing_run_of_the_same_scenario(tmp_path: Path) -> None:
    def hold() -> Iterator[str]:
        for cid, broken in (("m-ok", set()), ("m-down", {"answer"})):
            confirm_agents.BROKEN.clear()
            confirm_agents.BROKEN.update(broken)
            with td.conversation(cid), td.run_labels(scenario_id="paris"):
                confirm_agents.travel([{"role": "user", "content": "I am alex, find flights to Paris"}])
            yield cid
        confirm_agents.BROKEN.clear()

    data = _record(tmp_path / "model", "travel", hold)
    assert _root_causes(data)["m-down"]["root_step_type"] == "llm"
    confirm_agents.BROKEN.add("answer")  # the model is still down: only the replaced output can answer
    try:
        out = CliRunner().invoke(cli, ["confirm", "--data", str(data), "--agent", "tests.replay.confirm_agents:travel",
                                       "--times", "2"])
    finally:
        confirm_agents.BROKEN.clear()
    assert out.exit_code == 0, out.output
    check = _checks(data)["m-down"]
    assert (check["verdict"], check["runs"], check["replacement_kind"]) == ("confirmed", 2, "gold_step")
    assert str(check["replacement_source"]).startswith("m-ok/")


def test_paramgen_model_step_gets_the_corrected_call(tmp_path: Path) -> None:
    def hold() -> Iterator[str]:
        for cid, broken in (("p-ok", set()), ("p-bad", {"plan"})):
            confirm_agents.BROKEN.clear()
            confirm_agents.BROKEN.update(broken)
            with td.conversation(cid), td.run_labels(scenario_id="paris"):
                confirm_agents.travel_planned([{"role": "user", "content": "Find flights to Paris"}])
            yield cid
        confirm_agents.BROKEN.clear()

    data = _record(tmp_path / "paramgen", "travel", hold)
    cause = _root_causes(data)["p-bad"]
    assert (cause["root_step_name"], cause["root_taxonomy_l3"]) == ("chat planner-model", "invalid_tool_arguments")
    confirm_agents.BROKEN.add("plan")  # the model still writes {"town": ...}: only the corrected call helps
    try:
        out = CliRunner().invoke(cli, ["confirm", "--data", str(data), "--agent",
                                       "tests.replay.confirm_agents:travel_planned", "--times", "2"])
    finally:
        confirm_agents.BROKEN.clear()
    assert out.exit_code == 0, out.output
    check = _checks(data)["p-bad"]
    assert (check["verdict"], check["runs"], check["replacement_kind"]) == ("confirmed", 2, "paramgen")
    assert str(check["replacement_source"]).startswith("p-ok/")


def test_confirmed_column_is_the_latest_check_of_the_root_step(travel_data: Path) -> None:
    from tracedag.pipeline.replay.confirm_run import write_checks
    from tracedag.pipeline.store.querying import run_named

    causes = _root_causes(travel_data)
    search = causes["c-search"]

    def check(span_id: object, verdict: str, at: int, trace_id: object = search["root_trace_id"]) -> dict[str, object]:
        return {"conversation_id": "c-search", "root_trace_id": trace_id, "root_span_id": span_id,
                "verdict": verdict, "checked_unix_nano": at}

    write_checks(travel_data, [check(search["root_span_id"], "confirmed", 2), check(search["root_span_id"], "refuted", 1)])
    write_checks(travel_data, [check(search["root_span_id"], "inconclusive", 3, trace_id="another-trace"),
                               check(causes["c-decoy"]["failed_span_id"], "refuted", 4)])
    # by hand: c-search's root has checks at 1 (refuted) and 2 (confirmed) -> confirmed; the check at 3 names
    # another trace; c-decoy's root (profile_lookup) was never checked (the check at 4 names its failed step)
    expected = {"c-search": "confirmed", "c-decoy": None}
    assert {k: v["confirmed"] for k, v in _root_causes(travel_data).items()} == expected  # materialized rows
    rows = run_named(travel_data, "root_causes", {"per": "conversation", "strategy": "weighted"}).to_pylist()
    assert {r["conversation_id"]: r["confirmed"] for r in rows} == expected  # the SQL
