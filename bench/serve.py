"""Benchmark: tracedag serve's API endpoints cold and warm, /metrics, server memory, DAG first paint.

On a bench store (``bench/gen.py`` spans, built and scored; ``--data`` reuses one), for each
endpoint: *cold* = the first request after the server started (a fresh server per run, so no
cached result: the /metrics text an earlier server kept on disk, ``state/metrics/``, is removed
before each start unless ``--keep-metrics-text``; the server's warm-up thread starts computing the
whole-store results at the same time), *warm* = the same request repeated on a running server
(answered from the result cache of the build state; the "new id each time" row asks for a trace not
asked for before). Printed: p50 and p95 over ``--runs``, beside the baseline measured in
the same run: the same work in-process without HTTP (``run_named`` of the query the endpoint runs,
``metrics.compute`` for /metrics). Server memory: resident set (VmRSS) and its peak (VmHWM) of the
server process after the runs. With ``--browser``, the time from a click to the first painted DAG
of a synthetic ``--dag-steps``-step trace in Chromium (the report page, data inlined).

    python bench/serve.py --spans 1000000 --data /tmp/bench-serve --runs 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gen  # noqa: E402

from tracedag.pipeline.serve import encode, metrics  # noqa: E402
from tracedag.pipeline.serve.data import Store  # noqa: E402
from tracedag.pipeline.store.querying import run_named  # noqa: E402
from tracedag.schemas.layout import state_dir  # noqa: E402


def ensure_store(data: Path, spans: int) -> None:
    if (data / "tables" / "traces").exists():
        return
    from tracedag.pipeline.dag.build import build_store
    from tracedag.pipeline.score.runner import score_store
    gen.make_store(data, spans, seed=0)
    build_store(data, idle_seconds=0.0, progress=True)
    score_store(data, progress=True)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, data: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "serve", "--data", str(data),
             "--port", str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise SystemExit("the server did not start")

    def memory_mb(self) -> tuple[float, float]:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines())
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(20)


def endpoints(data: Path) -> list[tuple[str, str, Any, Callable[[], Any]]]:
    """(label, method, path, in-process baseline) per endpoint."""
    store = Store(data)
    traces = run_named(data, "trace_summary", {}).to_pylist()
    rooted = max((t for t in traces if t["root_cause_span_id"]), key=lambda t: t["steps"])
    tid = rooted["trace_id"]
    others = [t["trace_id"] for t in traces if t["trace_id"] != tid][:500]
    return [
        ("GET /api/queries", "GET", "/api/queries", lambda: None),
        ("GET /api/queries/step_stats", "GET", "/api/queries/step_stats",
         lambda: b"".join(encode.stream(run_named(data, "step_stats", {}), "json"))),
        ("GET /api/queries/failures?format=arrow", "GET", "/api/queries/failures?format=arrow",
         lambda: b"".join(encode.stream(run_named(data, "failures", {}), "arrow"))),
        ("GET /api/traces?limit=200", "GET", "/api/traces?limit=200", lambda: Store(data).traces(limit=200)),
        ("GET /api/traces?status=failed", "GET", "/api/traces?status=failed",
         lambda: Store(data).traces(status="failed")),
        (f"GET /api/traces/{{id}} ({rooted['steps']} steps)", "GET", f"/api/traces/{tid}",
         lambda: store.documents([tid], {"trace_id": tid})),
        ("GET /api/traces/{id}, a new id each time", "GET", lambda i: f"/api/traces/{others[i % len(others)]}",
         lambda: store.documents([others[0]], {"trace_id": others[0]})),
        ("POST /api/sql count(*) spans", "POST", "/api/sql",
         lambda: _in_process_sql(data)),
        ("GET /metrics", "GET", "/metrics", lambda: metrics.compute(data)),
    ]


def _in_process_sql(data: Path) -> Any:
    from tracedag.pipeline.store.querying import run_sql
    return run_sql(data, "select count(*) from spans", read_only=True)


_COUNTER = iter(range(10**9))


def _request(client: httpx.Client, method: str, path: str | Callable[[int], str]) -> float:
    if callable(path):
        path = path(next(_COUNTER))
    t0 = time.perf_counter()
    r = client.post(path, content="select count(*) from spans") if method == "POST" else client.get(path)
    assert r.status_code == 200, (path, r.status_code, r.text[:200])
    return time.perf_counter() - t0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def drop_metrics_text(data: Path) -> None:
    """Remove the /metrics texts kept on disk (``metrics.DISK``), so that a new server computes its first."""
    shutil.rmtree(state_dir(data) / metrics.DISK, ignore_errors=True)


def measure(data: Path, runs: int, warm_runs: int, keep_text: bool = False) -> tuple[dict[str, dict[str, float]],
                                                                                  tuple[float, float]]:
    eps = endpoints(data)
    cold: dict[str, list[float]] = {e[0]: [] for e in eps}
    warm: dict[str, list[float]] = {e[0]: [] for e in eps}
    base: dict[str, list[float]] = {e[0]: [] for e in eps}
    memory = (0.0, 0.0)
    for run in range(runs):
        if not keep_text:
            drop_metrics_text(data)
        server = Server(data)
        try:
            with httpx.Client(base_url=server.url, timeout=600) as c:
                order = eps[run % len(eps):] + eps[:run % len(eps)]  # no endpoint always pays the first connection
                for label, method, path, _ in order:
                    cold[label].append(_request(c, method, path))
                for _ in range(warm_runs):
                    for label, method, path, _ in eps:
                        warm[label].append(_request(c, method, path))
            memory = max(memory, server.memory_mb())
        finally:
            server.stop()
        for label, _, _, baseline in eps:
            t0 = time.perf_counter()
            baseline()
            base[label].append(time.perf_counter() - t0)
    out = {label: {"cold_p50": _pct(cold[label], 0.5), "cold_p95": _pct(cold[label], 0.95),
                   "warm_p50": _pct(warm[label], 0.5), "warm_p95": _pct(warm[label], 0.95),
                   "baseline": statistics.median(base[label])} for label, *_ in eps}
    return out, memory


def first_paint(steps: int, runs: int) -> list[float] | None:
    """Seconds from the click on a synthetic ``steps``-step trace to its first view painted, in Chromium
    (the page and the measurement of bench/ui_paint.py, which also times a small baseline trace)."""
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if chromium is None:
        return None
    import ui_paint

    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            return ui_paint.paint_seconds(browser, ui_paint.synthetic(steps), runs, Path(tmp), "painted")
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "tracedag-bench-serve")
    ap.add_argument("--runs", type=int, default=5, help="fresh servers (cold samples)")
    ap.add_argument("--warm", type=int, default=4, help="warm repeats per server")
    ap.add_argument("--browser", action="store_true", help="also time the DAG first paint in Chromium")
    ap.add_argument("--dag-steps", type=int, default=2000)
    ap.add_argument("--keep-metrics-text", action="store_true",
                    help="leave the /metrics text an earlier server kept: its cold figure is then a file read")
    args = ap.parse_args(argv)
    ensure_store(args.data, args.spans)
    spans = run_named(args.data, "step_stats", {}).num_rows  # warms the OS page cache like any first reader
    del spans
    figures, (rss, peak) = measure(args.data, args.runs, args.warm, args.keep_metrics_text)
    table = Table(title=f"tracedag serve on {args.data} ({args.runs} cold runs, {args.runs * args.warm} warm)")
    for col in ("endpoint", "cold p50 s", "cold p95 s", "warm p50 s", "warm p95 s", "in-process baseline s",
                "cold / baseline"):
        table.add_column(col, justify="left" if col == "endpoint" else "right")
    for label, f in figures.items():
        ratio = f"{f['cold_p50'] / f['baseline']:.2f}" if f["baseline"] > 1e-4 else "-"
        table.add_row(label, f"{f['cold_p50']:.3f}", f"{f['cold_p95']:.3f}", f"{f['warm_p50']:.4f}",
                      f"{f['warm_p95']:.4f}", f"{f['baseline']:.3f}", ratio)
    console = Console(width=150)
    console.print(table)
    console.print(f"server memory after the runs: RSS {rss:.0f} MB, peak {peak:.0f} MB")
    if args.browser:
        paint = first_paint(args.dag_steps, 3)
        if paint is None:
            console.print("DAG first paint: skipped (no chromium or playwright)")
        else:
            console.print(f"DAG first paint of a {args.dag_steps}-step trace in Chromium: median "
                          f"{statistics.median(paint):.2f} s (runs {', '.join(f'{t:.2f}' for t in paint)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
