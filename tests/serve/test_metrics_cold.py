"""#31 ``/metrics`` cold: every family is read on one connection, from narrowed queries; the text is the
one the named queries give.

The figures are checked against the named queries run whole (``run_named``: what ``metrics.compute``
read before #31), and a store whose named queries answer from their stored rows gives the same text
as the same store computing them from their SQL.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tests.score.score_support import StoreBuilder, agent_turn
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.runner import score_store
from tracedag.pipeline.serve.data import Store
from tracedag.pipeline.serve.metrics import DISK, Metrics, compute
from tracedag.pipeline.store import freshness, materialized
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.views import connect
from tracedag.schemas.layout import state_dir, tables_dir


def without_timing(text: str) -> str:
    return re.sub(r"^tracedag_metrics_compute_seconds .*$", "", text, flags=re.M)


def test_step_latency_is_step_stats_p50_and_p90_in_its_order(serve_store: Path) -> None:
    rows = [r for r in run_named(serve_store, "step_stats", {}).to_pylist() if r["grain"] == "step"]
    text = compute(serve_store)
    for q in ("p50", "p90"):
        name = f"tracedag_step_latency_{q}_seconds"
        got = [line for line in text.splitlines() if line.startswith(name + "{")]
        want = [f'{name}{{step_type="{r["step_type"]}",step_name="{r["step_name"]}"}} {float(r[f"{q}_ms"]) / 1000:.6f}'
                for r in rows if r[f"{q}_ms"] is not None]
        assert got == want and len(want) >= 3


def test_build_lag_counts_every_trace_with_a_received_time(serve_store: Path) -> None:
    con = connect(serve_store)
    try:
        n = con.execute("select count(*) from traces where last_received_unix_nano is not null").fetchall()[0][0]
    finally:
        con.close()
    counts = re.findall(r"^tracedag_build_lag_seconds_count\{.*\} (\d+)$", compute(serve_store), flags=re.M)
    assert n > 0 and sum(int(c) for c in counts) == n


def test_stored_rows_and_sql_give_the_same_text(serve_store: Path, tmp_path: Path) -> None:
    con = connect(serve_store)
    try:
        assert freshness.fresh(con, serve_store)  # the scorer stored the named queries' rows
    finally:
        con.close()
    computed = tmp_path / "sql"
    shutil.copytree(serve_store, computed)
    for d in tables_dir(computed).glob(materialized.PREFIX + "*"):
        shutil.rmtree(d)
    stored_text, sql_text = compute(serve_store), compute(computed)
    assert "tracedag_failures{" in stored_text and "tracedag_root_causes{" in stored_text
    assert without_timing(stored_text) == without_timing(sql_text)


def test_a_build_states_text_is_kept_for_the_next_server_and_computed_again_after_a_build_or_collection(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = StoreBuilder(data)
    b.spans(agent_turn("a1", "conv-1", 1_000_000, "search"))
    build_store(data, idle_seconds=0)
    score_store(data)
    first = Metrics(Store(data)).text()
    kept = list((state_dir(data) / DISK).glob("*.prom"))
    assert [k.read_text() for k in kept] == [first]
    # a server started again on the unchanged store: the kept text, compute time included (not recomputed)
    assert Metrics(Store(data)).text() == first
    b.spans(agent_turn("b1", "conv-2", 2_000_000, "fetch"))
    build_store(data, idle_seconds=0)
    second = Metrics(Store(data)).text()
    assert "tracedag_traces_built 2\n" in second and without_timing(second) == without_timing(compute(data))
    build_store(data, idle_seconds=0, full=True)  # every trace rebuilt, the earlier builds collected
    score_store(data)
    third = Metrics(Store(data)).text()
    assert third != second and without_timing(third) == without_timing(compute(data))
    assert [k.read_text() for k in (state_dir(data) / DISK).glob("*.prom")] == [third]
