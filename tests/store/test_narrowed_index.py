"""A process that searches a store again finds the files holding given traces by the trace ids it keeps of each file.

``mixed.narrowed`` (a live collector's store pass, a server's trace view, a scoring run's parts) found them by a scan
of the ``trace_id`` column of every file of five tables, in every pass: 1.6 s of CPU on 870k traces
(``bench/narrowed.py``; ``mixedkept.files_holding``). A process's first search still scans; later ones read
only the files they have not seen. Either way the files are those that hold the traces: checked here against the
scan after new rounds, a collection that merges files, and traces that are in no file.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tests.score.score_support import StoreBuilder, agent_turn
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.runner import score_store
from tracedag.pipeline.store import fileids, mixed, mixedkept
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.gc import GcSettings
from tracedag.pipeline.store.swap import collect
from tracedag.pipeline.store.views import _LATEST, connect

RELATION = "__test_wanted"
NO_GC = GcSettings(enabled=False)


def _scanned(data: Path, traces: list[str]) -> dict[str, str]:
    """What ``narrowed`` gives by the scan (a process that never searched the store)."""
    mixedkept.forget()
    return _narrowed(data, traces)


def _narrowed(data: Path, traces: list[str]) -> dict[str, str]:
    con = connect(data)
    try:
        con.register(RELATION, pa.table({"trace_id": pa.array(traces, pa.string())}))
        return mixed.narrowed(con, data, RELATION)
    finally:
        con.close()


def _round(b: StoreBuilder, data: Path, *turns: tuple[str, str, int, str]) -> None:
    b.spans([row for t in turns for row in agent_turn(*t)])
    build_store(data, idle_seconds=0, gc=NO_GC)
    score_store(data)


@pytest.fixture
def store(tmp_path: Path) -> tuple[StoreBuilder, Path]:
    data = tmp_path / "data"
    b = StoreBuilder(data)
    _round(b, data, ("a1", "conv-1", 1_000_000, "search"), ("x1", "conv-2", 2_000_000, "fetch"))
    return b, data


def test_a_second_search_reads_the_kept_ids_and_finds_the_files_the_scan_finds(store: tuple[StoreBuilder, Path],
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    b, data = store
    expected = _scanned(data, ["a1"])
    _round(b, data, ("a2", "conv-1", 3_000_000, "lookup"), ("y1", "conv-3", 4_000_000, "plan"))
    listed = {str(f) for t in _LATEST for f in parquet_files(data, t)}
    _narrowed(data, ["a1"])  # the process's second search (the round's own searches may have been the first)
    seen = set(fileids._IDS)

    def no_scan(*args: object) -> str:
        raise AssertionError("a search of a store searched before scanned its files")

    read: list[str] = []
    real = fileids.pq.read_table
    monkeypatch.setattr(mixed, "_files_holding", no_scan)
    monkeypatch.setattr(fileids.pq, "read_table", lambda path, **kw: read.append(str(path)) or real(path, **kw))
    again = _narrowed(data, ["a1"])
    assert read == []  # every file's ids kept: nothing read again
    assert {s[0] for s in seen} == listed
    _round(b, data, ("a3", "conv-1", 6_000_000, "search"))
    monkeypatch.setattr(mixed, "_files_holding", no_scan)
    found = _narrowed(data, ["a1", "a2", "y1", "a3"])
    assert read and not set(read) & listed  # only the files the last round wrote were read
    monkeypatch.undo()
    assert again == expected
    assert found == _scanned(data, ["a1", "a2", "y1", "a3"])
    for table in _LATEST:
        assert ".parquet" in found[table], table  # every table holds rows of those traces


def test_after_a_collection_merges_the_files_the_merged_ones_are_found(store: tuple[StoreBuilder, Path]) -> None:
    b, data = store
    _round(b, data, ("a2", "conv-1", 3_000_000, "lookup"))
    _round(b, data, ("z1", "conv-4", 5_000_000, "search"))
    _narrowed(data, ["a1"])  # the first search: the scan; from now on the kept ids
    before = {t: set(parquet_files(data, t)) for t in _LATEST}
    collect(data, compact=True)
    assert any(set(parquet_files(data, t)) != before[t] for t in _LATEST)  # files were swapped
    wanted = ["a1", "a2", "x1", "z1"]
    assert _narrowed(data, wanted) == _scanned(data, wanted)


def test_traces_in_no_file_read_no_file(store: tuple[StoreBuilder, Path]) -> None:
    _, data = store
    _narrowed(data, ["a1"])
    found = _narrowed(data, ["nope-1", "nope-2"])
    assert found == _scanned(data, ["nope-1", "nope-2"])
    assert all(".parquet" not in sql for sql in found.values())
