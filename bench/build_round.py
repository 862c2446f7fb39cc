"""CPU of a live round's build per span, this tree against baseline trees, in the same run.

A store of ``--size`` generated spans (``--batch`` spans a file) is made, built and scored once, then copied
for each tree. One long-lived child process per tree (its ``tracedag`` first on ``PYTHONPATH``, as
``bench/live.py --baseline-tree`` does) runs the rounds on its own copy: per round it ingests the same
``--batch`` new spans (same seed in every tree), runs ``build_store(data, idle_seconds=0, grace_seconds=0)``
as ``tracedag collect --build`` does (incremental plan), timed in process CPU (all threads), then scores as a
live round does (``score_store`` with its ``LiveRound``, the named queries' results left to the store's thread),
timed the same way. The trees take turns round by round (which goes first alternates). A first round
per tree warms the imports and is not counted. Printed: per tree the median build CPU per span (us), the
median CPU by build stage (``dag.timing`` stages; ``collect`` is the collection after the build), and the
ratio against the first tree; then the score's and the whole round's (build + score) CPU, per round and per
span, with their ratios.

    python bench/build_round.py --size 200000 --batch 20000 --rounds 5 --baseline-tree base=/tmp/base
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_CHILD = r"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from bench.gen import requests
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.dag import timing
from tracedag.pipeline.ingest.direct import ingest_requests
from tracedag.pipeline.score import score_store
from tracedag.pipeline.score.runner import LiveRound
import tracedag.pipeline.dag.reconstruct  # noqa: the live collector has it imported after its first round
data = Path(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    seed, batch = map(int, line.split())
    ingest_requests(data, requests(batch, seed), received_unix_nano=time.time_ns())
    timing.TOTALS.clear()
    c, t = time.process_time(), time.perf_counter()
    built = build_store(data, idle_seconds=0, grace_seconds=0)
    cpu, wall = time.process_time() - c, time.perf_counter() - t
    stages = {k: v[1] for k, v in timing.TOTALS.items()}
    live = LiveRound(built.build_id if built.traces_built else None, built.received_from, materialize=False)
    c = time.process_time()
    score_store(data, live=live)
    score = time.process_time() - c
    print(json.dumps({"cpu": cpu, "wall": wall, "score": score, "spans": built.spans, "traces": built.traces_built,
                      "plan": built.plan, "stages": stages,
                      "gc": built.gc.seconds if built.gc is not None else 0.0}), flush=True)
"""


def _tree(spec: str) -> tuple[str, str]:
    """(label, PYTHONPATH entry): ``bench/live.py``'s shims for a checkout."""
    from bench.live import _tree as live_tree

    return live_tree(spec)


class Child:
    """One tree's rounds process."""

    def __init__(self, data: Path, pythonpath: str) -> None:
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        repo = str(Path(__file__).resolve().parents[1])
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(data), repo], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        assert self._line() == "ready"

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"a rounds child died (exit {self.proc.wait()})")
        return line.strip()

    def round(self, seed: int, batch: int) -> dict[str, object]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{seed} {batch}\n")
        self.proc.stdin.flush()
        out: dict[str, object] = json.loads(self._line())
        return out

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def make_store(data: Path, size: int, batch: int) -> int:
    """Ingest ``size`` spans in files of ``batch``, build and score; return the next seed."""
    from bench.gen import requests
    from tracedag.pipeline.dag import build_store
    from tracedag.pipeline.ingest.direct import ingest_requests
    from tracedag.pipeline.score import score_store

    seed = 1
    while seed * batch <= size:
        ingest_requests(data, requests(batch, seed), received_unix_nano=time.time_ns())
        seed += 1
    build_store(data, idle_seconds=0, grace_seconds=0)
    score_store(data)
    return seed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--size", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=20_000)
    ap.add_argument("--round-batch", type=int, nargs="+", default=None,
                    help="spans per round (cycled); default --batch")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline-tree", action="append", default=[], metavar="[LABEL=]DIR")
    ap.add_argument("--store", type=Path, default=None, help="reuse (copy) this store instead of making one")
    ap.add_argument("--no-this-tree", action="store_true", help="run the baseline trees only")
    args = ap.parse_args(argv)
    trees = [_tree(t) for t in args.baseline_tree] + ([] if args.no_this_tree else [("this tree", "")])
    root = Path(tempfile.mkdtemp(prefix="tracedag-build-round-"))
    try:
        base = args.store or root / "base"
        seed = 1000 if args.store else make_store(base, args.size, args.batch)
        children = []
        for i, (_, path) in enumerate(trees):
            shutil.copytree(base, root / f"t{i}", symlinks=True)
            children.append(Child(root / f"t{i}", path))
        batches = args.round_batch or [args.batch]
        results: list[list[dict[str, object]]] = [[] for _ in trees]
        for r in range(args.rounds + 1):
            order = list(range(len(trees)))
            if r % 2:
                order.reverse()
            for i in order:
                out = children[i].round(seed + r, batches[r % len(batches)])
                if r:
                    results[i].append(out)
            print(f"round {r}: " + ", ".join(f"{trees[i][0]} {results[i][-1]['cpu']:.2f}s" if r else "warm-up"
                                             for i in range(len(trees))), flush=True)
        for c in children:
            c.close()
        report(trees, results)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def report(trees: list[tuple[str, str]], results: list[list[dict[str, object]]]) -> None:
    first = None
    for (label, _), res in zip(trees, results, strict=True):
        per_span = statistics.median(float(x["cpu"]) / max(int(x["spans"]), 1) * 1e6 for x in res)  # type: ignore[arg-type]
        cpu = statistics.median(float(x["cpu"]) for x in res)  # type: ignore[arg-type]
        first = first or per_span
        stages: dict[str, float] = {}
        for name in sorted({k for x in res for k in x["stages"]}):  # type: ignore[attr-defined]
            stages[name] = statistics.median(float(x["stages"].get(name, 0.0)) for x in res)  # type: ignore[attr-defined]
        spans = [x["spans"] for x in res]
        print(f"{label}: build CPU median {cpu:.3f} s, {per_span:.1f} us/span (x{per_span / first:.2f}); "
              f"spans {spans}; plans {[x['plan'] for x in res]}")
        print("   stages (median CPU s): " + ", ".join(f"{k} {v:.3f}" for k, v in stages.items()))
        print("   all CPU s: " + ", ".join(f"{float(x['cpu']):.2f}" for x in res))  # type: ignore[arg-type]
    rounds(trees, results)


def rounds(trees: list[tuple[str, str]], results: list[list[dict[str, Any]]]) -> None:
    """The score's and the whole round's CPU (medians) per tree, against the first tree."""
    first: dict[str, float] = {}
    for (label, _), res in zip(trees, results, strict=True):
        cells = []
        for part, of in (("score", lambda x: x["score"]), ("round", lambda x: x["cpu"] + x["score"])):
            cpu = statistics.median(float(of(x)) for x in res)
            per_span = statistics.median(float(of(x)) / max(int(x["spans"]), 1) * 1e6 for x in res)
            first.setdefault(part, cpu)
            cells.append(f"{part} CPU median {cpu:.3f} s (x{cpu / first[part]:.2f}), {per_span:.1f} us/span")
        print(f"{label}: " + "; ".join(cells))
        print("   score CPU s: " + ", ".join(f"{float(x['score']):.2f}" for x in res))


if __name__ == "__main__":
    raise SystemExit(main())
