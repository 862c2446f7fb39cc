"""The web UI's trace view draws value provenance (issue #30 class 5), in a real Chromium (Playwright).

The store is the real-instrumentation capture of tests/score/test_provenance_real.py served by a real
``tracedag serve``. Within one turn, lookup_order wrote the tracking number track_shipment failed on:
the ``data`` edge between them is drawn dashed in its own colour, lookup_order is the root cause, the
title says it is a silent producer, and the legend names data edges.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.score.test_provenance_real import provenance_store
from tests.serve.serve_support import Server, running_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)")
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("ui-provenance") / "data"
    assert provenance_store(data) == 4
    return data


@pytest.fixture(scope="module")
def server(store: Path) -> Iterator[Server]:
    with running_server(store) as s:
        yield s


def _view(server: Server, conversation: str, turn: int = 1) -> dict[str, Any]:
    with server.client() as c:
        rows = c.get("/api/traces", params={"conversation": conversation}).json()
        rows = rows.get("traces", rows) if isinstance(rows, dict) else rows
        rows = sorted(rows, key=lambda r: str(r["start_time"]))
        view: dict[str, Any] = c.get(f"/api/traces/{rows[turn - 1]['trace_id']}/view").json()
    return view


def _open(page: Any, server: Server, conversation: str, trace_id: str) -> None:
    page.goto(server.url + "/")
    page.wait_for_selector("#traces tbody[data-loaded]", timeout=20_000)
    page.fill("#filters input[name=conversation]", conversation)
    page.click("#filters button")
    page.click(f'#traces tr[data-trace-id="{trace_id}"]')
    page.wait_for_selector(f'#dag[data-trace="{trace_id}"]', timeout=20_000)


def test_the_data_edge_is_drawn_dashed_and_the_producer_is_the_root(server: Server, tmp_path: Path) -> None:
    view = _view(server, "conv-same-turn")
    later = _view(server, "conv-stale-tracking", turn=2)
    names = {n["span_id"]: n["step_name"] for n in view["nodes"]}
    data = [e for e in view["edges"] if e["edge_kind"] == "data"]
    assert [(names[e["source"]], names[e["target"]]) for e in data] == [("lookup_order", "track_shipment")]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            _open(page, server, "conv-same-turn", view["trace"]["trace_id"])
            page.screenshot(path=str(tmp_path / "provenance.png"))
            drawn = page.evaluate("""() => window.tracedagCy.edges('.data').map((e) => ({
                source: e.data('source'), target: e.data('target'), dash: e.style('line-style'),
                colour: e.style('line-color')}))""")
            plain = page.evaluate("() => window.tracedagCy.edges().filter((e) => !e.hasClass('data'))"
                                  ".map((e) => e.style('line-style') + ' ' + e.data('kind'))")
            root = page.evaluate("() => document.querySelector('#dag').dataset.root")
            title = page.inner_text("#title")
            legend = page.inner_text("#legend")
            _open(page, server, "conv-stale-tracking", later["trace"]["trace_id"])
            across = page.inner_text("#title")
        finally:
            browser.close()
    assert errors == []
    assert [(names[d["source"]], names[d["target"]], d["dash"]) for d in drawn] == [
        ("lookup_order", "track_shipment", "dashed")]
    assert plain and {p.split()[0] for p in plain} == {"solid"}, plain  # every other edge is drawn solid
    assert names[root] == "lookup_order"
    assert "silent producer of tracking_no" in title
    assert "data (the value a step failed on came from there)" in legend
    # turn 2's 404: the cause across turns is turn 1's lookup, a silent producer
    assert "cause across turns: lookup_order in turn 1 (silent producer of tracking_no)" in across
