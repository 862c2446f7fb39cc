"""The web UI in a real Chromium (Playwright): list, a click opens the DAG, the root cause is highlighted.

The same page is checked served by ``tracedag serve`` and as the file ``tracedag report`` writes,
opened with the network cut off (everything it needs is inlined).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.demo.demo_support import DemoRun, private_demo
from tests.serve.regress_reports import regress_report_store
from tests.serve.serve_support import Server, running_server
from tracedag.pipeline.cli import cli
from tracedag.pipeline.store.querying import run_named

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)")
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def server(plain_server: Server) -> Server:
    """The worker's plain server of ``serve_store`` (tests/serve/serve_support.py): this module only reads."""
    return plain_server


def _target(data: Path) -> dict[str, Any]:
    """The trace with a root cause and the most unrecovered failures (a propagation chain to draw)."""
    rows = run_named(data, "trace_summary", {}).to_pylist()
    return max((r for r in rows if r["root_cause_span_id"]), key=lambda r: (r["unrecovered_failures"], r["trace_id"]))


def open_listed(page: Any, trace: dict[str, Any]) -> None:
    """Find the trace in the list by its conversation (the filter a user types) and click its row."""
    page.click("nav a[data-view=traces]")
    page.fill("#filters input[name=conversation]", trace["conversation_id"])
    page.click("#filters button")
    page.wait_for_selector(f'#traces tr[data-trace-id="{trace["trace_id"]}"]', timeout=20_000)
    page.click(f'#traces tr[data-trace-id="{trace["trace_id"]}"]')


def _check_dag(page: Any, trace: dict[str, Any]) -> None:
    open_listed(page, trace)
    page.wait_for_selector(f'#dag[data-trace="{trace["trace_id"]}"]', timeout=20_000)
    assert page.get_attribute("#dag", "data-nodes") == str(trace["steps"])
    assert page.evaluate("window.tracedagCy.nodes().length") == trace["steps"]
    roots = page.evaluate("window.tracedagCy.nodes('.root').map(n => n.id())")
    assert roots == [trace["root_cause_span_id"]]
    border = page.evaluate("window.tracedagCy.nodes('.root')[0].style('border-width')")
    assert float(border.removesuffix("px")) >= 5  # drawn thicker than any other node
    assert page.evaluate("window.tracedagCy.nodes('.chain').length") >= 1
    # a click on the root cause fills the side panel with its span
    page.evaluate(f"void window.tracedagCy.getElementById('{trace['root_cause_span_id']}').emit('tap')")
    assert page.get_attribute("#panel", "data-span") == trace["root_cause_span_id"]
    assert "root cause" in page.inner_text("#panel") and "attributes" in page.inner_text("#panel")


def test_the_served_ui_lists_traces_and_draws_a_dag(browser: Any, server: Server, serve_store: Path) -> None:
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    page.wait_for_selector("#traces tbody[data-loaded]", timeout=20_000)
    built = run_named(serve_store, "trace_summary", {}).num_rows
    assert page.locator("#traces tbody tr").count() == min(built, 100)  # one page
    assert page.get_attribute("#traces tbody", "data-total") == str(built)
    _check_dag(page, _target(serve_store))
    page.click("#back")
    page.fill("#filters input[name=conversation]", "")
    page.select_option("select[name=status]", "failed")
    page.click("#filters button")
    failed = sum(1 for r in run_named(serve_store, "trace_summary", {}).column("passed").to_pylist() if r is False)
    page.wait_for_function(f"document.querySelector('#traces tbody').dataset.total === '{failed}'", timeout=10_000)
    assert page.locator("#traces tbody tr").count() == min(failed, 100)
    assert errors == []


