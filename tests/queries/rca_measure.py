"""Right-root-cause counts on the real-instrumentation conversations of ``rca_scenarios``.

``build_and_score`` turns a spans table into a scored store; ``answers`` reads what ``root_causes``
names for each conversation: with ``per=conversation`` its one row, with ``per=trace`` (all an
older tracedag had) the row of the conversation's latest failed turn. ``tally`` counts the right
answers per scenario class. ``python -m tests.queries.rca_measure SPANS.parquet DATA OUT.json
STRATEGY...`` does all three with whatever ``tracedag`` is importable (``bench/rca.py`` runs it
under the git HEAD version for the "before" figures).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

Answer = tuple[int, str] | None


def build_and_score(data: Path, spans: pa.Table) -> None:
    """Write ``spans`` into a new store at ``data``, then build and score it."""
    from tracedag.pipeline.dag import build_store
    from tracedag.pipeline.normalize.evaluations import extract_evaluations
    from tracedag.pipeline.score import score_store
    from tracedag.pipeline.store.parquet import write_parquet_atomic
    from tracedag.schemas.layout import table_dir

    (data / "state").mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(spans, table_dir(data, "spans"))
    write_parquet_atomic(extract_evaluations(spans), table_dir(data, "evaluations"))
    build_store(data, idle_seconds=0)
    score_store(data)


def answers(data: Path, strategy: str = "greedy", per: str = "conversation") -> dict[str, Answer]:
    """Conversation id -> the root cause tracedag names, as (turn index, span name); None: not failed."""
    from tracedag.pipeline.store.querying import run_named
    from tracedag.pipeline.store.views import connect

    con = connect(data)
    try:
        traces = con.execute("select trace_id, conversation_id from traces "
                             "order by conversation_id, start_time_unix_nano, trace_id").fetchall()
        names = {(t, s): n for t, s, n in con.execute("select trace_id, span_id, name from spans").fetchall()}
    finally:
        con.close()
    turn: dict[str, tuple[str, int]] = {}
    for trace_id, conv in traces:
        turn[trace_id] = (conv, sum(1 for c in turn.values() if c[0] == conv) + 1)
    out: dict[str, Answer] = {conv: None for _, conv in traces}
    latest: dict[str, int] = {}
    for r in run_named(data, "root_causes", {"strategy": strategy, "per": per}).to_pylist():
        conv, index = turn[r["trace_id"]]
        if index < latest.get(conv, 0):
            continue
        latest[conv] = index
        root_trace = r.get("root_trace_id") or r["trace_id"]
        out[conv] = (turn[root_trace][1], names[(root_trace, r["root_span_id"])])
    return out


def tally(truth: dict[str, tuple[str, Answer]], got: dict[str, Answer]) -> dict[str, tuple[int, int]]:
    """Per class: (right, conversations). ``truth``: conversation id -> (class, true answer)."""
    out: dict[str, tuple[int, int]] = {}
    for conv, (klass, want) in truth.items():
        right, n = out.get(klass, (0, 0))
        out[klass] = (right + (got.get(conv) == want), n + 1)
    return out


def main(argv: Sequence[str]) -> None:
    """SPANS.parquet DATA OUT.json PER STRATEGY...: build, score, write every strategy's answers."""
    spans, data, out, per, *strategies = argv
    build_and_score(Path(data), pq.read_table(spans))
    found = {s: answers(Path(data), s, per) for s in strategies}
    Path(out).write_text(json.dumps(found))


if __name__ == "__main__":
    main(sys.argv[1:])
