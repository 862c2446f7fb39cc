"""Benchmark: the web UI's trace view, from the click on a list row to the painted DAG and timeline.

A synthetic trace of ``--steps`` steps shaped like an agent's (a root agent running a loop of LLM
calls, each followed by 1-4 parallel tool calls, with a nested sub-agent doing the same every
``SUB_EVERY`` steps, and one failure propagating from a tool to the root) is inlined in the page
``tracedag report`` writes (``report.page_html``), its propagation path computed by the server's
code (``paths.propagation_path``). Chromium (Playwright) opens the page, clicks the trace's row and
waits for the DAG to be drawn and two animation frames (the paint). Printed: the median and spread
over ``--runs`` runs, beside the same measurement of a ``--baseline``-step trace in the same run, and
their ratio.

    python bench/ui_paint.py --steps 2000 --baseline 15 --runs 5
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from tracedag.pipeline.serve.paths import propagation_path
from tracedag.pipeline.serve.report import page_html

SUB_EVERY = 60
T0 = 1_764_460_800_000_000_000


class _Trace:
    """Builds nodes and edges in start order; ``clock`` is the next start (ns)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.nodes: list[dict[str, Any]] = []
        self.edges: list[dict[str, Any]] = []
        self.clock = T0

    def add(self, parent: str | None, step_type: str, name: str, ms: float, depth: int) -> str:
        sid = f"{len(self.nodes):016x}"
        self.nodes.append({"span_id": sid, "parent_span_id": parent, "step_type": step_type, "step_name": name,
                           "start_time_unix_nano": self.clock, "duration_ms": ms, "depth": depth,
                           "topo_index": len(self.nodes), "score": self.rng.choice([4.0, 5.0, 5.0])})
        if parent is not None:
            self.edges.append({"source": sid, "target": parent, "edge_kind": "parent"})
        return sid


def _loop(t: _Trace, parent: str, depth: int, budget: int) -> list[str]:
    """LLM call, then parallel tools, repeated until ``budget`` steps; returns the steps in order."""
    made: list[str] = []
    prev: list[str] = []
    while len(made) < budget:
        if depth == 1 and len(t.nodes) % SUB_EVERY < 5 and budget - len(made) > 12:
            sub = t.add(parent, "agent", f"sub-agent {len(t.nodes)}", 900.0, depth)
            made += [sub, *_loop(t, sub, depth + 1, 10)]
            head, tail = sub, [sub]
        else:
            head = t.add(parent, "llm", f"chat model-{len(t.nodes) % 7}", 400.0, depth)
            t.clock += 400_000_000
            made.append(head)
            tail = [t.add(parent, "tool", t.rng.choice(["search_docs", "get_order", "run_sql", "read_file"]),
                          150.0, depth) for _ in range(t.rng.randint(1, 4))]
            for tool in tail:
                t.edges.append({"source": head, "target": tool, "edge_kind": "sequence"})
            t.clock += 200_000_000
            made += tail
        for p in prev:  # the previous step(s) run before this one
            t.edges.append({"source": p, "target": head, "edge_kind": "sequence"})
        prev = tail
    return made


