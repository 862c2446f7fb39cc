"""The fixed CPU of a score round on a small store: this tree beside baseline trees, in the same run.

A test suite calls ``score_store`` and ``materialize`` hundreds of times on stores of a few hundred spans, and a
live collector scores a round a second: what such a call costs whatever its size (a connection, its macros, DuckDB
planning the stored queries) is most of its CPU there (issues #31, #33). Two stores of ``--spans`` generated spans
are made once: ``a`` built and not scored, ``b`` scored and stored, then a second batch of as many spans ingested
and built. One child process per tree (its ``tracedag`` first on ``PYTHONPATH``, as ``bench/build_round.py
--baseline-tree`` does) times in process CPU (every thread's), on a fresh copy each time:

- ``first``: ``score_store`` of ``a`` (rules, then every trace's results stored: a test's first score);
- ``round``: ``score_store`` of ``b`` (the new build scored, its conversations' results stored: ``tracedag score``);
- ``live``: ``score_store`` of ``b`` as a live round (its ``LiveRound``, results left for later);
- ``store``: then ``materialize_later`` of what that live round left (what the live store's pass or a later
  ``tracedag score`` stores).

Each child first runs every kind once (imports, caches: not counted); then the trees take turns, ``--runs`` times
(which goes first alternates), each turn ``--reps`` calls of each kind. Printed: per kind and tree the median CPU
of its calls, and the ratio against the first tree.

    python bench/round_fixed.py --spans 200 --runs 5 --baseline-tree base=/tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KINDS = ("first", "round", "live", "store")

_CHILD = r"""
import json, shutil, sys, time
from pathlib import Path
from tracedag.pipeline.score import score_store
from tracedag.pipeline.score.runner import LiveRound, materialize_later
stores, work = Path(sys.argv[1]), Path(sys.argv[2])
build_id, received = (stores / "live.txt").read_text().split()
n = 0
def copy(name):
    global n
    n += 1
    d = work / f"{name}{n}"
    shutil.copytree(stores / name, d)
    return d
def one(kind):
    d = copy("a" if kind == "first" else "b")
    c = time.process_time()
    if kind in ("first", "round"):
        score_store(d)
    else:
        stats = score_store(d, live=LiveRound(build_id, int(received), materialize=False))
        if kind == "store":
            c = time.process_time()
            materialize_later(d, stats.files)
    cpu = time.process_time() - c
    shutil.rmtree(d)
    return cpu
for kind in ("first", "round", "live", "store"):
    one(kind)
print("ready", flush=True)
for line in sys.stdin:
    reps = int(line)
    print(json.dumps({k: [one(k) for _ in range(reps)] for k in ("first", "round", "live", "store")}), flush=True)
"""


def make_stores(root: Path, spans: int) -> None:
    """``root/a`` (built, not scored) and ``root/b`` (scored and stored, then a batch more built) of ``spans`` spans
    each batch; ``root/live.txt``: the second build's id and earliest arrival."""
    from bench.gen import requests
    from tracedag.pipeline.dag import build_store
    from tracedag.pipeline.ingest.direct import ingest_requests
    from tracedag.pipeline.score import score_store

    ingest_requests(root / "a", requests(spans, 1), received_unix_nano=time.time_ns())
    build_store(root / "a", idle_seconds=0, grace_seconds=0)
    shutil.copytree(root / "a", root / "b")
    score_store(root / "b")
    ingest_requests(root / "b", requests(spans, 2), received_unix_nano=time.time_ns())
    built = build_store(root / "b", idle_seconds=0, grace_seconds=0)
    (root / "live.txt").write_text(f"{built.build_id} {built.received_from}")


class _Child:
    """One tree's process: ``ask(reps)`` returns its CPU seconds per kind."""

    def __init__(self, stores: Path, work: Path, shim: Path | None) -> None:
        env = dict(os.environ)
        if shim is not None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), env.get("PYTHONPATH", "")) if p)
        work.mkdir(parents=True)
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(stores), str(work)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("a child process failed to start (see its error above)")

    def ask(self, reps: int) -> dict[str, list[float]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{reps}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("a child process ended (see its error above)")
        answer: dict[str, list[float]] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--spans", type=int, default=200, help="spans of each of the two batches")
    ap.add_argument("--runs", type=int, default=5, help="turns of each tree (alternated)")
    ap.add_argument("--reps", type=int, default=3, help="calls of each kind a turn")
    ap.add_argument("--baseline-tree", action="append", default=[], metavar="LABEL=PATH",
                    help="another checkout to time beside this tree (repeatable)")
    ap.add_argument("--no-this-tree", action="store_true", help="time only the baseline trees")
    args = ap.parse_args(argv)
    from bench.trace_by_id import _shim

    trees: dict[str, Path | None] = {} if args.no_this_tree else {"this": None}
    for given in args.baseline_tree:
        label, _, path = given.partition("=")
        trees[label] = Path(path)
    with tempfile.TemporaryDirectory(prefix="tracedag-round-fixed-") as tmp:
        root = Path(tmp)
        make_stores(root / "stores", args.spans)
        children = {label: _Child(root / "stores", root / f"work-{label}",
                                  None if path is None else _shim(path, root / f"shim-{label}"))
                    for label, path in trees.items()}
        times: dict[str, dict[str, list[float]]] = {label: {k: [] for k in KINDS} for label in children}
        try:
            for run in range(args.runs):
                order = list(children) if run % 2 == 0 else list(reversed(children))
                for label in order:
                    for kind, cpu in children[label].ask(args.reps).items():
                        times[label][kind].extend(cpu)
        finally:
            for c in children.values():
                c.close()
    first = next(iter(times))
    print(f"score rounds on a store of {args.spans} + {args.spans} spans: median CPU s of {args.runs} x {args.reps} "
          f"calls per tree, load average {os.getloadavg()[0]:.1f}")
    print(f"{'kind':<8}" + "".join(f"{label:>12}{'ratio':>8}" for label in times))
    for kind in KINDS:
        base = statistics.median(times[first][kind])
        cells = [f"{statistics.median(times[label][kind]):>12.3f}"
                 f"{statistics.median(times[label][kind]) / base:>8.2f}" for label in times]
        print(f"{kind:<8}" + "".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
