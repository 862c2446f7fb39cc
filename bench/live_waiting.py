"""Benchmark: a live store pass's search for the traces waiting and their conversations, on a large store.

The store (``--data``: built, scored and stored, default the 10M-span bench store of ``bench/queries.py``) is
copied by hard links (its files never change), a first pass is made (``score.live_waiting.Waiting``, which asks
the whole store the first time), then a round of ``--spans`` new spans is ingested and built, as a live collector
does between two passes. On that state, in the same run: the whole-store SQL a pass ran before
(``materialize._PENDING_SQL`` and ``_TRACES_SQL``; the baseline) and ``Waiting``'s answers from the files new since
the first pass, each the median of ``--runs`` (``Waiting`` made again from the first pass's state each run, its
kept file ids warmed first: a collector keeps them from pass to pass). The answers are checked equal.

    python bench/live_waiting.py --data /tmp/tracedag-bench-queries/spans-10000000 --spans 10000 --runs 3
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from pathlib import Path

import gen
from narrowed import ratio_table, timed
from rich.console import Console

from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.ingest.direct import ingest_requests
from tracedag.pipeline.score import materialize as m
from tracedag.pipeline.score.live_waiting import Waiting
from tracedag.pipeline.store.fetch import arrow
from tracedag.pipeline.store.gc import GcSettings
from tracedag.pipeline.store.materialized import signature
from tracedag.pipeline.store.views import connect


def _pass_sql(data: Path, sig: str) -> tuple[int, int]:
    con = connect(data)
    try:
        scope = arrow(con, m._PENDING_SQL)
        con.register(m.SCOPE, scope)
        return scope.num_rows, arrow(con, m._TRACES_SQL, [0, sig]).num_rows
    finally:
        con.close()


def _pass_waiting(data: Path, sig: str, waiting: Waiting) -> tuple[int, int]:
    con = connect(data)
    try:
        scope = waiting.traces(con)
        con.register(m.SCOPE, scope)
        return scope.num_rows, waiting.state(con, sig).num_rows
    finally:
        con.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/tmp/tracedag-bench-queries/spans-10000000"))
    ap.add_argument("--spans", type=int, default=10_000, help="spans of the round between the two passes")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    with gen.linked_copy(args.data, "bench-live-waiting-") as data:
        sig = signature(data)
        first = Waiting(data)
        _pass_waiting(data, sig, first)  # the first pass: the whole store
        ingest_requests(data, gen.requests(args.spans, seed=int(time.time())), received_unix_nano=time.time_ns())
        build_store(data, idle_seconds=0, gc=GcSettings(enabled=False))
        _pass_waiting(data, sig, copy.deepcopy(first))  # warms the kept file ids (a collector keeps them)
        _pass_waiting(data, sig, copy.deepcopy(first))
        sql = [timed(lambda: _pass_sql(data, sig)) for _ in range(args.runs)]
        new = [timed(lambda: _pass_waiting(data, sig, copy.deepcopy(first))) for _ in range(args.runs)]
    if sql[-1][2] != new[-1][2]:
        raise SystemExit(f"answers differ: {sql[-1][2]} against {new[-1][2]}")
    waiting, rows = sql[-1][2]  # type: ignore[misc]
    title = (f"{args.data}: a pass after a round of {args.spans} spans ({waiting} traces waiting, {rows} with their "
             f"conversations); median of {args.runs}; load average {os.getloadavg()[0]:.1f}")
    table = ratio_table(title, [("whole-store SQL (baseline)", sql), ("what changed since the last pass", new)])
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
