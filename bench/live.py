"""Benchmark of the live path: span acknowledged -> its trace's root cause queryable.

A real ``tracedag collect`` process (converters in child processes, continuous build and score)
receives generated agent traffic over OTLP/HTTP, paced at each ``--rates`` value (spans/s), for
``--seconds``. Every request holds whole traces only (``bench/gen.py``: agent loops with tool
errors and retries, so rules find failing steps), each sent with fresh trace ids. For every
trace that has a root cause (the traces ``root_causes`` returns once everything is built: a
tool error that a retry recovered is no root cause), the latency is the time from the
acknowledgement of the request that completed it to the first poll of the ``root_causes`` named
query (``--poll`` seconds apart, through the same DuckDB views a user queries) that returns it.
Polling goes on until nothing new appeared for ``--settle`` seconds after the load stopped.

Beside it, in the same run: the acknowledged-only latency of the same requests (p50/p99, the
floor every live figure includes) and the time one ``root_causes`` poll takes at the end (the
granularity of the measurement).

    python bench/live.py --rates 1000 10000 40000 --seconds 30
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.table import Table

from bench.gen import whole_trace_requests
from bench.ingest import _unique, tid_offsets
from tracedag.pipeline.store.querying import run_named

console = Console(width=160)


@dataclass
class Sent:
    """What one client sent: per acknowledged request, (ack time, salt, index, body number)."""

    acks: list[tuple[float, int, int, int]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    spans: int = 0
    errors: int = 0


def bodies_and_ids(n_spans: int, seed: int) -> tuple[list[bytes], list[list[bytes]], list[int]]:
    """Serialized requests of whole traces, the trace ids in each, and their span counts."""
    reqs = list(whole_trace_requests(n_spans, seed))
    bodies = [r.SerializeToString() for r in reqs]
    ids = [sorted({s.trace_id for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans}) for r in reqs]
    counts = [sum(len(ss.spans) for rs in r.resource_spans for ss in rs.scope_spans) for r in reqs]
    return bodies, ids, counts


def fresh_id(trace_id: bytes, salt: int, i: int) -> bytes:
    """The trace id a request ``i`` of client ``salt`` gets (6 bytes replaced, as ``bench.ingest._unique`` does)."""
    return trace_id[:10] + struct.pack(">HI", salt, i)


def client(port: int, bodies: list[bytes], ids: list[list[bytes]], counts: list[int], rate: float,
           seconds: float, salt: int, out: mp.Queue) -> None:
    """Send paced requests for ``seconds``; put a ``Sent`` on ``out``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/x-protobuf"}
    offsets = [tid_offsets(b, t) for b, t in zip(bodies, ids, strict=True)]
    sent, start, i = Sent(), time.monotonic(), 0
    while time.monotonic() < start + seconds:
        k = i % len(bodies)
        t0 = time.monotonic()
        conn.request("POST", "/v1/traces", body=_unique(bodies[k], offsets[k], salt, i), headers=headers)
        r = conn.getresponse()
        r.read()
        t1 = time.monotonic()
        if r.status == 200:
            sent.acks.append((t1, salt, i, k))
            sent.latencies.append(t1 - t0)
            sent.spans += counts[k]
        else:
            sent.errors += 1
            time.sleep(min(2.0, float(r.getheader("Retry-After") or 0.05)))
        i += 1
        ahead = start + sent.spans / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    out.put(sent)


class Collector:
    """A ``tracedag collect`` process with continuous build and score."""

    def __init__(self, data: Path, interval: float, tree: str = "") -> None:
        cmd = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "collect", "--http-port", "0",
               "--grpc-port", "0", "--data", str(data), "--build", "--build-interval", str(interval)]
        env = {**os.environ, "PYTHONPATH": tree} if tree else None  # tree: a directory holding another tracedag/
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            m = re.search(r"http_port=(\d+)", line)
            if m:
                self.port = int(m.group(1))
                return
        raise RuntimeError("collector did not start")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(60)


class Poller(threading.Thread):
    """Runs ``root_causes`` every ``every`` seconds; records when each trace id first appears."""

    def __init__(self, data: Path, every: float) -> None:
        super().__init__(daemon=True)
        self.data, self.every = data, every
        self.seen: dict[str, float] = {}
        self.query_seconds: list[float] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(self.every):
            self.poll()

    def poll(self) -> None:
        t0 = time.monotonic()
        try:
            rows = run_named(self.data, "root_causes").column("trace_id").to_pylist()
        except Exception:  # the views may not exist before the first build: poll again
            return
        t1 = time.monotonic()
        self.query_seconds.append(t1 - t0)
        for trace in rows:
            self.seen.setdefault(trace, t1)


def settle(poller: Poller, quiet: float) -> None:
    """Wait until no new root cause appeared for ``quiet`` seconds."""
    last, count = time.monotonic(), -1
    while time.monotonic() - last < quiet:
        time.sleep(poller.every)
        if len(poller.seen) != count:
            last, count = time.monotonic(), len(poller.seen)


