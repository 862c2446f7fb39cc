"""A root cause's counterfactual check where a person looks at the root cause: ``tracedag show``'s line
under it, serve's trace view (``root_cause_check``) and ``tracedag report``'s inlined documents."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from tests.replay.test_confirm import _root_causes, _travel_store
from tracedag.pipeline.cli import cli
from tracedag.pipeline.serve.app import create_app


@pytest.fixture(name="checked", scope="module")
def checked_fixture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, object]]]:
    """The travel store with c-search's root cause confirmed and c-decoy's refuted (3 runs each)."""
    data = _travel_store(tmp_path_factory.mktemp("shown") / "travel")
    causes = _root_causes(data)  # before the check: the runs add conversations of their own
    out = CliRunner().invoke(cli, ["confirm", "--data", str(data), "--agent", "tests.replay.confirm_agents:travel",
                                   "--times", "3"])
    assert out.exit_code == 0, out.output
    return data, causes


def _show(data: Path, trace_id: str) -> str:
    out = CliRunner().invoke(cli, ["show", trace_id, "--data", str(data)])
    assert out.exit_code == 0, out.output
    return out.output


def _ok_trace(data: Path) -> str:
    out = CliRunner().invoke(cli, ["query", "trace_summary", "--data", str(data), "--format", "json"])
    assert out.exit_code == 0, out.output
    return next(str(r["trace_id"]) for r in json.loads(out.output) if r["conversation_id"] == "c-ok")


def test_show_prints_the_check_under_the_root_cause(checked: tuple[Path, dict[str, dict[str, object]]]) -> None:
    data, causes = checked
    text = _show(data, str(causes["c-search"]["trace_id"]))
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("root cause: "))
    check = " ".join(lines[at + 1:])  # the line under the root cause (wrapped in a narrow terminal)
    assert re.search(r"counterfactual check: confirmed \(flight_search, greedy\); replaced by recorded_tool from "
                     r"c-ok/\w+; 3 runs, the failure came back in 0; downstream failures \d+ → 0\.0", check), text
    assert "step scores" in check  # the runs were built and scored: the downstream score deltas are known
    decoy = _show(data, str(causes["c-decoy"]["trace_id"]))
    assert "counterfactual check: refuted (profile_lookup, greedy)" in decoy
    assert "the failure came back in 3" in decoy
    assert "counterfactual check" not in _show(data, _ok_trace(data))  # no root cause, no check


def test_serve_trace_view_and_report_carry_the_check(checked: tuple[Path, dict[str, dict[str, object]]],
                                                     tmp_path: Path) -> None:
    data, causes = checked
    search, decoy = str(causes["c-search"]["trace_id"]), str(causes["c-decoy"]["trace_id"])
    # serve's application in this process: the view is its route's document (a tracedag serve process costs
    # ~4 s of CPU for its start, its warm pass and its spare SQL workers, none of which a trace view uses)
    client = TestClient(create_app(data, warm=False))
    views = {t: client.get(f"/api/traces/{t}/view").json() for t in (search, decoy, _ok_trace(data))}
    check = views[search]["root_cause_check"]
    assert (check["verdict"], check["runs"], check["failures_after"]) == ("confirmed", 3, 0)
    assert check["root_span_id"] == views[search]["root_cause"]["root_span_id"]
    assert check["replacement_kind"] == "recorded_tool" and check["downstream_score_delta"] is not None
    assert views[decoy]["root_cause_check"]["verdict"] == "refuted"
    assert views[_ok_trace(data)]["root_cause_check"] is None
    out = tmp_path / "report.html"
    done = CliRunner().invoke(cli, ["report", "--data", str(data), "--out", str(out)])
    assert done.exit_code == 0, done.output
    inline = json.loads(re.search(r"window\.TRACEDAG_DATA = (.*?);</script>", out.read_text(), re.S)[1])
    assert inline["details"][search]["root_cause_check"]["verdict"] == "confirmed"
    assert inline["details"][decoy]["root_cause_check"]["verdict"] == "refuted"
