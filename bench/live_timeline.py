"""``bench/live.py --timeline``'s parts: when each trace's spans were first in a file, each step of its way after
its ack (a round's start, lock, build and score per the collector's timeline, the polls), and the tables of them."""

from __future__ import annotations

import bisect
import itertools
import json
import math
import statistics
import threading
import time
from pathlib import Path

from rich.table import Table


def q(values: list[float], quantile: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(len(values) * quantile))]


class FileWatch(threading.Thread):
    """Lists the spans files every 0.1 s; records when each trace id was first in one (monotonic): the file's
    ctime, which its rename into ``tables/spans`` set (when a build can first read it), so neither the listing's
    period nor this thread's lag under load counts; the listing's time where the ctime is later (a file
    rewritten in place)."""

    def __init__(self, data: Path) -> None:
        super().__init__(daemon=True)
        self.root = data / "tables" / "spans"
        self.seen: dict[str, float] = {}
        self.stop = threading.Event()
        self._files: set[Path] = set()

    def run(self) -> None:
        import pyarrow.parquet as pq

        while not self.stop.wait(0.1):
            now = time.monotonic()
            for path in sorted(set(self.root.rglob("*.parquet")) - self._files):
                self._files.add(path)
                try:
                    renamed = min(now, path.stat().st_ctime - (time.time() - time.monotonic()))
                    ids = pq.read_table(path, columns=["trace_id"]).column("trace_id").unique().to_pylist()
                except OSError:  # compacted away meanwhile
                    continue
                for trace in ids:
                    self.seen.setdefault(trace.hex() if isinstance(trace, bytes) else str(trace), renamed)


STEPS = ("spans in a file", "grace expired", "round started", "round locked", "built", "scored", "a poll began",
         "first poll")
"""A trace's times after its ack (``trace_steps``), in the order they happen."""


def trace_steps(data: Path, timeline: Path, acked: dict[str, float], seen: dict[str, float], in_file: dict[str, float],
                polls: list[float], grace: float = 1.0) -> dict[str, list[float]]:
    """Seconds from each acked and seen trace's ack to each of ``STEPS`` (a listing of the spans files first showing
    it, ``FileWatch``; its last span's receipt + ``grace``; its build's round's start, lock, build end and score end
    per the timeline; the first poll begun after that, and the first poll that returned it).
    Monotonic times (acks, polls) are put on the wall clock with this process's offset between the two clocks."""
    import duckdb

    offset = time.time() - time.monotonic()
    rounds = {r["round"]: r for r in map(json.loads, timeline.read_text().splitlines()) if "round" in r}
    con = duckdb.connect()
    traces = str(data / "tables" / "traces" / "**" / "*.parquet")
    rows = con.sql(f"""select trace_id, min(build_id) as build_id, min(last_received_unix_nano) as last_received
                       from read_parquet('{traces}') group by trace_id""").fetchall()
    con.close()
    steps: dict[str, list[float]] = {name: [] for name in STEPS}
    for trace, build, last in rows:
        trace = trace.hex() if isinstance(trace, bytes) else str(trace)
        r = rounds.get(build)
        if trace not in acked or trace not in seen or trace not in in_file or r is None:
            continue
        ack = acked[trace] + offset
        after = polls[bisect.bisect_right(polls, r["scored"] - offset)] if polls[-1] > r["scored"] - offset else math.inf
        times = (in_file[trace] + offset, last / 1e9 + grace, r["start"], r["locked"], r["built"], r["scored"],
                 after + offset, seen[trace] + offset)
        for name, t in zip(STEPS, times, strict=True):
            steps[name].append(t - ack)
    return steps


def rounds_table(timeline: Path, title: str) -> Table:
    """Medians over the timeline's rounds (those that built traces) and store passes."""
    lines = [json.loads(x) for x in timeline.read_text().splitlines()]
    rounds = [r for r in lines if "round" in r]
    stores = [r for r in lines if "store" in r]
    table = Table(title=f"{title}: {len(rounds)} rounds that built traces, {len(stores)} store passes; medians")
    cells = {
        "traces a round": [r["traces"] for r in rounds],
        "round: waited for the lock s": [r["locked"] - r["start"] for r in rounds],
        "round: build s": [r["built"] - r["locked"] for r in rounds],
        "round: score s": [r["scored"] - r["built"] for r in rounds],
        "round: its thread's CPU s": [r.get("cpu", float("nan")) for r in rounds],
        "from a round's end to the next's start s": [b["start"] - a["scored"] for a, b in itertools.pairwise(rounds)],
        "store: traces a pass": [r["store"] for r in stores],
        "store: copy s (rounds held)": [r["copied"] - r["start"] for r in stores],
        "store: compute + write s": [r["written"] - r["copied"] for r in stores],
    }
    for col in ("what", "p50", "max"):
        table.add_column(col, justify="right")
    for name, vals in cells.items():
        table.add_row(name, f"{statistics.median(vals):.2f}" if vals else "-", f"{max(vals):.2f}" if vals else "-")
    return table


def steps_table(steps: dict[str, list[float]], title: str) -> Table:
    """Quantiles of each step's seconds after the ack, and the median of its increment over the step before."""
    table = Table(title=f"{title}: seconds from a trace's ack to each step ({len(steps[STEPS[0]])} traces)")
    for col in ("step", "p50", "p90", "p99", "max", "p50 of (this - previous step)"):
        table.add_column(col, justify="right")
    before: list[float] = [0.0] * len(steps[STEPS[0]])
    for name in STEPS:
        vals = steps[name]
        table.add_row(name, *(f"{q(sorted(vals), x):.2f}" for x in (0.5, 0.9, 0.99)), f"{max(vals, default=0):.2f}",
                      f"{q(sorted(v - b for v, b in zip(vals, before, strict=True)), 0.5):.2f}")
        before = vals
    return table