def synthetic(steps: int, seed: int = 1) -> dict[str, Any]:
    """A trace document (``Store.documents`` shape) of ``steps`` steps with a propagated failure."""
    t = _Trace(random.Random(seed))
    root = t.add(None, "agent", "assistant", 0.0, 0)
    _loop(t, root, 1, steps - 1)
    t.nodes[0]["duration_ms"] = (t.clock - T0) / 1e6
    tool = next(n for n in t.nodes[len(t.nodes) // 2:] if n["step_type"] == "tool")
    after = next(e["target"] for e in t.edges if e["source"] == tool["span_id"] and e["edge_kind"] == "sequence")
    failures = [{"span_id": tool["span_id"], "kind": "originating", "nearest_failing_upstream": [], "recovered": False},
                {"span_id": after, "kind": "propagated", "nearest_failing_upstream": [tool["span_id"]], "recovered": False},
                {"span_id": root, "kind": "propagated", "nearest_failing_upstream": [after], "recovered": False}]
    for f in failures:
        next(n for n in t.nodes if n["span_id"] == f["span_id"])["score"] = 1.0
    cause = {"root_span_id": tool["span_id"], "failed_span_id": root, "root_step_name": tool["step_name"],
             "failed_step_name": "assistant", "root_taxonomy_l1": "execution"}
    trace = {"trace_id": f"{steps:032x}", "agent": "bench", "service_name": "bench-agent", "conversation_id": "c",
             "status": "failed", "passed": False, "steps": steps, "workflow_score": 2.0, "duration_ms": 1.0,
             "start_time": "2025-11-30T00:00:00", "start_time_unix_nano": T0, "root_cause_step": tool["step_name"]}
    spans = [{"span_id": n["span_id"], "name": n["step_name"]} for n in t.nodes]
    doc = {"trace": trace, "nodes": t.nodes, "edges": t.edges, "spans": spans, "scores": [], "failures": failures,
           "root_cause": cause, "agent": "bench"}
    doc["propagation_path"] = propagation_path(cause, failures, t.edges)
    return doc


_CLICK_TO_PAINT = """(KEY) => new Promise(resolve => {
    const t0 = performance.now();
    new MutationObserver((m, obs) => {
      if (document.querySelector("#dag").dataset[KEY]) {
        obs.disconnect();
        requestAnimationFrame(() => requestAnimationFrame(() => resolve(performance.now() - t0)));
      }
    }).observe(document.querySelector('#dag'), {attributes: true});
    document.querySelector('#traces tbody tr[data-trace-id]').click();
})"""


def paint_seconds(browser: Any, doc: dict[str, Any], runs: int, tmp: Path, key: str) -> list[float]:
    """Seconds from the click on the trace's row to the trace view painted, one per run (fresh page).

    ``key``: ``painted`` (the first view of the DAG and the whole timeline drawn) or ``trace`` (every
    step in the graph: the steps outside the first view are added after the first paint).
    """
    path = tmp / f"trace-{len(doc['nodes'])}.html"
    path.write_text(page_html({"traces": [doc["trace"]], "total": 1, "details": {doc["trace"]["trace_id"]: doc}}))
    out = []
    errors: list[str] = []
    for _ in range(runs):
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(path.as_uri())
        page.wait_for_selector("#traces tbody[data-loaded]")
        out.append(page.evaluate(_CLICK_TO_PAINT, key) / 1000)
        page.wait_for_selector("#dag[data-trace]")
        drawn = page.evaluate("window.tracedagCy.nodes().length")
        if errors or drawn != len(doc["nodes"]):
            raise SystemExit(f"the page failed: {errors or drawn}")
        page.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--baseline", type=int, default=15, help="steps of the baseline trace")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("no chromium on PATH (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        figures: dict[tuple[int, str], list[float]] = {}
        for steps in (args.baseline, args.steps):
            doc = synthetic(steps)
            paint_seconds(browser, doc, 1, Path(tmp), "trace")  # warm-up: the browser's caches, the JIT
            for key in ("painted", "trace"):
                figures[(steps, key)] = paint_seconds(browser, doc, args.runs, Path(tmp), key)
        browser.close()
    what = {"painted": "first view painted (DAG + timeline)", "trace": "every step in the graph"}
    for (steps, key), times in figures.items():
        print(f"{steps:>6} steps, click to {what[key]}: median {statistics.median(times):.3f} s "
              f"(min {min(times):.3f}, max {max(times):.3f}, {len(times)} runs)")
    for key in ("painted", "trace"):
        ratio = statistics.median(figures[(args.steps, key)]) / statistics.median(figures[(args.baseline, key)])
        print(f"{what[key]}: {args.steps} steps / {args.baseline} steps = x{ratio:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
