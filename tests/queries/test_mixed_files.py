"""Issue 31: ``store.mixed`` reads the traces not stored yet from the files that hold them (``mixed.narrowed``). A
stale trace whose spans and builds sit in an old file and a newer one is read from both; a file that comes later,
or one rewritten in place, is found by the next read; the answers stay the SQL's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from tests.queries.test_materialized import _assert_mixed_equal, four_stored_conversations
from tests.score.score_support import StoreBuilder, agent_turn
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.runner import LiveRound, score_store
from tracedag.pipeline.store import mixed
from tracedag.pipeline.store.views import _LATEST, connect


def _late_span(trace: str, conversation: str, at: int) -> list[dict[str, object]]:
    """One more tool span of ``trace`` (a child of its root), received at ``at``: the trace is built again."""
    turn = agent_turn(trace, conversation, at, "late")
    tool = dict(turn[1], span_id=f"{trace}-late-{at}")
    return [tool]


def _files(source: str) -> set[str]:
    return {p.split("/")[-1] for p in source.split("'") if p.endswith(".parquet")}


def _sources(data: Path, ids: list[str]) -> dict[str, str]:
    con = connect(data, shared_macros=False)
    try:
        con.register("asked", pa.table({"trace_id": pa.array(ids, pa.string())}))
        sources = mixed.narrowed(con, data, "asked")
        for table, source in sources.items():  # the rows of the files found are those of the whole table
            got = sorted(map(repr, con.sql(f"select * from {source}").fetchall()))
            want = sorted(map(repr, con.sql(f"select * from {table}_all where trace_id in "
                                            "(select trace_id from asked)").fetchall()))
            assert got == want, table
        return sources
    finally:
        con.close()


def test_a_stale_trace_in_an_old_file_and_a_new_one_is_read_from_both_and_later_files_are_scanned(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = four_stored_conversations(tmp_path_factory, data)
    spans = data / "tables" / "spans"
    old = {f.name for f in spans.rglob("*.parquet")}
    # a late span of the stored a1 and a later turn: built and scored, not stored (a live round's backlog)
    b.spans(_late_span("a1", "conv-a1", 5_000_000) + agent_turn("a2", "conv-a1", 9_000_000, "lookup"))
    built = build_store(data, idle_seconds=0)
    score_store(data, live=LiveRound(built.build_id, built.received_from, materialize=False))
    _assert_mixed_equal(data, {"a1", "a2"})
    found = _files(_sources(data, ["a1"])["spans"])
    assert found & old and found - old  # a1's spans: its first file and the late span's
    # another late span of a1 in a new file, built only: found by the next read
    b.spans(_late_span("a1", "conv-a1", 6_000_000))
    build_store(data, idle_seconds=0)
    newest = {f.name for f in spans.rglob("*.parquet")} - old - found
    assert len(newest) == 1 and newest <= _files(_sources(data, ["a1"])["spans"])
    _assert_mixed_equal(data, {"a1", "a2"})


def test_a_file_rewritten_in_place_is_scanned_again(tmp_path: Path) -> None:
    """A file keeps its path but not its rows (as ``step_scores/human.parquet``): its trace ids are asked again."""
    data = tmp_path / "data"
    b = StoreBuilder(data)
    for i, c in enumerate(("a1", "x1")):  # two batches: each trace's spans in a file of its own
        b.spans(agent_turn(c, f"conv-{c}", 1_000_000 * (i + 1), "search"))
        build_store(data, idle_seconds=0)
    holding = {t: _files(_sources(data, [t])["spans"]) for t in ("a1", "x1")}
    assert len(holding["a1"]) == len(holding["x1"]) == 1 and holding["a1"] != holding["x1"]
    spans = {f.name: f for f in (data / "tables" / "spans").rglob("*.parquet")}
    target, other = spans[min(holding["a1"])], spans[min(holding["x1"])]
    replaced = target.with_suffix(".tmp")
    shutil.copyfile(other, replaced)
    os.replace(replaced, target)
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert _files(_sources(data, ["x1"])["spans"]) == {target.name, other.name}  # both now hold x1's spans
    assert set(_sources(data, ["a1"])) == set(_LATEST) and not _files(_sources(data, ["a1"])["spans"])
