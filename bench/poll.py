"""Benchmark (issue #31): a ``root_causes`` poll while traces wait to be stored, and one live store pass.

A live collector's poll (``bench/live.py``'s ``poll_child``: ``run_named(data, "root_causes")``) computes from the
SQL every trace whose latest build has no stored rows yet (``store.mixed``). ``--make`` writes stores shaped like
that: a base of ``--base`` generated spans (``bench/gen.py``) built, scored and stored, then, per size N of
``--unstored``, a hard-linked copy of it (``n<N>``) with one more round of about N traces built and scored but not
stored (``LiveRound(materialize=False)``, as the live rounds leave them to the store thread), and, with
``--unscored K``, a round of about K traces built and not scored yet (a round between its build and its score).

    python bench/poll.py --make /tmp/poll --base 100000 --unstored 500,2000,5000 --unscored 1000
    python bench/poll.py --data /tmp/poll --trees /tmp/base,/work/main --runs 5 --polls 4
    python bench/poll.py --data /tmp/poll --trees /tmp/base,/work/main --runs 5 --store-pass

Each tree runs in child processes of its own (``PYTHONPATH``: the tree whose tracedag is imported; the trees
alternate run by run). A poll's figure is its CPU (``getrusage``, every DuckDB thread), the median over the polls
after each process's first (that one pays the imports and the process's first connection), with the hash of its
rows: the trees must give the same answer. A process's later polls of the same files read the rows its first
computed (``store.mixedkept``: polls between two live rounds); ``--unkept answers`` forgets the answers before each
poll (a round that changed no waiting conversation: each conversation's rows are kept), ``--unkept conversations``
every conversation's rows too (they are all computed again; which traces each file holds stays known). ``--store-pass`` times ``LiveStore``'s steps (copy, copy_spans,
compute, write: the CPU of each) over a fresh hard-linked copy of each store, one pass each.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/gen.py, bench/trace_by_id.py

SPANS_PER_TRACE = 11  # bench/gen.py's traces: ~11 spans each

_POLL_CHILD = r'''
import hashlib, json, resource, sys, time
from pathlib import Path
from tracedag.pipeline.store.querying import run_named
data, n, unkept = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
try:
    from tracedag.pipeline.store import mixedkept
except ImportError:  # a tree from before it
    mixedkept = None
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
out = []
for _ in range(n):
    if unkept != "none" and mixedkept is not None:  # a poll after a new round (the files' trace ids known)
        mixedkept.forget(files=False, conversations=unkept == "conversations")
    c, w = cpu(), time.perf_counter()
    t = run_named(data, "root_causes")
    c, w = cpu() - c, time.perf_counter() - w
    out.append((c, w, t.num_rows, hashlib.sha256(repr(t.to_pylist()).encode()).hexdigest()[:12]))
import tracedag.pipeline.store.mixed as m
print(json.dumps({"file": m.__file__, "polls": out}))
'''

_PASS_CHILD = r'''
import json, resource, sys
from pathlib import Path
from tracedag.pipeline.score.live_store import LiveStore
data = Path(sys.argv[1])
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
times, store = {}, LiveStore(data, 20_000)
c = cpu(); copied = store.copy(); times["copy"] = cpu() - c
c = cpu(); store.copy_spans(copied); times["copy_spans"] = cpu() - c
c = cpu(); results = store.compute(copied); times["compute"] = cpu() - c
c = cpu(); store.write(copied, results); times["write"] = cpu() - c
times["traces"] = copied.traces
store.close()
import tracedag.pipeline.score.live_store as ls
times["file"] = ls.__file__
print(json.dumps(times))
'''


def make(out: Path, base: int, unstored: list[int], unscored: int) -> None:
    """The base store, then a copy of it per size with a round not stored (and one not scored) added."""
    from gen import requests

    from tracedag.pipeline.dag import build_store
    from tracedag.pipeline.ingest.direct import ingest_requests
    from tracedag.pipeline.score import score_store
    from tracedag.pipeline.score.runner import LiveRound

    root = out / "base"
    seed, batch = 1, 20_000
    while (seed - 1) * batch < base:
        ingest_requests(root, requests(min(batch, base - (seed - 1) * batch), seed), received_unix_nano=time.time_ns())
        seed += 1
    print("base built", build_store(root, idle_seconds=0, grace_seconds=0).traces_built, flush=True)
    score_store(root)  # the store's first round: every trace stored
    for n in unstored:
        data = out / f"n{n}"
        shutil.rmtree(data, ignore_errors=True)
        subprocess.run(["cp", "-al", str(root), str(data)], check=True)
        ingest_requests(data, requests(n * SPANS_PER_TRACE, 1000 + n), received_unix_nano=time.time_ns())
        built = build_store(data, idle_seconds=0, grace_seconds=0)
        score_store(data, live=LiveRound(built.build_id, built.received_from, materialize=False))
        if unscored:
            ingest_requests(data, requests(unscored * SPANS_PER_TRACE, 5000 + n), received_unix_nano=time.time_ns())
            build_store(data, idle_seconds=0, grace_seconds=0)
        print(f"n{n}: built {built.traces_built} (+{unscored} unscored)", flush=True)


def _pythonpath(tree: str) -> str:
    """A directory whose ``tracedag`` is ``tree``'s code (a shim of symlinks, ``bench/trace_by_id._shim``): with the
    checkout alone on ``PYTHONPATH``, ``import tracedag`` finds the editable install, whatever tree was asked."""
    from trace_by_id import _shim

    root = Path(tree).resolve()
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    return str(_shim(root, Path(tempfile.gettempdir()) / f"tracedag-poll-shim-{digest}"))


def _child(tree: str, code: str, *args: str) -> object:
    env = {**os.environ, "PYTHONPATH": _pythonpath(tree)}
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{tree}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def polls(stores: list[Path], trees: list[str], runs: int, n: int, unkept: str = "none") -> None:
    for data in stores:
        got: dict[str, list[list[object]]] = {t: [] for t in trees}
        for run in range(runs):
            for tree in trees if run % 2 == 0 else trees[::-1]:
                answer = _child(tree, _POLL_CHILD, str(data), str(n), unkept)
                assert isinstance(answer, dict) and str(Path(str(answer["file"])).resolve()).startswith(str(Path(tree).resolve())), answer
                got[tree].append(answer["polls"])
        first = None
        for tree in trees:
            later = [p for proc in got[tree] for p in proc[1:]]  # type: ignore[index]
            cpu = statistics.median(p[0] for p in later)
            wall = statistics.median(p[1] for p in later)
            hashes = sorted({p[3] for proc in got[tree] for p in proc})  # type: ignore[index]
            rows = sorted({p[2] for proc in got[tree] for p in proc})  # type: ignore[index]
            first = cpu if first is None else first
            print(f"{data.name} {tree}: poll CPU median {cpu:.3f} s (x{cpu / first:.2f}), wall {wall:.3f} s, "
                  f"n={len(later)}, rows {rows}, hash {hashes}", flush=True)
        print(f"  load {os.getloadavg()[0]:.1f}", flush=True)


def store_passes(stores: list[Path], trees: list[str], runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="poll-pass-") as scratch:
        for data in stores:
            got: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
            for run in range(runs):
                for tree in trees if run % 2 == 0 else trees[::-1]:
                    copy = Path(scratch) / "store"
                    shutil.rmtree(copy, ignore_errors=True)
                    subprocess.run(["cp", "-al", str(data), str(copy)], check=True)
                    answer = _child(tree, _PASS_CHILD, str(copy))
                    assert isinstance(answer, dict) and str(Path(str(answer.pop("file"))).resolve()).startswith(str(Path(tree).resolve()))
                    got[tree].append(answer)
            for tree in trees:
                steps = {k: statistics.median(r[k] for r in got[tree]) for k in got[tree][0]}
                total = sum(v for k, v in steps.items() if k != "traces")
                print(f"{data.name} {tree}: pass CPU {total:.2f} s: " + ", ".join(
                    f"{k} {v:.2f}" if k != "traces" else f"traces {int(v)}" for k, v in steps.items()), flush=True)
            print(f"  load {os.getloadavg()[0]:.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--make", type=Path, help="write the stores under this directory")
    ap.add_argument("--base", type=int, default=100_000, help="spans built, scored and stored in every store")
    ap.add_argument("--unstored", default="500,2000,5000", help="traces built and scored, not stored (one store each)")
    ap.add_argument("--unscored", type=int, default=0, help="traces built, not scored yet, in every store")
    ap.add_argument("--data", type=Path, help="the directory --make wrote")
    ap.add_argument("--trees", default=str(Path(__file__).resolve().parents[1]), help="source trees, comma-separated")
    ap.add_argument("--runs", type=int, default=5, help="child processes per tree and store")
    ap.add_argument("--polls", type=int, default=4, help="polls per child process (the first is not counted)")
    ap.add_argument("--store-pass", action="store_true", help="time one LiveStore pass instead of polls")
    ap.add_argument("--unkept", choices=("none", "answers", "conversations"), default="none",
                    help="forget before each poll the answers kept (store.mixedkept), or these and each conversation's "
                         "rows: a poll after a round that changed no waiting conversation, or every one")
    args = ap.parse_args()
    if args.make:
        make(args.make, args.base, [int(n) for n in args.unstored.split(",")], args.unscored)
        return
    stores = sorted((p for p in args.data.glob("n*") if p.is_dir()), key=lambda p: int(p.name[1:]))
    trees = args.trees.split(",")
    if args.store_pass:
        store_passes(stores, trees, args.runs)
    else:
        polls(stores, trees, args.runs, args.polls, args.unkept)


if __name__ == "__main__":
    main()
