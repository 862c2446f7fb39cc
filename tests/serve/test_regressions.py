"""Saved regression reports: ``tracedag regress`` keeps its JSON in the store, ``tracedag serve``
lists and returns them (a real server process), unknown and malformed names are refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.serve.regress_reports import regress_report_store
from tests.serve.serve_support import Server, running_server
from tracedag.pipeline.regress.saved import BadReportName, list_reports, read_report, save_report


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, Any]]:
    return regress_report_store(tmp_path_factory.mktemp("serve-regress") / "data")


@pytest.fixture(scope="module")
def server(reg: tuple[Path, str, dict[str, Any]]) -> Iterator[Server]:
    with running_server(reg[0]) as s:
        yield s


def test_the_saved_file_is_the_json_result(reg: tuple[Path, str, dict[str, Any]]) -> None:
    data, name, printed = reg
    saved = json.loads((data / "reports" / f"{name}.json").read_text())
    assert saved == printed  # same seed: the file holds exactly what --format json prints
    assert not list((data / "reports").glob("*.tmp"))


def test_the_list_names_each_report_with_its_verdict_and_alert_counts(
        server: Server, reg: tuple[Path, str, dict[str, Any]]) -> None:
    _, name, doc = reg
    rows = server.client().get("/api/regressions").json()
    assert [r["name"] for r in rows] == [name]
    row = rows[0]
    assert row["baseline"] == "service_version=v1" and row["candidate"] == "service_version=v2"
    assert row["verdict"].startswith("FAIL") and row["exit_code"] == 1
    assert row["fail"] == sum(m["status"] == "fail" for m in doc["metrics"]) >= 1
    assert row["warn"] == sum(m["status"] == "warn" for m in doc["metrics"])
    assert row["time"] == datetime.strptime(name.split("-")[1], "%Y%m%dT%H%M%SZ").strftime("%Y-%m-%dT%H:%M:%SZ")


def test_one_report_is_its_saved_json(server: Server, reg: tuple[Path, str, dict[str, Any]]) -> None:
    _, name, doc = reg
    for path in (name, f"{name}.json"):
        r = server.client().get(f"/api/regressions/{path}")
        assert r.status_code == 200, r.text
        assert r.json() == doc


def test_an_unknown_name_is_404_and_a_malformed_one_400(server: Server) -> None:
    r = server.client().get("/api/regressions/regress-20000101T000000Z-00000000")
    assert r.status_code == 404 and "no saved report" in r.json()["error"]
    for bad in ("%2E%2E", "regress-..", "..%5C..%5Cstate", "build.json", "regress-20000101T000000Z-0000000g"):
        r = server.client().get(f"/api/regressions/{bad}")
        assert r.status_code == 400 and "is not a report name" in r.json()["error"], (bad, r.text)
    # an encoded slash never matches the one-segment route
    r = server.client().get("/api/regressions/..%2F..%2Fstate%2Fbuild.json")
    assert r.status_code == 404 and "build" not in r.text


def test_names_outside_the_pattern_never_reach_the_disk(tmp_path: Path) -> None:
    (tmp_path / "reports").mkdir()
    (tmp_path / "secret.json").write_text('{"secret": 1}')
    for bad in ("../secret", "../secret.json", "regress-../../secret", "/etc/passwd", "regress-20000101T000000Z-0000000g"):
        with pytest.raises(BadReportName):
            read_report(tmp_path, bad)


def test_reports_are_listed_newest_first_and_a_broken_file_is_skipped(tmp_path: Path) -> None:
    older = save_report(tmp_path, json.dumps({"verdict": "PASS: x", "metrics": []}), datetime(2026, 1, 1, tzinfo=UTC))
    newer = save_report(tmp_path, json.dumps({"verdict": "FAIL: y", "exit_code": 1,
                                              "metrics": [{"status": "fail"}, {"status": "warn"}]}),
                        datetime(2026, 1, 2, tzinfo=UTC))
    (tmp_path / "reports" / "regress-20260103T000000Z-abcdef01.json").write_text("{not json")
    rows = list_reports(tmp_path)
    assert [r["name"] for r in rows] == [newer.stem, older.stem]
    assert (rows[0]["fail"], rows[0]["warn"], rows[0]["time"]) == (1, 1, "2026-01-02T00:00:00Z")


def test_a_store_without_reports_lists_none(tmp_path: Path) -> None:
    assert list_reports(tmp_path) == []
