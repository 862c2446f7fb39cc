"""E48 long soak (``-m slow``; ``TRACEDAG_SOAK_SECONDS``, default 7200): the real collector process
at a steady rate from a real exporter, with random windows of overload (503) from bursts of large
bodies. Sampled every ``SAMPLE_SECONDS``: the process tree's RSS, its open file descriptors, the
spool's bytes and the number of spans Parquet files. They must stay bounded (no leak: the second
half of the run may not outgrow the first by more than a margin), and at the end every span whose
export returned SUCCESS is stored exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.collector.collector_support import (
    make_request,
    make_span,
    post,
    rss_bytes,
    start_process,
    stop_process,
)
from tests.pinned_venv import client_env
from tracedag.pipeline.store.views import connect

HERE = Path(__file__).resolve().parent
SOAK_SECONDS = float(os.environ.get("TRACEDAG_SOAK_SECONDS", "7200"))
SAMPLE_SECONDS = 10.0
RATE = 2000  # spans/s from the steady client
BURST_CLIENTS, BURST_MIB = 12, 2


@dataclass
class Sample:
    t: float
    rss_mib: float
    fds: int
    spool_mib: float
    files: int


def _tree(pid: int) -> list[int]:
    out = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            out += _tree(int(child))
    return out


def _sample(pid: int, data: Path, t0: float) -> Sample:
    rss = fds = 0
    for p in _tree(pid):
        rss += rss_bytes(p)
        try:
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            continue
    spool = sum(f.stat().st_size for f in (data / "spool").rglob("seg-*") if f.is_file())
    files = len(list((data / "tables" / "spans").rglob("*.parquet")))
    return Sample(time.monotonic() - t0, rss / 2**20, fds, spool / 2**20, files)


def _bursts(port: int, stop: threading.Event, rng: random.Random, log: list[tuple[int, int]]) -> None:
    """Every 20-60 s, a few seconds of large concurrent bodies past the in-flight budget (503s)."""
    n = 0
    while not stop.wait(rng.uniform(20, 60)):
        bodies = []
        for _ in range(BURST_CLIENTS):
            span = make_span(10**9 + n, name="burst")
            n += 1
            kv = span.attributes.add()
            kv.key, kv.value.string_value = "gen_ai.input.messages", "x" * (BURST_MIB * 2**20)
            bodies.append(make_request([span]).SerializeToString())
        with ThreadPoolExecutor(BURST_CLIENTS) as pool:
            statuses = [r.status for r in pool.map(lambda b: post(port, b), bodies)]
        log.append((statuses.count(200), statuses.count(503)))


def _bounded(samples: list[Sample], field: str, slack: float) -> None:
    half = len(samples) // 2
    first = max(getattr(s, field) for s in samples[:half])
    second = max(getattr(s, field) for s in samples[half:])
    assert second <= first * 1.25 + slack, f"{field} grew: first half max {first}, second half max {second}"


@pytest.mark.slow
@pytest.mark.timeout(SOAK_SECONDS + 900)  # the suite's 300 s would end it
def test_e48_soak_steady_rate_with_503_windows(tmp_path: Path) -> None:
    seconds = SOAK_SECONDS
    data = tmp_path / "data"
    proc, port, _ = start_process(data, "--max-inflight", "16MiB", "--spool-retention", "0")
    acked_file = tmp_path / "acked.txt"
    client = subprocess.Popen(
        [sys.executable, str(HERE / "load_client.py"), "http", f"http://127.0.0.1:{port}/v1/traces",
         str(acked_file), str(seconds), "200", str(RATE)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=client_env(), text=True)
    stop, bursts = threading.Event(), []
    burster = threading.Thread(target=_bursts, args=(port, stop, random.Random(48), bursts), daemon=True)
    burster.start()
    samples, t0 = [], time.monotonic()
    try:
        while client.poll() is None:
            time.sleep(SAMPLE_SECONDS)
            samples.append(_sample(proc.pid, data, t0))
    finally:
        stop.set()
        burster.join(120)
        out = client.communicate(timeout=60)[0]
        assert stop_process(proc, signal.SIGTERM, timeout=300) == 0
    for s in samples:
        print(f"t={s.t:7.0f}s rss={s.rss_mib:6.0f} MiB fds={s.fds:4d} spool={s.spool_mib:7.1f} MiB files={s.files}")
    print(out.strip(), "bursts (200, 503):", bursts)
    assert bursts and any(refused for _, refused in bursts), "no 503 window happened"
    assert max(s.rss_mib for s in samples) < 400
    _bounded(samples, "rss_mib", 20)
    _bounded(samples, "fds", 8)
    _bounded(samples, "spool_mib", 64)
    _bounded(samples, "files", 16)
    acked = {line for line in acked_file.read_text().splitlines() if len(line) == 49}
    con = connect(data)
    assert con.sql("select count(*) - count(distinct (trace_id, span_id)) from spans").fetchall() == [(0,)]
    stored = {f"{t}:{s}" for t, s in con.sql("select trace_id, span_id from spans where name <> 'burst'").fetchall()}
    assert acked and acked <= stored, f"{len(acked - stored)} acknowledged spans lost"
    assert len(acked) >= 0.7 * RATE * seconds  # the rate was held, 503 windows aside
