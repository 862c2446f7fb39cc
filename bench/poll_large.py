"""Benchmark (issue #31): a long-lived poller's ``root_causes`` poll after each live round, on a large store.

A poller (``bench/live.py``'s, a dashboard on ``tracedag serve``) that has run beside a collector for a while asks
after each round; the store it asks has grown (the 10M-span bench store of ``bench/queries.py``, 870k traces, stands
in for ~20 minutes at 10k spans/s). Each tree (``--trees``: checkouts, alternated run by run, each in a child process
importing its own code) gets a hard-linked copy of ``--data``, polls it as a process that has polled before does
(two polls, a round, two polls: the process's one-time reads are paid here, not timed), then ``--rounds`` times
ingests, builds and scores a round of ``--spans`` spans (the same spans for every tree; not stored, as the live
rounds leave them to the store's pass) and polls once: that poll's CPU (every DuckDB thread) and wall time are the
figures, medians over the rounds and runs, with the rows each poll returned (the trees must agree).

    python bench/poll_large.py --trees /tmp/base,/work/main --runs 2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/gen.py, bench/poll.py

from poll import _pythonpath

_CHILD = r'''
import json, resource, shutil, subprocess, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[4])
import gen
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.ingest.direct import ingest_requests
from tracedag.pipeline.score.runner import LiveRound, score_store
from tracedag.pipeline.store.gc import GcSettings
from tracedag.pipeline.store.querying import run_named
src, rounds, spans = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
def round_(seed):
    ingest_requests(data, gen.requests(spans, seed=seed), received_unix_nano=time.time_ns())
    built = build_store(data, idle_seconds=0, gc=GcSettings(enabled=False))
    score_store(data, live=LiveRound(built.build_id, None, materialize=False))
def poll():
    c, w = cpu(), time.perf_counter()
    n = run_named(data, "root_causes").num_rows
    return [cpu() - c, time.perf_counter() - w, n]
work = Path(tempfile.mkdtemp(prefix="bench-poll-large-"))
data = work / "store"
try:
    data.mkdir()
    subprocess.run(["cp", "-al", str(src / "tables"), str(data / "tables")], check=True)
    shutil.copytree(src / "state", data / "state")
    poll(); poll(); round_(1000); poll(); poll()
    out = []
    for i in range(rounds):
        round_(1001 + i)
        out.append(poll())
    import tracedag.pipeline
    print(json.dumps({"file": tracedag.pipeline.__file__, "polls": out}))
finally:
    shutil.rmtree(work, ignore_errors=True)
'''


def _child(tree: str, data: Path, rounds: int, spans: int) -> list[list[float]]:
    env = {**os.environ, "PYTHONPATH": _pythonpath(tree)}
    bench = str(Path(__file__).resolve().parent)
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(data), str(rounds), str(spans), bench], env=env,
                          capture_output=True, text=True, cwd=tempfile.gettempdir())
    if proc.returncode:
        raise SystemExit(f"{tree}: {proc.stderr[-3000:]}")
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    if not str(Path(answer["file"]).resolve()).startswith(str(Path(tree).resolve())):
        raise SystemExit(f"{tree}: the child imported {answer['file']}")
    polls: list[list[float]] = answer["polls"]
    return polls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/tmp/tracedag-bench-queries/spans-10000000"))
    ap.add_argument("--trees", required=True, help="comma-separated checkouts; the first is the baseline")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--spans", type=int, default=10_000)
    args = ap.parse_args(argv)
    trees = args.trees.split(",")
    got: dict[str, list[list[float]]] = {t: [] for t in trees}
    for run in range(args.runs):
        for tree in trees if run % 2 == 0 else trees[::-1]:
            got[tree] += _child(tree, args.data, args.rounds, args.spans)
    base = statistics.median(p[0] for p in got[trees[0]])
    print(f"{args.data}: a poll after each round of {args.spans} spans, {args.runs} runs x {args.rounds} rounds; "
          f"load average {os.getloadavg()[0]:.1f}")
    for tree in trees:
        cpu = statistics.median(p[0] for p in got[tree])
        wall = statistics.median(p[1] for p in got[tree])
        rows = [int(p[2]) for p in got[tree]]
        print(f"  {tree}: poll CPU median {cpu:.3f} s (x{cpu / base:.2f}), wall {wall:.3f} s, rows {rows}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
