"""Root-cause accuracy on conversations traced by real instrumentation (issue #18 classes 2 and 5).

Captures the conversations of ``tests/rca_agents.py`` once (the official ``openai`` client with
``opentelemetry-instrumentation-openai-v2`` or ``openinference-instrumentation-openai`` against a
scripted local server; a remote tool in a second process with a skewed clock behind
``opentelemetry-instrumentation-httpx`` / ``-wsgi``), then runs ingest -> build -> score ->
``root_causes`` on each in a fresh store, once per code version given with ``--variant
NAME=PYTHONPATH`` (a directory holding a ``tracedag`` package, e.g. an export of git HEAD; the
empty path is the installed code). Prints per class and variant: conversations whose greedy root
cause is the true one, the LLM step flagged ``invalid_tool_arguments`` where the model made the
arguments up, and remote calls whose server span starts inside its client span.

    python bench/rca_accuracy.py --variant before=/tmp/headpkg --variant after=
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import json, pickle, sys, tempfile
from pathlib import Path
from tests.rca_agents import analyse, llm_flagged
cases = pickle.loads(Path(sys.argv[1]).read_bytes())
out = []
for c in cases:
    with tempfile.TemporaryDirectory() as d:
        o = analyse(c, Path(d) / "data")
        flagged = llm_flagged(Path(d) / "data", c)
    out.append({"name": c.name, "dialect": c.dialect, "right": o.root_span_id == c.root_span_id,
                "order_right": o.order_right, "calls": o.calls, "flagged": flagged})
print(json.dumps(out))
"""


def capture(path: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Capture every case into ``path`` (pickled); return the number per class, and of those whose
    root cause is a model step that made arguments up."""
    sys.path.insert(0, str(ROOT))
    from tests.rca_agents import paramgen_cases, skew_cases

    cases = {"2 arguments the model made up": paramgen_cases(), "5 clock skew between services": skew_cases()}
    path.write_bytes(pickle.dumps(cases))
    return {k: len(v) for k, v in cases.items()}, {k: sum(c.made_up for c in v) for k, v in cases.items()}


def run_variant(cases_file: Path, pythonpath: str) -> dict[str, list[dict[str, object]]]:
    """Analyse every case with the code on ``pythonpath``; results per class."""
    cases = pickle.loads(cases_file.read_bytes())
    out: dict[str, list[dict[str, object]]] = {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, str(ROOT)) if p)}
    for klass, items in cases.items():
        with tempfile.NamedTemporaryFile(suffix=".pkl") as f:
            f.write(pickle.dumps(items))
            f.flush()
            proc = subprocess.run([sys.executable, "-c", _CHILD, f.name], capture_output=True, text=True,
                                  env=env, cwd=ROOT, check=False)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        out[klass] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", action="append", default=[], help="NAME=PYTHONPATH ('' = installed code)")
    ap.add_argument("--json", type=Path, help="also write the per-case results here")
    args = ap.parse_args()
    variants = [v.split("=", 1) for v in args.variant] or [["after", ""]]
    with tempfile.TemporaryDirectory() as tmp:
        cases_file = Path(tmp) / "cases.pkl"
        sizes, sizes_made_up = capture(cases_file)
        results = {name: run_variant(cases_file, path) for name, path in variants}
    print(f"{'class':32} {'variant':10} {'right root cause':>18} {'LLM flagged':>12} {'server in client':>17}")
    for klass, n in sizes.items():
        for name, _ in variants:
            rows = results[name][klass]
            right = sum(bool(r["right"]) for r in rows)
            flagged = sum(bool(r["flagged"]) for r in rows)
            made_up = sizes_made_up[klass]
            calls = sum(int(r["calls"]) for r in rows)  # type: ignore[call-overload]
            order = sum(int(r["order_right"]) for r in rows)  # type: ignore[call-overload]
            order_text = f"{order}/{calls}" if calls else "-"
            print(f"{klass:32} {name:10} {right:>12}/{n:<5} {f'{flagged}/{made_up}':>12} {order_text:>17}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