def test_the_report_is_one_file_that_works_offline(browser: Any, serve_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    done = CliRunner().invoke(cli, ["report", "--data", str(serve_store), "--out", str(out)])
    assert done.exit_code == 0, done.output
    html = out.read_text()
    assert "<script src=" not in html and "<link rel=\"stylesheet\"" not in html  # everything inlined
    context = browser.new_context(offline=True)
    page = context.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(out.as_uri())
    page.wait_for_selector("#traces tbody[data-loaded]", timeout=20_000)
    _check_dag(page, _target(serve_store))
    assert [u for u in requests if not u.startswith("file:")] == []
    context.close()


@pytest.fixture(scope="module")
def demo_store(demo_newcomer: DemoRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's store: its agents have node and edge utility (tracedag determinism ran).

    ``tracedag demo`` (seed 7) runs once per test run (tests/demo/demo_support.py); this module reads a copy.
    """
    return private_demo(demo_newcomer, tmp_path_factory.mktemp("serve-demo") / "newcomer").data


@pytest.fixture(scope="module")
def demo_server(demo_store: Path) -> Iterator[Server]:
    """One ``tracedag serve`` of the demo's store for the tests that read it (each only reads)."""
    with running_server(demo_store) as s:
        yield s


def test_the_agent_graph_draws_utility_as_sizes_and_widths(browser: Any, demo_store: Path,
                                                           demo_server: Server) -> None:
    nodes = run_named(demo_store, "node_utility", {}).to_pylist()
    edges = run_named(demo_store, "edge_utility", {}).to_pylist()
    page = browser.new_page()
    page.goto(demo_server.url + "/")
    page.click("nav a[data-view=agents]")
    page.wait_for_selector("#agraph[data-agent]", timeout=20_000)
    key = page.get_attribute("#agraph", "data-agent")
    mine = [n for n in nodes if f"{n['agent']} {n['agent_version']}" == key]
    names = {n["node"] for n in mine}
    mine_edges = [e for e in edges if f"{e['agent']} {e['agent_version']}" == key
                  and e["source"] in names and e["target"] in names]
    assert page.evaluate("window.tracedagAgentCy.nodes().length") == len(mine) > 0
    assert page.evaluate("window.tracedagAgentCy.edges().length") == len(mine_edges) > 0
    widest = page.evaluate("(() => { const e = window.tracedagAgentCy.edges().max(x => x.data('width')).ele;"
                           " return [e.data('source'), e.data('target')]; })()")
    top = max(e["conversation_share"] for e in mine_edges)
    assert any([e["source"], e["target"]] == widest and e["conversation_share"] == top for e in mine_edges)
    page.close()


def test_the_determinism_tab_lists_each_scenario(browser: Any, demo_store: Path, demo_server: Server) -> None:
    rows = run_named(demo_store, "determinism", {}).to_pylist()
    assert rows
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(demo_server.url + "/")
    page.click("nav a[data-view=determinism]")
    page.wait_for_function(f"document.querySelectorAll('#det tbody tr').length === {len(rows)}", timeout=20_000)
    assert page.is_visible("#determinism") and not page.is_visible("#list")
    headers = page.locator("#det thead th").all_inner_texts()
    assert "scenario_id" in headers or any("scenario" in h for h in headers)
    assert str(rows[0][next(h for h in headers if "scenario" in h)]) in page.inner_text("#det tbody")
    assert errors == []
    page.close()


def test_the_demo_keeps_its_gate_report(demo_store: Path) -> None:
    from tracedag.pipeline.demo.stages import REGRESS_SIDES
    from tracedag.pipeline.regress.saved import list_reports

    rows = list_reports(demo_store)
    assert [(r["baseline"], r["candidate"]) for r in rows] == [REGRESS_SIDES]


@pytest.fixture(scope="module")
def reg_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, Any]]:
    return regress_report_store(tmp_path_factory.mktemp("ui-regress") / "data")


def _check_regressions(page: Any, name: str, doc: dict[str, Any]) -> None:
    page.click("nav a[data-view=regressions]")
    page.wait_for_selector(f'#reg-detail[data-name="{name}"]', timeout=20_000)
    assert page.locator("#reg-list tbody tr").count() == 1
    assert "FAIL" in page.inner_text(f'#reg-list tr[data-name="{name}"]')
    assert page.inner_text("#reg-detail h3") == doc["verdict"]
    statuses = page.locator("#reg-metrics tbody tr").evaluate_all("rs => rs.map(r => r.dataset.status)")
    assert len(statuses) == len(doc["metrics"])
    order = {"fail": 0, "warn": 1, "absent": 2, "insufficient": 3, "improved": 4, "ok": 5}
    assert statuses == sorted(statuses, key=order.__getitem__) and statuses[0] == "fail"  # alerts first
    failing = page.locator('#reg-metrics tr[data-metric="pass_rate"]')
    assert failing.get_attribute("data-status") == "fail"
    assert "-0.5" in failing.inner_text()  # the hand-computed effect (half the traces fail on v2)


def test_the_regressions_tab_shows_a_saved_report(browser: Any, reg_store: tuple[Path, str, dict[str, Any]],
                                                  tmp_path: Path) -> None:
    data, name, doc = reg_store
    errors: list[str] = []
    with running_server(data) as s:
        page = browser.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(s.url + "/")
        _check_regressions(page, name, doc)
    out = tmp_path / "report.html"
    done = CliRunner().invoke(cli, ["report", "--data", str(data), "--out", str(out)])
    assert done.exit_code == 0, done.output
    context = browser.new_context(offline=True)
    page = context.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(out.as_uri())
    _check_regressions(page, name, doc)
    context.close()
    assert errors == []


def test_without_reports_the_tab_names_the_command(browser: Any, server: Server) -> None:
    page = browser.new_page()
    page.goto(server.url + "/")
    page.click("nav a[data-view=regressions]")
    page.wait_for_selector("#reg-list tbody[data-loaded='0']", state="attached", timeout=20_000)
    assert "tracedag regress --data DIR" in page.inner_text("#reg-detail")
