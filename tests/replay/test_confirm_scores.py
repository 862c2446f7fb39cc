"""The score-based half of the verdict: a root cause is confirmed when replacing it leaves the final failure in
place but lifts the downstream step scores by the AgentEval threshold (0.30); the deltas are stored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.replay import confirm_agents
from tests.replay.test_confirm import _checks, _record, _root_causes
from tracedag import instrument as td
from tracedag.pipeline.cli import cli
from tracedag.pipeline.replay.confirm_scores import SCORE_THRESHOLD

NOTIFIED = {  # conversation -> (message, the tools down while it was held)
    "n-ok": ("I am alex, find flights to Paris", set()),
    "n-search": ("I am alex, find flights to Paris", {"flight_search", "notify"}),
    "n-decoy": ("I am alex, find flights to Atlantis", {"profile_lookup", "notify"}),
}


@pytest.fixture(name="notified")
def notified_fixture(tmp_path: Path) -> Path:
    def hold() -> Iterator[str]:
        for cid, (message, broken) in NOTIFIED.items():
            confirm_agents.BROKEN.clear()
            confirm_agents.BROKEN.update(broken)
            with td.conversation(cid):
                confirm_agents.travel_notified([{"role": "user", "content": message}])
            yield cid
        confirm_agents.BROKEN.clear()

    return _record(tmp_path / "notified", "travel", hold)


def test_downstream_scores_up_by_the_threshold_confirm_while_the_failure_stays(notified: Path) -> None:
    causes = _root_causes(notified)
    assert {c: (causes[c]["root_step_name"], causes[c]["failed_step_name"]) for c in ("n-search", "n-decoy")} == {
        "n-search": ("flight_search", "notify"), "n-decoy": ("profile_lookup", "notify")}
    confirm_agents.BROKEN.add("notify")  # the notification service is still down: notify fails in every run
    try:
        out = CliRunner().invoke(cli, ["confirm", "--data", str(notified), "--agent",
                                       "tests.replay.confirm_agents:travel_notified", "--times", "2"])
    finally:
        confirm_agents.BROKEN.clear()
    assert out.exit_code == 0, out.output
    checks = _checks(notified)
    search, decoy = checks["n-search"], checks["n-decoy"]
    # by hand: after flight_search the source has the answer (helpfulness 3: no flight) and notify (failed: 1),
    # mean 2.0; each run has the answer at 5 (the recorded flight) and notify at 1, mean 3.0: +1.0 >= 0.30
    assert (search["failures_after"], search["runs_improved"], search["runs"]) == (2, 2, 2)
    assert (search["downstream_score_before"], search["downstream_score_after"]) == (2.0, 3.0)
    assert search["downstream_score_delta"] == 1.0 and search["score_threshold"] == SCORE_THRESHOLD == 0.30
    assert search["verdict"] == "confirmed" and "rose by 0.30 or more in 2 of 2 runs" in str(search["reason"])
    # after profile_lookup: flight_search to Atlantis (1), the answer (3), notify (1): 5/3 in the source and
    # in every run, the passing profile changes nothing downstream
    assert (decoy["failures_after"], decoy["runs_improved"], decoy["downstream_score_delta"]) == (2, 0, 0.0)
    assert decoy["downstream_score_before"] == pytest.approx(5 / 3)
    assert decoy["verdict"] == "refuted"
