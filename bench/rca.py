"""Root-cause accuracy on real-instrumentation conversations, before (git HEAD) and after (this checkout).

The conversations of ``tests/queries/rca_scenarios.py`` (the ``openai`` client traced by
``opentelemetry-instrumentation-openai-v2`` against a local scripted server, the agent and its tools
traced by ``tracedag.instrument``, faults injected where the truth is known) are captured once.
The same spans are then built, scored and queried twice:

- before: the tracedag of ``--before`` (default ``HEAD``, exported with ``git archive`` into a
  temporary directory and imported in a child process), ``root_causes per=trace``, the row of each
  conversation's latest failed turn (it had no per=conversation);
- after: this checkout, ``root_causes per=conversation``, every strategy.

Prints, per class, the conversations whose root cause is right, and each strategy's accuracy.

    python bench/rca.py [--before HEAD]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.queries.rca_measure import answers, build_and_score, tally  # noqa: E402
from tests.queries.rca_scenarios import SCENARIOS, capture  # noqa: E402

OLD = ["greedy", "full_path_min", "weighted"]
NEW = [*OLD, "agenteval"]
LINKS = {"collector": "collector", "pipeline": "pipeline", "instrument": "pipeline/instrument",
         "schemas": "schemas", "queries": "queries"}


def _export(rev: str, tmp: Path) -> Path:
    """``git archive`` the package folders of ``rev``; return a directory that imports as ``tracedag``."""
    src, site = tmp / "src", tmp / "site" / "tracedag"
    src.mkdir()
    site.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *sorted(set(LINKS.values()) - {"pipeline/instrument"})],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    (site / "__init__.py").write_text("")
    for name, folder in LINKS.items():
        (site / name).symlink_to(src / folder)
    return site.parent


def _before(rev: str, spans: Path, tmp: Path) -> dict[str, dict[str, list[object] | None]]:
    site = _export(rev, tmp)
    out = tmp / "before.json"
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    subprocess.run([sys.executable, "-m", "tests.queries.rca_measure", str(spans), str(tmp / "before-data"),
                    str(out), "trace", *OLD], check=True, env=env, cwd=ROOT)
    found: dict[str, dict[str, list[object] | None]] = json.loads(out.read_text())
    return found


def _count(t: dict[str, tuple[int, int]], klass: str) -> tuple[int, int]:
    """(right, conversations) of one class, or of every class for ``all``."""
    if klass == "all":
        return sum(v[0] for v in t.values()), sum(v[1] for v in t.values())
    return t[klass]


def _cell(t: dict[str, tuple[int, int]], klass: str) -> str:
    right, n = _count(t, klass)
    return f"{right}/{n}"


def _pct(t: dict[str, tuple[int, int]]) -> str:
    right, n = _count(t, "all")
    return f"{right}/{n} = {right / n:.0%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="HEAD", help="git revision measured as 'before'")
    args = ap.parse_args()
    console = Console()
    truth = {s.conversation_id: (s.klass, s.truth) for s in SCENARIOS}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        spans = capture(SCENARIOS)
        pq.write_table(spans, tmp / "spans.parquet")
        before_raw = _before(args.before, tmp / "spans.parquet", tmp)
        before = {s: {c: tuple(a) if a else None for c, a in got.items()} for s, got in before_raw.items()}
        build_and_score(tmp / "after-data", spans)
        after = {s: answers(tmp / "after-data", s, "conversation") for s in NEW}
    classes = sorted({k for k, _ in truth.values()})
    table = Table(title=f"right root cause per class ({len(truth)} conversations): before = {args.before} "
                        "per=trace greedy, after = per=conversation")
    table.add_column("class", no_wrap=True)
    table.add_column("n", justify="right")
    table.add_column("before (greedy)", justify="right")
    for s in NEW:
        table.add_column(f"after {s}", justify="right")
    tallies_before = {s: tally(truth, before[s]) for s in OLD}
    tallies_after = {s: tally(truth, after[s]) for s in NEW}
    for k in [*classes, "all"]:
        n = _count(tallies_before["greedy"], k)[1]
        table.add_row(k, str(n), _cell(tallies_before["greedy"], k), *(_cell(tallies_after[s], k) for s in NEW))
    console.print(table)
    acc = Table(title="RCA accuracy of each strategy (all conversations)")
    acc.add_column("strategy")
    acc.add_column(f"before ({args.before}, per=trace)", justify="right")
    acc.add_column("after (per=conversation)", justify="right")
    for s in NEW:
        before_s = tallies_before.get(s)
        acc.add_row(s, _pct(before_s) if before_s else "-", _pct(tallies_after[s]))
    console.print(acc)
    wrong = [(c, truth[c], after["greedy"][c]) for c in truth if after["greedy"][c] != truth[c][1]]
    for conv, (klass, want), got in wrong:
        console.print(f"after greedy misses {conv} ({klass}): want {want}, got {got}")


if __name__ == "__main__":
    main()