def run_rate(rate: float, args: argparse.Namespace, bodies, ids, counts, tree: str = "") -> dict[str, float]:
    """One paced run at ``rate`` spans/s (the collector from ``tree`` when given); return the latency figures."""
    data = Path(tempfile.mkdtemp(prefix="bench-live-"))
    col = Collector(data, args.interval, tree)
    poller = Poller(data, args.poll)
    try:
        poller.start()
        sent = drive(col.port, bodies, ids, counts, rate, args)
        settle(poller, args.settle)
        poller.stop_event.set()
        poller.join(60)
        t0 = time.monotonic()
        final = set(run_named(data, "root_causes").column("trace_id").to_pylist())
        final_query = time.monotonic() - t0
        acked = {t: a for t, a in ack_times(sent, ids).items() if t in final}
    finally:
        col.stop()
        shutil.rmtree(data, ignore_errors=True)
    return figures(rate, sent, acked, poller, final_query, args)


def drive(port: int, bodies, ids, counts, rate: float, args: argparse.Namespace) -> list[Sent]:
    ctx = mp.get_context("fork")
    q: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=client, args=(port, bodies, ids, counts, rate / args.clients, args.seconds, j, q))
             for j in range(args.clients)]
    for p in procs:
        p.start()
    sent = [q.get() for _ in procs]
    for p in procs:
        p.join()
    return sent


def ack_times(sent: list[Sent], ids: list[list[bytes]]) -> dict[str, float]:
    """Fresh trace id (hex) of every trace sent -> when its request was acknowledged."""
    return {fresh_id(trace, salt, i).hex(): t for s in sent for t, salt, i, k in s.acks for trace in ids[k]}


def figures(rate: float, sent: list[Sent], acked: dict[str, float], poller: Poller, final_query: float,
            args: argparse.Namespace) -> dict[str, float]:
    lat = sorted(poller.seen[t] - a for t, a in acked.items() if t in poller.seen)
    acks = sorted(x for s in sent for x in s.latencies)
    return {
        "rate": rate, "offered": sum(s.spans for s in sent) / args.seconds,
        "traces": len(acked), "missing": len(acked) - len(lat),  # in the final result, never seen by a poll
        "p50": q(lat, 0.5), "p99": q(lat, 0.99), "ack_p50": q(acks, 0.5) * 1e3, "ack_p99": q(acks, 0.99) * 1e3,
        "poll": statistics.median(poller.query_seconds) if poller.query_seconds else float("nan"),
        "final_query": final_query, "errors": sum(s.errors for s in sent),
    }


def q(values: list[float], quantile: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(len(values) * quantile))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rates", type=float, nargs="+", default=[1000, 10000, 40000])
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each paced run")
    ap.add_argument("--spans", type=int, default=51_200, help="generated spans (requests are reused with fresh ids)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--interval", type=float, default=1.0, help="the collector's --build-interval")
    ap.add_argument("--poll", type=float, default=0.5, help="seconds between root_causes polls")
    ap.add_argument("--settle", type=float, default=15.0,
                    help="after the load, stop once no new root cause appeared for this many seconds")
    ap.add_argument("--baseline-tree", default="",
                    help="a directory holding another tracedag/ package (e.g. an older checkout): each rate is "
                         "also run with the collector from it, alternating, as the baseline of the same run")
    args = ap.parse_args(argv)
    bodies, ids, counts = bodies_and_ids(args.spans, 0)
    console.print(f"{len(bodies)} requests of whole traces, {sum(counts)} spans; {os.cpu_count()} CPUs; "
                  f"load average {os.getloadavg()[0]:.1f}")
    table = Table(title="span ack -> root cause queryable (tracedag collect with continuous build and score)")
    for col in ("code", "offered spans/s", "paced at", "traces with a root cause", "missing", "p50 s", "p99 s",
                "ack p50 ms", "ack p99 ms", "poll s", "errors", "load"):
        table.add_column(col, justify="right")
    trees = [("baseline", args.baseline_tree), ("this tree", "")] if args.baseline_tree else [("this tree", "")]
    for rate in args.rates:
        for label, tree in trees:
            f = run_rate(rate, args, bodies, ids, counts, tree)
            table.add_row(label, f"{f['offered']:,.0f}", f"{rate:,.0f}", str(f["traces"]), str(f["missing"]),
                          f"{f['p50']:.2f}", f"{f['p99']:.2f}", f"{f['ack_p50']:.1f}", f"{f['ack_p99']:.1f}",
                          f"{f['poll']:.2f}", str(f["errors"]), f"{os.getloadavg()[0]:.1f}")
    console.print(table)
    console.print("latency = first root_causes poll that returns the trace - ack of the request that completed it; "
                  "it includes up to one poll interval and one poll's duration ('poll s', median).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
