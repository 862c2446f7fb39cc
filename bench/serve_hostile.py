"""Benchmark: tracedag serve against one hostile or heavy client (#29 serve items 1, 2, 3, 6).

A fresh server per run on a bench store (``bench/gen.py`` spans, built and scored; ``--data``
reuses one). The baseline, measured in the same run on the same server before each attack: its
resident memory (VmRSS) idle after one small query, its open file descriptors, and the p50/p99 of
``GET /healthz`` over ``--probe-seconds`` while nothing else runs. Then, each printed beside it:

- item 1: peak RSS while two clients at once ask for ``select repeat('x', 60000) s from range(10000)``
  (600 MB of JSON; refused with 413 past ``--sql-max-bytes``), and the seconds to that answer;
- item 2: peak RSS while one client sends a 1 GiB Content-Length and another a chunked body of up
  to 256 MiB (both refused with 413 before / at 4 MiB read);
- item 6: peak RSS and open descriptors while ``--connections`` sockets trickle a request head,
  and the descriptors once the header deadline passed;
- item 3: ``/healthz`` p50/p99 while four 256 KiB ``select 1 where 1 in (1,1,...)`` are checked.

Medians over ``--runs``. Nothing is asserted: the figures go to README's reliability section.

    python bench/serve_hostile.py --spans 20000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from serve import ensure_store, free_port  # noqa: E402

from tests.serve.hostile_support import PeakRss, open_fds, raw_head, read_reply, rss_bytes  # noqa: E402
from tracedag.pipeline.serve.sqlguard import MAX_SQL_BYTES  # noqa: E402

HUGE = "select repeat('x', 60000) s from range(10000)"
IN_LIST = "select 1 where 1 in (" + ",".join(["1"] * ((MAX_SQL_BYTES - 64) // 2)) + ")"
MIB = 1 << 20


@contextmanager
def server(data: Path, header_timeout: float) -> Iterator[tuple[str, int]]:
    """``tracedag serve`` on a free port: (url, pid)."""
    port = free_port()
    cmd = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "serve", "--data", str(data),
           "--port", str(port), "--header-timeout", str(header_timeout)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url, proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def healthz(url: str, seconds: float | None = None, stop: threading.Event | None = None) -> list[float]:
    """Latencies of sequential /healthz requests for ``seconds`` or until ``stop`` is set."""
    out: list[float] = []
    end = time.monotonic() + (seconds or 1e9)
    with httpx.Client(base_url=url, timeout=120) as c:
        while time.monotonic() < end and not (stop and stop.is_set()):
            t0 = time.perf_counter()
            c.get("/healthz")
            out.append(time.perf_counter() - t0)
            time.sleep(0.01)
    return out


def at_once(*tasks: Callable[[], object]) -> None:
    threads = [threading.Thread(target=t) for t in tasks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def p(latencies: list[float], q: int) -> float:
    return statistics.quantiles(latencies, n=100)[q - 1] if len(latencies) > 1 else latencies[0]


def item1(url: str, pid: int) -> dict[str, float]:
    seconds: list[float] = []

    def ask() -> None:
        t0 = time.monotonic()
        httpx.post(f"{url}/api/sql", json={"sql": HUGE}, timeout=600)
        seconds.append(time.monotonic() - t0)

    with PeakRss(pid) as peak:
        at_once(ask, ask)
    return {"item 1: peak RSS, 2 x 600 MB answers (MiB)": peak.peak / MIB,
            "item 1: seconds to the 413": statistics.median(seconds)}


def _content_length(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(raw_head(port, "POST", "/api/sql", {"Content-Type": "application/json",
                                                      "Content-Length": str(1 << 30)}))
        read_reply(s, 30)


def _chunked(port: int) -> None:
    chunk = b"-" * 65536
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(raw_head(port, "POST", "/api/sql", {"Content-Type": "application/json",
                                                      "Transfer-Encoding": "chunked"}))
        s.settimeout(5)
        try:
            for _ in range(4096):  # 256 MiB
                s.sendall(framed)
        except OSError:
            pass
        read_reply(s, 30)


def item2(url: str, pid: int) -> dict[str, float]:
    port = int(url.rsplit(":", 1)[1])
    with PeakRss(pid) as peak:
        at_once(lambda: _content_length(port), lambda: _chunked(port))
    return {"item 2: peak RSS, 1 GiB and chunked bodies (MiB)": peak.peak / MIB}


def item6(url: str, pid: int, connections: int, header_timeout: float) -> dict[str, float]:
    port = int(url.rsplit(":", 1)[1])
    with PeakRss(pid) as peak, PeakRss(pid, open_fds) as fds:
        t0 = time.monotonic()
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
        for s in socks:
            s.sendall(b"GET /heal")
        opened = time.monotonic() - t0
        time.sleep(header_timeout + 3)
        after = open_fds(pid)
        for s in socks:
            s.close()
    return {f"item 6: peak RSS, {connections} trickling connections (MiB)": peak.peak / MIB,
            f"item 6: seconds to open the {connections}": opened,
            f"item 6: peak open descriptors, {connections} trickling": fds.peak,
            f"item 6: open descriptors {header_timeout + 3:g} s later": after}


def item3(url: str) -> dict[str, float]:
    stop = threading.Event()
    latencies: list[float] = []
    prober = threading.Thread(target=lambda: latencies.extend(healthz(url, stop=stop)))
    prober.start()
    at_once(*[lambda: httpx.post(f"{url}/api/sql", json={"sql": IN_LIST}, timeout=600)] * 4)
    stop.set()
    prober.join()
    return {"item 3: /healthz p50 during 4 x 256 KiB checks (ms)": p(latencies, 50) * 1000,
            "item 3: /healthz p99 during 4 x 256 KiB checks (ms)": p(latencies, 99) * 1000}


def baseline(url: str, pid: int, probe_seconds: float) -> dict[str, float]:
    httpx.post(f"{url}/api/sql", json={"sql": "select 1"}, timeout=120)
    time.sleep(1)
    idle = healthz(url, probe_seconds)
    return {"rss": rss_bytes(pid) / MIB, "fds": open_fds(pid), "p50": p(idle, 50) * 1000, "p99": p(idle, 99) * 1000}


def one_run(data: Path, args: argparse.Namespace) -> tuple[dict[str, float], dict[str, float]]:
    with server(data, args.header_timeout) as (url, pid):
        base = baseline(url, pid, args.probe_seconds)
        got = {**item1(url, pid), **item2(url, pid), **item6(url, pid, args.connections, args.header_timeout),
               **item3(url)}
    return base, got


def _baseline_of(name: str, base: dict[str, float]) -> tuple[str, float | None]:
    if "RSS" in name:
        return "idle RSS", base["rss"]
    if "descriptors" in name:
        return "idle descriptors", base["fds"]
    if "p50" in name:
        return "idle /healthz p50", base["p50"]
    if "p99" in name:
        return "idle /healthz p99", base["p99"]
    return "", None


def report(runs: list[tuple[dict[str, float], dict[str, float]]]) -> Table:
    base = {k: statistics.median(r[0][k] for r in runs) for k in runs[0][0]}
    table = Table(title=f"tracedag serve under hostile clients (medians of {len(runs)} runs)")
    for col in ("measure", "value", "baseline (same run)", "baseline", "ratio"):
        table.add_column(col, justify="left" if col in ("measure", "baseline (same run)") else "right")
    for name in runs[0][1]:
        value = statistics.median(r[1][name] for r in runs)
        label, ref = _baseline_of(name, base)
        ratio = f"x{value / ref:.2f}" if ref else ""
        table.add_row(name, f"{value:,.1f}", label, "" if ref is None else f"{ref:,.1f}", ratio)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=20_000)
    ap.add_argument("--data", type=Path, help="a store to reuse (made when missing)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--connections", type=int, default=2000)
    ap.add_argument("--header-timeout", type=float, default=3.0)
    ap.add_argument("--probe-seconds", type=float, default=5.0)
    args = ap.parse_args()
    data = args.data or Path(tempfile.mkdtemp(prefix="bench-serve-hostile-")) / "store"
    ensure_store(data, args.spans)
    runs = [one_run(data, args) for _ in range(args.runs)]
    Console(width=160).print(report(runs))


if __name__ == "__main__":
    main()
