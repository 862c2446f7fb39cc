"""The web UI measured as a person sees it, in a real Chromium at 1440x900 (Playwright).

Geometry read from the page and from cytoscape: which sections are visible on each tab, the DAG's
share of its pane, the labels' size on screen (font size x zoom) and their pairwise overlap, nesting
(a step's box holds its nested steps), execution order (left to right), the propagation path drawn
edge by edge, the timeline in step with the graph, list cells never cut. Each test saves screenshots
(the path is printed: look at them).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from tests.serve.serve_support import Server, running_server
from tracedag.pipeline.cli import cli
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.views import connect

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)")
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")

SECTIONS = ("list", "trace", "conversation", "agents", "determinism", "regressions")
VIEWPORT = {"width": 1440, "height": 900}


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


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ui-screenshots")
    print(f"\nscreenshots of the web UI: {path}")
    return path


def _page(browser: Any, url: str) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport=VIEWPORT)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector("#traces tbody[data-loaded]", timeout=20_000)
    return page, errors


def _longest_path_trace(server: Server, data: Path) -> dict[str, Any]:
    """The trace whose propagation path has the most steps (the API's view of each rooted trace)."""
    rows = [r for r in run_named(data, "trace_summary", {}).to_pylist() if r["root_cause_span_id"]]
    with server.client() as c:
        views = [c.get(f"/api/traces/{r['trace_id']}/view").json() for r in rows]
    best = max(views, key=lambda v: (len(v["propagation_path"]), v["trace"]["trace_id"]))
    assert len(best["propagation_path"]) >= 3  # a path with a step between root cause and final failure
    return best


def _visible(page: Any) -> list[str]:
    return [s for s in SECTIONS if page.is_visible(f"#{s}")]


def test_each_tab_shows_its_section_and_hides_every_other(browser: Any, server: Server, serve_store: Path,
                                                         shots: Path) -> None:
    page, errors = _page(browser, server.url + "/")
    assert _visible(page) == ["list"]
    page.screenshot(path=str(shots / "tab-traces.png"))
    for view, section in (("agents", "agents"), ("determinism", "determinism"), ("regressions", "regressions"),
                          ("traces", "list")):
        page.click(f"nav a[data-view={view}]")
        page.wait_for_timeout(300)
        assert _visible(page) == [section], view
        box = page.locator(f"#{section}").bounding_box()
        assert box is not None and box["width"] >= VIEWPORT["width"] - 2  # the section has the whole width
        page.screenshot(path=str(shots / f"tab-{view}.png"))
    trace = _longest_path_trace(server, serve_store)["trace"]
    page.evaluate(f"window.tracedagUi.openTrace('{trace['trace_id']}')")
    page.wait_for_selector("#dag[data-trace]", timeout=20_000)
    assert _visible(page) == ["trace"]
    page.click("#back")
    assert _visible(page) == ["list"]
    assert errors == []


def _geometry(page: Any) -> dict[str, Any]:
    """What cytoscape drew, in rendered (screen) pixels."""
    return page.evaluate("""() => {
      const cy = window.tracedagCy;
      const rect = (b) => ({x1: b.x1, y1: b.y1, x2: b.x2, y2: b.y2});
      const nodes = cy.nodes().map(n => ({
        id: n.id(), classes: n.classes(), box: rect(n.renderedBoundingBox({includeLabels: false})),
        label: rect(n.renderedBoundingBox({includeNodes: false, includeEdges: false, includeLabels: true})),
        font: parseFloat(n.style('font-size')), x: n.position('x'),
        border: [n.style('border-color'), n.style('border-style'), n.style('border-width')]}));
      const edges = cy.edges().map(e => ({source: e.source().id(), target: e.target().id(), classes: e.classes(),
                                         visible: e.visible(), width: parseFloat(e.style('width'))}));
      return {zoom: cy.zoom(), width: cy.width(), height: cy.height(), nodes, edges,
              bbox: rect(cy.elements().renderedBoundingBox()),
              pane: document.querySelector('#dag').getBoundingClientRect().toJSON(),
              main: document.querySelector('main').getBoundingClientRect().toJSON()};
    }""")


def _overlap(a: dict[str, float], b: dict[str, float]) -> float:
    w = min(a["x2"], b["x2"]) - max(a["x1"], b["x1"])
    h = min(a["y2"], b["y2"]) - max(a["y1"], b["y1"])
    return max(0.0, w) * max(0.0, h)


def _inside(inner: dict[str, float], outer: dict[str, float]) -> bool:
    return (inner["x1"] >= outer["x1"] - 0.5 and inner["x2"] <= outer["x2"] + 0.5
            and inner["y1"] >= outer["y1"] - 0.5 and inner["y2"] <= outer["y2"] + 0.5)


def test_the_trace_dag_is_readable_at_its_default_zoom(browser: Any, server: Server, serve_store: Path,
                                                       shots: Path) -> None:
    view = _longest_path_trace(server, serve_store)
    trace = view["trace"]
    page, errors = _page(browser, server.url + "/")
    page.fill("#filters input[name=conversation]", trace["conversation_id"])
    page.click("#filters button")
    page.click(f'#traces tr[data-trace-id="{trace["trace_id"]}"]')
    page.wait_for_selector(f'#dag[data-trace="{trace["trace_id"]}"]', timeout=20_000)
    page.screenshot(path=str(shots / "trace-dag.png"))
    g = _geometry(page)
    nodes = {n["id"]: n for n in g["nodes"]}
    assert len(nodes) == len(view["nodes"])
    # the pane spans the page's width and the drawing fills it (clipped to the pane)
    assert g["pane"]["width"] >= 0.95 * g["main"]["width"]
    shown = {"x1": max(0, g["bbox"]["x1"]), "x2": min(g["width"], g["bbox"]["x2"]),
             "y1": max(0, g["bbox"]["y1"]), "y2": min(g["height"], g["bbox"]["y2"])}
    assert (shown["x2"] - shown["x1"]) / g["width"] >= 0.9
    assert (shown["x2"] - shown["x1"]) * (shown["y2"] - shown["y1"]) / (g["width"] * g["height"]) >= 0.4
    # labels: 11 px or more on screen, no two overlapping
    assert min(n["font"] for n in nodes.values()) * g["zoom"] >= 11
    labels = list(nodes.values())
    overlaps = [(a["id"], b["id"]) for i, a in enumerate(labels) for b in labels[i + 1:]
                if _overlap(a["label"], b["label"]) > 0.5]
    assert overlaps == []
    # nested steps inside their parent's box; execution order left to right along sequence edges
    for n in view["nodes"]:
        if n["parent_span_id"] in nodes:
            assert _inside(nodes[n["span_id"]]["box"], nodes[n["parent_span_id"]]["box"]), n["step_name"]
    sequence = [e for e in view["edges"] if e["edge_kind"] == "sequence"]
    assert sequence
    for e in sequence:
        assert nodes[e["source"]]["x"] < nodes[e["target"]]["x"], e
    _check_failure_styles(view, nodes)
    _check_path_drawn(view, g)
    _check_timeline_in_step(page, view)
    page.screenshot(path=str(shots / "trace-selected.png"))
    assert errors == []


def _check_failure_styles(view: dict[str, Any], nodes: dict[str, dict[str, Any]]) -> None:
    """Failed, propagated, root cause and final failure: each its own class and its own border."""
    root, final = view["root_cause"]["root_span_id"], view["root_cause"]["failed_span_id"]
    assert "root" in nodes[root]["classes"] and "final" not in nodes[root]["classes"]
    assert "final" in nodes[final]["classes"] and "root" not in nodes[final]["classes"]
    for f in view["failures"]:
        kind = "recovered" if f["recovered"] else "propagated" if f["kind"] == "propagated" else "failed"
        assert kind in nodes[f["span_id"]]["classes"], f
    borders = {"root": tuple(nodes[root]["border"]), "final": tuple(nodes[final]["border"])}
    for f in view["failures"]:
        if f["span_id"] not in (root, final):
            borders["failed" if f["kind"] == "originating" else "propagated"] = tuple(nodes[f["span_id"]]["border"])
    assert "propagated" in borders
    assert len(set(borders.values())) == len(borders), borders


def _check_path_drawn(view: dict[str, Any], g: dict[str, Any]) -> None:
    """An edge drawn (visible, thicker) for every consecutive pair of the path, each a DAG edge."""
    path = view["propagation_path"]
    assert path[0] == view["root_cause"]["root_span_id"] and path[-1] == view["root_cause"]["failed_span_id"]
    dag_edges = {(e["source"], e["target"]) for e in view["edges"]}
    drawn = {(e["source"], e["target"]): e for e in g["edges"] if "chain" in e["classes"]}
    for hop in zip(path, path[1:], strict=False):
        assert hop in dag_edges, hop
        assert hop in drawn and drawn[hop]["visible"] and drawn[hop]["width"] >= 3, hop
    assert len(drawn) == len(path) - 1


def _check_timeline_in_step(page: Any, view: dict[str, Any]) -> None:
    """A timeline row selects the step in the graph and the panel; a step tapped in the graph selects its row."""
    path = view["propagation_path"]
    assert page.get_attribute("#timeline", "data-rows") == str(len(view["nodes"]))
    page.click(f'#timeline .row[data-span="{path[1]}"]')
    assert page.evaluate("window.tracedagCy.nodes(':selected').map(n => n.id())") == [path[1]]
    assert page.get_attribute("#panel", "data-span") == path[1]
    page.evaluate(f"void window.tracedagCy.getElementById('{path[0]}').emit('tap')")
    assert page.locator("#timeline .row.sel").get_attribute("data-span") == path[0]
    assert page.is_visible(f'#timeline .row[data-span="{path[0]}"]')
    assert "root cause" in page.inner_text("#panel")


def _agent_names(data: Path) -> dict[str, str]:
    con = connect(data)
    try:
        return dict(con.sql("select trace_id, arg_min(agent_name, start_time_unix_nano) from spans "
                            "where agent_name is not null group by trace_id").fetchall())
    finally:
        con.close()


def _cut_cells(page: Any) -> list[str]:
    return page.evaluate("""() => [...document.querySelectorAll('#traces td, #traces th')]
        .filter(c => c.scrollWidth > c.clientWidth).map(c => c.textContent)
        .concat(document.querySelector('#list').scrollWidth > document.querySelector('#list').clientWidth
                ? ['the list scrolls sideways'] : [])""")


def test_the_trace_list_shows_whole_cells_sorts_filters_and_pages(browser: Any, server: Server, serve_store: Path,
                                                                  shots: Path) -> None:
    rows = run_named(serve_store, "trace_summary", {}).to_pylist()
    agents = _agent_names(serve_store)
    page, errors = _page(browser, server.url + "/")
    headers = page.locator("#traces thead th").all_inner_texts()
    assert [h.strip() for h in headers][:8] == ["trace", "agent", "conversation", "status", "root cause", "score",
                                                 "duration", "start"]
    assert _cut_cells(page) == []
    assert page.inner_text("#count") == f"1–100 of {len(rows)} traces"
    # the worst score first: a failed trace with its root cause written in full
    page.click("#traces th[data-sort=workflow_score]")
    worst = min((r for r in rows if r["workflow_score"] is not None), key=lambda r: (r["workflow_score"], r["trace_id"]))
    page.wait_for_selector(f'#traces tbody tr:first-child[data-trace-id="{worst["trace_id"]}"]', timeout=10_000)
    cells = page.locator("#traces tbody tr:first-child td").all_inner_texts()
    assert cells[:6] == [worst["trace_id"][:8], agents[worst["trace_id"]], worst["conversation_id"], "failed",
                         worst["root_cause_step"] or "no failed step", f"{worst['workflow_score']:.2f}"]
    assert agents[worst["trace_id"]] != worst["service_name"]
    assert _cut_cells(page) == []
    page.screenshot(path=str(shots / "list-by-score.png"))
    # the second page holds the rest
    page.click("#next")
    page.wait_for_function(f"document.querySelector('#count').textContent.startsWith('101–{len(rows)}')")
    assert page.locator("#traces tbody tr").count() == len(rows) - 100
    # filters: agent (by name), run label
    page.select_option("#filters select[name=agent]", "billing")
    page.click("#filters button")
    billing = sum(1 for r in rows if agents[r["trace_id"]] == "billing")
    page.wait_for_function(f"document.querySelector('#traces tbody').dataset.total === '{billing}'")
    assert set(page.locator("#traces tbody td:nth-child(2)").all_inner_texts()) == {"billing"}
    page.select_option("#filters select[name=agent]", "")
    page.fill("#filters input[name=label]", f"service_version={rows[0]['service_version']},agent_name=coding")
    page.click("#filters button")
    coding = sum(1 for r in rows if agents[r["trace_id"]] == "coding")
    page.wait_for_function(f"document.querySelector('#traces tbody').dataset.total === '{coding}'")
    assert errors == []


def test_every_report_row_that_is_a_link_has_its_dag_and_the_others_say_why(browser: Any, serve_store: Path,
                                                                            tmp_path: Path, shots: Path) -> None:
    out = tmp_path / "report.html"
    done = CliRunner().invoke(cli, ["report", "--data", str(serve_store), "--out", str(out), "--traces", "5"])
    assert done.exit_code == 0, done.output
    context = browser.new_context(offline=True, viewport=VIEWPORT)
    page = context.new_page()
    page.goto(out.as_uri())
    page.wait_for_selector("#traces tbody[data-loaded]", timeout=20_000)
    details = set(page.evaluate("Object.keys(window.TRACEDAG_DATA.details)"))
    assert len(details) == 5
    linked: set[str] = set()
    for _ in range(2):  # both pages of the list
        rows = page.locator("#traces tbody tr").evaluate_all(
            "rs => rs.map(r => [r.dataset.traceId || null, r.dataset.nodag || null, r.querySelectorAll('a.open').length,"
            " r.lastElementChild.textContent])")
        for trace_id, nodag, links, last in rows:
            if trace_id:
                assert trace_id in details and links == 1
                linked.add(trace_id)
            else:
                assert nodag not in details and links == 0 and "not in this report" in last
        if page.is_enabled("#next"):
            page.click("#next")
            page.wait_for_timeout(200)
    assert linked == details
    # the first failed row of the list has its DAG
    page.select_option("#filters select[name=status]", "failed")
    page.click("#filters button")
    page.wait_for_timeout(200)
    first = page.locator("#traces tbody tr").first
    assert first.get_attribute("data-trace-id") in details
    page.screenshot(path=str(shots / "report-list.png"))
    first.click()
    page.wait_for_selector("#dag[data-trace]", timeout=20_000)
    page.screenshot(path=str(shots / "report-trace.png"))
    context.close()


def test_a_conversation_lists_its_turns_and_links_the_cause_across_turns(browser: Any, rca_store: Path,
                                                                         shots: Path) -> None:
    with running_server(rca_store) as s:
        doc = httpx.get(f"{s.url}/api/conversations/conv-a", timeout=30).json()
        assert [t["trace"]["trace_id"] for t in doc["turns"]] == ["a1-lookup", "a2-agent"]
        page, errors = _page(browser, s.url + "/")
        page.click('#traces a[data-conv="conv-a"]')
        page.wait_for_selector('#conv-body[data-conversation="conv-a"]', timeout=20_000)
        assert _visible(page) == ["conversation"]
        turns = page.locator("#turns tbody tr").evaluate_all("rs => rs.map(r => r.dataset.turn)")
        assert turns == ["1", "2"]
        second = page.inner_text('#turns tr[data-turn="2"] td.across')
        assert "lookup_order" in second and "turn 1" in second
        page.screenshot(path=str(shots / "conversation.png"))
        page.click('#turns tr[data-turn="2"] td.across a')
        page.wait_for_selector('#dag[data-trace="a1-lookup"]', timeout=20_000)
        # the later turn's trace view links the earlier turn's cause
        page.evaluate("window.tracedagUi.openTrace('a2-agent')")
        page.wait_for_selector('#dag[data-trace="a2-agent"]', timeout=20_000)
        assert page.get_attribute("#cross-turn", "data-open") == "a1-lookup"
        page.screenshot(path=str(shots / "trace-cross-turn.png"))
        assert errors == []


def test_the_root_causes_counterfactual_check_is_shown_beside_it(browser: Any, tmp_path: Path, shots: Path) -> None:
    from tests.replay.test_confirm import _root_causes, _travel_store

    data = _travel_store(tmp_path / "travel")
    trace_id = str(_root_causes(data)["c-search"]["trace_id"])
    done = CliRunner().invoke(cli, ["confirm", "--data", str(data), "--agent", "tests.replay.confirm_agents:travel",
                                    "--conversation", "c-search", "--times", "2"])
    assert done.exit_code == 0, done.output
    with running_server(data) as s:
        page, errors = _page(browser, s.url + "/")
        page.evaluate(f"window.tracedagUi.openTrace('{trace_id}')")
        page.wait_for_selector("#dag[data-trace]", timeout=20_000)
        check = page.locator("#rc-check")
        assert check.is_visible() and check.get_attribute("data-verdict") == "confirmed"
        assert "check: confirmed (recorded_tool, 2 runs, failed again in 0" in check.inner_text()
        seen = page.evaluate("""() => {
          const box = (el) => el.getBoundingClientRect().toJSON();
          const c = document.querySelector('#rc-check'), b = box(c);
          const hit = document.elementFromPoint((b.left + b.right) / 2, (b.top + b.bottom) / 2);
          const others = ['#back', '#legend', '#dag', '#lower'].map(s => box(document.querySelector(s)));
          const root = [...document.querySelectorAll('#title > b')].map(box);  // the root cause, the final failure
          return {check: b, onTop: c.contains(hit), others, root};
        }""")
        b = seen["check"]
        root = seen["root"][-1]  # the last bold part of the root-cause text (the final failure, else the root)
        assert seen["onTop"] and b["height"] < 1.6 * root["height"], seen  # drawn on top, on one line
        assert b["left"] >= 0 and b["right"] <= VIEWPORT["width"] and b["top"] >= 0 and b["bottom"] <= VIEWPORT["height"]
        rect = {"x1": b["left"], "y1": b["top"], "x2": b["right"], "y2": b["bottom"]}
        for other in seen["others"] + seen["root"]:
            box = {"x1": other["left"], "y1": other["top"], "x2": other["right"], "y2": other["bottom"]}
            assert _overlap(rect, box) <= 0, (b, other)
        # beside the root cause: right after its text, on its line or the next
        assert (abs(root["top"] - b["top"]) < 1 and b["left"] >= root["right"]) or 0 <= b["top"] - root["bottom"] < root["height"]
        page.screenshot(path=str(shots / "trace-root-cause-check.png"))
        assert errors == []
