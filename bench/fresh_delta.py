"""Benchmark: a reader's freshness after a live round, on a large store: the whole-store SQL against what changed.

Every poll of a named query that follows a round (a poller, ``tracedag serve`` on a live store) asks which traces the
stored rows do not answer (``store.freshness``). The store (``--data``: built, scored and stored, default the
10M-span bench store of ``bench/queries.py``) is copied by hard links (its files never change); the reader asks
once (the SQL, as a process's first ask does), then a round of ``--spans`` new spans is ingested and built, as a
live collector does between two polls. On that state, in the same run: ``freshness._freshness_now`` with the SQL
over every trace (the baseline: ``freshdelta.step`` answering nothing) and from what changed since the first ask
(``freshdelta``, its kept file ids warmed first: a reader keeps them from poll to poll), each the median of
``--runs``. The answers are checked equal.

    python bench/fresh_delta.py --data /tmp/tracedag-bench-queries/spans-10000000 --spans 10000 --runs 3
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import time
from pathlib import Path

import gen
from narrowed import ratio_table, timed
from rich.console import Console

from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.ingest.direct import ingest_requests
from tracedag.pipeline.store import fileids, freshdelta, freshness
from tracedag.pipeline.store.gc import GcSettings
from tracedag.pipeline.store.views import connect


def _ask(data: Path, base: freshdelta._Base | None) -> freshness.Freshness:
    """The freshness of ``data`` from ``base`` (a copy, so that each run starts from the first ask), or from the SQL."""
    freshdelta._BASES.clear()
    if base is not None:
        freshdelta._BASES[str(data.resolve())] = copy.deepcopy(base)
    con = connect(data, shared_macros=False)
    try:
        return freshness._freshness_now(con, data, freshness._listed(data))[0]
    finally:
        con.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/tmp/tracedag-bench-queries/spans-10000000"))
    ap.add_argument("--spans", type=int, default=10_000, help="spans of the round between the two asks")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    with gen.linked_copy(args.data, "bench-fresh-delta-") as data:
        _ask(data, None)  # the first ask: the SQL, kept as the base
        base = freshdelta._BASES[str(data.resolve())]
        fileids.forget()
        first = timed(lambda: freshdelta.all_ids(base.traces))  # what a reader computes once, at its first delta
        base = dataclasses.replace(base, ids=first[2])
        ingest_requests(data, gen.requests(args.spans, seed=int(time.time())), received_unix_nano=time.time_ns())
        build_store(data, idle_seconds=0, gc=GcSettings(enabled=False))
        _ask(data, base)  # warms the kept file ids and conversation keys (a reader keeps them from poll to poll)
        new = [timed(lambda: _ask(data, base)) for _ in range(args.runs)]
        sql = [timed(lambda: _ask(data, None)) for _ in range(args.runs)]
    if sql[-1][2] != new[-1][2]:
        raise SystemExit(f"answers differ: {sql[-1][2]} against {new[-1][2]}")
    answer = sql[-1][2]
    assert isinstance(answer, freshness.Freshness)
    title = (f"{args.data}: freshness after a round of {args.spans} spans ({answer.traces} traces, "
             f"{len(answer.stale)} not stored); median of {args.runs}; load average {os.getloadavg()[0]:.1f}")
    table = ratio_table(title, [("whole-store SQL (baseline)", sql), ("what changed since the last ask", new)])
    Console().print(table)
    print(f"once per process (its first delta): every file's trace ids read and their union, {first[0]:.3f} s CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
