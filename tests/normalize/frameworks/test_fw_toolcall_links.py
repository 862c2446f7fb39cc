"""Tool-call edges on REAL framework spans whose tools start before the model call that emitted them ends
(issue #30 class 4): the link is the call id, else containment and order, never a 1 ms tolerance.

Strands (no call ids on its model spans: order alone) and pydantic-ai (call ids on both sides) run
from their pinned venvs against the scripted model and a real ``tracedag collect``
(``fw_capture.capture``); the store is built by the real pipeline. Its ``tool_call`` edges are the
baseline (each tool hangs off the model call that asked for it: the scripted replies say which).
The same spans are then built again with every tool span (and its subtree) moved earlier, as a tool
host whose clock runs behind, or a tool started while the model's answer was still streaming, would
record them, and the edges must not change:

- ``streaming``: each tool starts halfway through the model call that emitted it;
- ``behind``: each tool starts 1 ms before that model call started (only a call id can tell then).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.normalize.frameworks.fw_capture import VENVS, Capture, capture
from tests.normalize.frameworks.fw_scenarios import pydantic_ai_scenarios, strands_scenarios

KEEP = ("retry", "clean-order", "multi-ok")  # two calls of one tool, then a turn with another tool
SCENARIOS = {
    "strands": [s for s in strands_scenarios() if s.conversation.split("-", 1)[1] in KEEP],
    "pydantic-ai": [s for s in pydantic_ai_scenarios() if s.conversation.split("-", 1)[1] in KEEP],
}
PINNED_VENVS = [VENVS[f] for f in SCENARIOS]  # built in the background from the start of the run (tests.pinned_venv)


def build(data: Path, spans: pa.Table | None = None) -> None:
    """Build the DAGs of the store at ``data`` (after writing ``spans`` into it as a new store)."""
    from tracedag.pipeline.dag import build_store
    from tracedag.pipeline.normalize.spans import normalize
    from tracedag.pipeline.store.parquet import write_parquet_atomic
    from tracedag.schemas.layout import table_dir
    from tracedag.schemas.spans import BASE_SCHEMA

    if spans is not None:
        (data / "state").mkdir(parents=True, exist_ok=True)
        write_parquet_atomic(normalize(spans.select(BASE_SCHEMA.names).cast(BASE_SCHEMA)), table_dir(data, "spans"))
    build_store(data, idle_seconds=0)


def read(data: Path, sql: str) -> pa.Table:
    from tracedag.pipeline.store.views import connect

    con = connect(data)
    try:
        return con.sql(sql).to_arrow_table()
    finally:
        con.close()


def links(data: Path) -> set[tuple[str, str]]:
    """(model span id, tool span id) of every tool_call edge."""
    t = read(data, "select upstream_span_id, downstream_span_id from dag_edges where edge_kind = 'tool_call'")
    return set(zip(t.column(0).to_pylist(), t.column(1).to_pylist(), strict=True))


def moved(spans: pa.Table, edges: set[tuple[str, str]], how: str) -> pa.Table:
    """``spans`` with each linked tool span and its subtree moved earlier (``how``: streaming | behind)."""
    ids = spans.column("span_id").to_pylist()
    row = {s: i for i, s in enumerate(ids)}
    start = spans.column("start_time_unix_nano").to_numpy().copy()
    end = spans.column("end_time_unix_nano").to_numpy().copy()
    parent = spans.column("parent_span_id").to_pylist()
    for model, tool in edges:
        m, t = row[model], row[tool]
        to = (start[m] + end[m]) // 2 if how == "streaming" else start[m] - 1_000_000
        shift = start[t] - to
        for r in [i for i in range(len(ids)) if _under(i, t, parent, row)]:
            start[r] -= shift
            end[r] -= shift
    for name, values in (("start_time_unix_nano", start), ("end_time_unix_nano", end)):
        spans = spans.set_column(spans.schema.get_field_index(name), name, pa.array(values, pa.int64()))
    return spans


def _under(i: int, top: int, parent: list[str | None], row: dict[str, int]) -> bool:
    while True:
        if i == top:
            return True
        up = parent[i]
        if up is None or up not in row:
            return False
        i = row[up]


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[Capture, pa.Table]]:
    """Framework -> its capture (built) and spans, filled on first use (``captured_run``)."""
    return {}


def captured_run(runs: dict[str, tuple[Capture, pa.Table]], framework: str, tmp: Path) -> tuple[Capture, pa.Table]:
    if framework not in runs:
        cap = capture(framework, SCENARIOS[framework], tmp / framework / "data")
        build(cap.data)
        runs[framework] = cap, read(cap.data, "select * from spans")
    return runs[framework]


@pytest.mark.parametrize("framework", list(SCENARIOS))
def test_each_tool_hangs_off_the_model_call_that_asked_for_it(runs, framework: str, tmp_path_factory) -> None:
    cap, spans = captured_run(runs, framework, tmp_path_factory.mktemp("capture"))
    edges = links(cap.data)
    tools = spans.filter(pc.equal(spans.column("step_type"), "tool"))
    assert {t for _, t in edges} == set(tools.column("span_id").to_pylist())
    # each scripted reply with a tool call is one model call that asked for one tool
    asked = [r for s in SCENARIOS[framework] for _, r in s.replies if r["choices"][0]["message"].get("tool_calls")]
    starts = dict(zip(spans.column("span_id").to_pylist(), spans.column("start_time_unix_nano").to_pylist(),
                      strict=True))
    assert len({m for m, _ in edges}) == len(asked) == tools.num_rows
    assert all(starts[m] < starts[t] for m, t in edges)


# Strands' model spans carry no call ids: order alone links there, so a tool that starts before its
# model call started (``behind``) can only be linked by a call id, which pydantic-ai records.
@pytest.mark.parametrize(("framework", "how"), [("strands", "streaming"), ("pydantic-ai", "streaming"),
                                                ("pydantic-ai", "behind")])
def test_a_tool_that_starts_before_its_model_call_ends_keeps_its_link(runs, framework: str, how: str,
                                                                     tmp_path_factory, tmp_path: Path) -> None:
    cap, spans = captured_run(runs, framework, tmp_path_factory.mktemp("capture"))
    base = links(cap.data)
    shifted = moved(spans, base, how)
    starts = dict(zip(shifted.column("span_id").to_pylist(), shifted.column("start_time_unix_nano").to_pylist(),
                      strict=True))
    ends = dict(zip(shifted.column("span_id").to_pylist(), shifted.column("end_time_unix_nano").to_pylist(),
                    strict=True))
    assert all(starts[t] < ends[m] for m, t in base)  # every tool now starts before its model call ends
    build(tmp_path / "data", shifted)
    assert links(tmp_path / "data") == base
