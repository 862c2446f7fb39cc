"""Benchmark (#29 items 4 and 5): unknown trace ids and 200 concurrent trace views on tracedag serve.

On a bench store (``bench/gen.py`` spans, built and scored; ``--data`` reuses one), against a real
``tracedag serve`` on loopback, after its warm-up:

- *unknown ids*: ``--ids`` random ids asked one after the other (all 404): total seconds and per-id
  median, beside one known-id view (first view of a trace, not cached; then cached).
- *concurrent views*: ``--views`` GETs of ``/api/traces/{id}`` over every trace of the store, from
  ``--clients`` threads at once: p50/p95/max latency and whether the whole-store results stayed cached
  (``/api/traces`` timed before and after: a miss would recompute ``trace_summary``).
- *before/after in the same run*, in-process on the same store: the Store of ``data.py`` before #29
  (loaded from git: one 64-entry cache for everything, no id set; ``--old-ids`` unknown ids) against
  today's: an unknown id each, the concurrent views' p50/p95, and whether ``trace_summary`` stayed cached.

Medians of ``--runs`` runs.

    python bench/serve_traces.py --spans 20000 --runs 3
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from serve import ensure_store, free_port  # noqa: E402

from tracedag.pipeline.serve.data import Store  # noqa: E402


def start(data: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "serve",
                             "--data", str(data), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("tracedag serve did not start")


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def unknown_ids(c: httpx.Client, n: int) -> tuple[float, float]:
    times = [timed(lambda: c.get(f"/api/traces/{uuid.uuid4().hex}")) for _ in range(n)]
    return sum(times), statistics.median(times)


def concurrent_views(url: str, ids: list[str], views: int, clients: int) -> list[float]:
    picks = [ids[i % len(ids)] for i in range(views)]
    random.shuffle(picks)
    with httpx.Client(base_url=url, timeout=600, limits=httpx.Limits(max_connections=clients)) as c:
        def one(tid: str) -> float:
            t0 = time.perf_counter()
            assert c.get(f"/api/traces/{tid}").status_code == 200
            return time.perf_counter() - t0
        with ThreadPoolExecutor(clients) as pool:
            return sorted(pool.map(one, picks))


BEFORE = "4c327b2"
"""The commit before #29's serve items: its ``pipeline/serve/data.py`` is the "before" Store."""


def before_store(data: Path) -> Any:
    """A Store of the pre-#29 ``data.py`` (64-entry cache shared by everything, no id set), loaded from git."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE}:pipeline/serve/data.py"], check=True,
                          capture_output=True, text=True).stdout
    module = types.ModuleType("tracedag_serve_data_before")
    exec(compile(text, f"{BEFORE}:data.py", "exec"), module.__dict__)  # the project's own file
    return module.Store(data)


def in_process(store: Any, view: Any, ids: list[str], n_unknown: int, views: int, clients: int) -> dict[str, float]:
    """Unknown ids one after the other, then ``views`` concurrent views, on one Store (warmed)."""
    store.warm()
    unknown = []
    for _ in range(n_unknown):
        t0 = time.perf_counter()
        with contextlib.suppress(Exception):  # NotFound of either version
            view(store, uuid.uuid4().hex)
        unknown.append(time.perf_counter() - t0)
    picks = [ids[i % len(ids)] for i in range(views)]
    random.shuffle(picks)
    with ThreadPoolExecutor(clients) as pool:
        lat = sorted(pool.map(lambda t: timed(lambda: view(store, t)), picks))
    kept = store.cache.peek(store.state(), repr(("trace_summary", [], None))) is not None
    return {"unknown_per_id": statistics.median(unknown), "p50": pct(lat, 0.5), "p95": pct(lat, 0.95),
            "kept": float(kept)}


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def one_run(data: Path, args: argparse.Namespace) -> dict[str, float]:
    proc, url = start(data)
    try:
        c = httpx.Client(base_url=url, timeout=600)
        ids = [t["trace_id"] for t in c.get("/api/traces", params={"limit": 10_000}).json()["traces"]]
        c.get(f"/api/traces/{ids[0]}")  # the id set and the whole-store results are ready
        first = timed(lambda: c.get(f"/api/traces/{ids[1]}"))
        cached = statistics.median(timed(lambda: c.get(f"/api/traces/{ids[1]}")) for _ in range(5))
        total, per_id = unknown_ids(c, args.ids)
        list_before = timed(lambda: c.get("/api/traces", params={"limit": 200}))
        lat = concurrent_views(url, ids, args.views, args.clients)
        list_after = timed(lambda: c.get("/api/traces", params={"limit": 200}))
    finally:
        proc.terminate()
        proc.wait()
    old = in_process(before_store(data), lambda st, t: st.trace(t), ids, args.old_ids, args.views, args.clients)
    new = in_process(Store(data), lambda st, t: st.trace_json(t), ids, args.ids, args.views, args.clients)
    return {"traces": len(ids), "first_view": first, "cached_view": cached, "unknown_total": total,
            "unknown_per_id": per_id, "p50": pct(lat, 0.5), "p95": pct(lat, 0.95),
            "max": lat[-1], "list_before": list_before, "list_after": list_after,
            **{f"old_{k}": v for k, v in old.items()}, **{f"new_{k}": v for k, v in new.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--spans", type=int, default=20_000)
    ap.add_argument("--data", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ids", type=int, default=200)
    ap.add_argument("--old-ids", type=int, default=20, help="unknown ids asked of the pre-#29 Store (slow)")
    ap.add_argument("--views", type=int, default=200)
    ap.add_argument("--clients", type=int, default=32)
    args = ap.parse_args(argv)
    data = args.data or Path(tempfile.mkdtemp(prefix="bench-serve-traces-")) / "store"
    ensure_store(data, args.spans)
    runs = [one_run(data, args) for _ in range(args.runs)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"store: {data} ({args.spans} spans, {med['traces']:.0f} traces), medians of {args.runs} runs")
    print(f"{args.ids} unknown ids:          {med['unknown_total']:.3f} s in all, {med['unknown_per_id'] * 1e3:.2f} ms each")
    print(f"  a known id: first view {med['first_view'] * 1e3:.1f} ms, cached {med['cached_view'] * 1e3:.2f} ms")
    print(f"{args.views} concurrent views ({args.clients} clients): p50 {med['p50'] * 1e3:.1f} ms, "
          f"p95 {med['p95'] * 1e3:.1f} ms, max {med['max'] * 1e3:.1f} ms")
    print(f"  /api/traces?limit=200 before the views {med['list_before'] * 1e3:.1f} ms, after {med['list_after'] * 1e3:.1f} ms")
    print("in-process, before #29 (data.py of " + BEFORE + ") vs now, same store, same run:")
    for label, key, unit in (("unknown id, each", "unknown_per_id", 1e3), ("views p50", "p50", 1e3),
                             ("views p95", "p95", 1e3)):
        o, n = med[f"old_{key}"], med[f"new_{key}"]
        print(f"  {label:18} before {o * unit:9.1f} ms   now {n * unit:9.2f} ms   x{o / n:.0f}")
    print(f"  trace_summary still cached after the views: before {bool(med['old_kept'])}, now {bool(med['new_kept'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
