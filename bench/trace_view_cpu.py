"""Benchmark (#31, #33): CPU of serve's first view of a trace (``Store.trace``), this checkout against another.

Two stores of ``--spans`` generated spans (``bench/gen.py``, seed 11), built in chunk files of 40 spans as
tests/store/test_serve_during_gc.py builds them: *unscored* (built only: every view runs ``trace_summary``,
``propagation`` and ``root_causes`` from their SQL, narrowed to the trace) and *scored* (a copy, scored: their
materialized rows answer). One long-lived child process per checkout (its ``tracedag`` first on
``PYTHONPATH``) keeps one ``Store`` per store (its id set read once) and times ``Store.trace`` of a trace it has
not viewed yet in process CPU seconds (every DuckDB thread); the children are asked in alternating order,
``--runs`` traces each. Prints medians and the ratio this / before.

    python bench/trace_view_cpu.py --before /tmp/base --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(paths: list[str]) -> int:
    """Answer ``STORE_INDEX TRACE_ID`` lines with the CPU and wall seconds of ``Store.trace``."""
    from tracedag.pipeline.serve.data import Store

    stores = [Store(Path(p)) for p in paths]
    for s in stores:
        s.trace_ids()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        index, tid = line.split()
        store = stores[int(index)]
        t0, c0 = time.perf_counter(), time.process_time()
        doc = store.trace(tid)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(json.dumps({"cpu": cpu, "wall": wall, "nodes": len(doc["nodes"]),
                          "root": (doc["root_cause"] or {}).get("root_span_id")}), flush=True)
    return 0


def _stores(where: Path, spans: int) -> list[Path]:
    from bench.gen import make_store
    from tracedag.pipeline.dag.build import build_store
    from tracedag.pipeline.score import score_store
    from tracedag.pipeline.store.gc import GcSettings

    unscored, scored = where / "unscored", where / "scored"
    if not unscored.exists():
        make_store(unscored, spans, seed=11)
        build_store(unscored, idle_seconds=0.0, chunk_spans=40, gc=GcSettings(enabled=False))
    if not scored.exists():
        shutil.copytree(unscored, scored)
        score_store(scored)
    return [unscored, scored]


class _Child:
    def __init__(self, checkout: Path | None, stores: list[Path], shims: Path) -> None:
        sys.path.insert(0, str(ROOT))
        from bench.trace_by_id import _shim, child_answer

        self._answer = child_answer
        env = dict(os.environ)
        if checkout is not None:
            env["PYTHONPATH"] = str(_shim(checkout, shims))
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", *map(str, stores)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
        self._line()

    def _line(self) -> dict[str, float]:
        return self._answer(self.proc)

    def view(self, index: int, tid: str) -> dict[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{index} {tid}\n")
        self.proc.stdin.flush()
        return self._line()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--before", type=Path, required=True, help="a checkout of the code to compare with")
    p.add_argument("--spans", type=int, default=1500)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--where", type=Path, default=Path(tempfile.gettempdir()) / "tracedag-trace-view-cpu")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    stores = _stores(args.where / f"spans-{args.spans}", args.spans)
    import duckdb

    with duckdb.connect() as con:
        ids = sorted(r[0] for r in con.sql(
            f"select distinct trace_id from read_parquet('{stores[0]}/tables/traces/**/*.parquet')").fetchall())
    picked = random.Random(7).sample(ids, min(len(ids), 2 * args.runs))
    children = {"before": _Child(args.before, stores, args.where / "shim-before"), "after": _Child(None, stores, args.where)}
    cpu: dict[tuple[str, int], list[float]] = {}
    try:
        for i in range(args.runs):
            order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
            for index in range(len(stores)):
                tid = picked[2 * i + index]
                answers = {label: children[label].view(index, tid) for label in order}
                if answers["before"]["nodes"] != answers["after"]["nodes"] or \
                        answers["before"]["root"] != answers["after"]["root"]:
                    raise SystemExit(f"different documents for {tid}: {answers}")
                for label, a in answers.items():
                    cpu.setdefault((label, index), []).append(a["cpu"])
    finally:
        for c in children.values():
            c.close()
    for index, store in enumerate(stores):
        before = statistics.median(cpu["before", index])
        after = statistics.median(cpu["after", index])
        print(f"{store.name:9s} trace view CPU s, median of {args.runs}: before {before:.3f}  this {after:.3f}  "
              f"x{after / before:.2f}   (before {[round(v, 3) for v in cpu['before', index]]}, "
              f"this {[round(v, 3) for v in cpu['after', index]]})")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        raise SystemExit(child(sys.argv[2:]))
    raise SystemExit(main())
