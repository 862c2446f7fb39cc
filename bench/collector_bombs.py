"""Benchmark: peak resident memory of ``tracedag collect`` under 32 concurrent gzip bombs (issue #29 item 12).

For each run a fresh collector process (default limits: 64 MiB per request, 128 MiB in flight)
is measured, RSS sampled every 5 ms from /proc:

- *idle*: resident memory once started (the baseline);
- *normal traffic*: ``--clients`` clients each sending ``--requests`` legitimate gzip requests of
  about 1 MiB (the baseline under load);
- *HTTP bombs* / *gRPC bombs*: 32 concurrent requests, each about 1 MB of gzip inflating to
  1 GiB of zeros (gRPC: real compressed messages, flag 1, ``grpc-encoding: gzip``).

Printed: medians over ``--runs`` of the peak and of its growth over idle, and the growth's
ratio to the normal-traffic growth and to the in-flight budget.

    python bench/collector_bombs.py --runs 3
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.table import Table

from tests.collector.collector_support import (
    make_request,
    make_span,
    post,
    rss_bytes,
    start_process,
    stop_process,
)
from tests.collector.test_bomb_budget import BOMBS, BUDGET, gzip_bomb, peak_during, post_bomb, send_grpc_bomb

MiB = 2**20


def legit_body(i: int) -> bytes:
    """A gzip request of one span carrying about 1 MiB of text."""
    span = make_span(i, name=f"normal-{i}")
    kv = span.attributes.add()
    kv.key, kv.value.string_value = "gen_ai.input.messages", f"message {i} " * (MiB // 10)
    return gzip.compress(make_request([span]).SerializeToString())


def normal_traffic(port: int, clients: int, requests: int) -> Callable[[], object]:
    bodies = [legit_body(i) for i in range(clients)]

    def client(i: int) -> list[int]:
        return [post(port, bodies[i], headers={"Content-Encoding": "gzip"}).status for _ in range(requests)]

    def run() -> object:
        with ThreadPoolExecutor(clients) as pool:
            return list(pool.map(client, range(clients)))
    return run


def bombs(send: Callable[[int, bytes], object], port: int, bomb: bytes) -> Callable[[], object]:
    def run() -> object:
        with ThreadPoolExecutor(BOMBS) as pool:
            return list(pool.map(lambda _: send(port, bomb), range(BOMBS)))
    return run


def one_run(args: argparse.Namespace, bomb: bytes) -> dict[str, float]:
    """Idle RSS and the peak under each load, one fresh collector per load (MiB)."""
    out: dict[str, float] = {}
    for name in ("normal traffic", "HTTP bombs", "gRPC bombs"):
        with tempfile.TemporaryDirectory() as tmp:
            proc, http_port, grpc_port = start_process(Path(tmp), env={"TRACEDAG_CONVERTERS": "1"})
            try:
                time.sleep(0.5)
                out["idle"] = min(out.get("idle", float("inf")), rss_bytes(proc.pid) / MiB)
                load = {
                    "normal traffic": normal_traffic(http_port, args.clients, args.requests),
                    "HTTP bombs": bombs(post_bomb, http_port, bomb),
                    "gRPC bombs": bombs(send_grpc_bomb, grpc_port, bomb),
                }[name]
                out[name] = peak_during(proc.pid, load)[0] / MiB
            finally:
                stop_process(proc)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=4, help="requests per normal-traffic client")
    args = parser.parse_args()
    bomb = gzip_bomb()
    runs = [one_run(args, bomb) for _ in range(args.runs)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    normal_growth = med["normal traffic"] - med["idle"]
    table = Table(title=f"tracedag collect peak RSS, medians of {args.runs} runs (in-flight budget "
                        f"{BUDGET // MiB} MiB; bomb: {len(bomb) / 1e6:.2f} MB of gzip -> 1 GiB)")
    for col in ("load", "peak MiB", "growth over idle MiB", "x normal growth", "growth / budget"):
        table.add_column(col, justify="right")
    for name in ("idle", "normal traffic", "HTTP bombs", "gRPC bombs"):
        growth = med[name] - med["idle"]
        ratio = f"{growth / normal_growth:.2f}" if name != "idle" and normal_growth > 0 else "-"
        table.add_row(name, f"{med[name]:.0f}", f"{growth:.0f}", ratio, f"{growth / (BUDGET / MiB):.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
