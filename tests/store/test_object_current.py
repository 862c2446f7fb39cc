"""Issue #31: each trace's newest stored round (``current_rounds``) published with an object store (a real SeaweedFS,
real DuckDB, real Parquet).

A reader's fresh work directory takes the table the first reader computed (one GET of
``state/materialized-current.parquet``) instead of reading the state files; a table published for other state
files (a new round, a store wiped and written again) is never taken: it is computed again and published.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.store.objfixtures import Calls, remote_store, tracedag_ok
from tests.store.objfixtures import quick_module_server as s3_module_server  # noqa: F401  (the module's SeaweedFS)
from tests.store.s3_server import agent_runs_dump
from tracedag.pipeline.store import current_rounds
from tracedag.pipeline.store.remote import bind_store, open_remote
from tracedag.pipeline.store.views import connect


def _newest(url: str, work: Path) -> dict[str, int]:
    """Each trace's newest round as a new reader process with the fresh work directory ``work`` finds it."""
    current_rounds._LAST.clear()
    data = bind_store(url, work, None, False)
    con = connect(data, tables=["materialized_traces"])
    try:
        found = current_rounds.newest(con, data)
        assert found is not None
        return dict(zip(found.table.column("trace_id").to_pylist(), found.table.column("mat_round").to_pylist(),
                        strict=True))
    finally:
        con.close()


def _published(url: str) -> bytes:
    remote = open_remote(url)
    return bytes(remote.lite.cat_file(remote.key(current_rounds.PUBLISHED)))


def test_a_fresh_work_directory_takes_the_published_table_and_another_listing_s_is_not_taken(s3, tmp_path, monkeypatch):
    url = f"s3://{s3.bucket}/store"
    remote_store(url, tmp_path, 6, "w", score=True)
    computed = Calls(monkeypatch, current_rounds, "_compute")
    first = _newest(url, tmp_path / "r1")
    assert len(first) == 6 and computed.count == 1  # computed, and published for the others
    assert _newest(url, tmp_path / "r2") == first and computed.count == 1  # a new work directory: one GET
    # a table published under this listing's digest is the one taken (no read of the state files)
    remote = open_remote(url)
    table = pq.read_table(pa.BufferReader(_published(url)))
    planted = table.set_column(2, "mat_round", pa.array([99] * table.num_rows, pa.int64()))
    sink = pa.BufferOutputStream()
    pq.write_table(planted, sink)
    remote.lite.put(remote.key(current_rounds.PUBLISHED), sink.getvalue().to_pybytes())
    assert set(_newest(url, tmp_path / "r3").values()) == {99} and computed.count == 1
    # a new round (more traces built and scored): other state files, computed again, the old table not taken
    dump = agent_runs_dump(tmp_path / "more.json", 9)
    tracedag_ok("ingest", str(dump), "--data", url, "--work-dir", str(tmp_path / "w"))
    tracedag_ok("build", "--idle", "0", "--data", url, "--work-dir", str(tmp_path / "w"))
    tracedag_ok("score", "--no-judge", "--data", url, "--work-dir", str(tmp_path / "w"))
    after = _newest(url, tmp_path / "r4")
    assert computed.count == 2 and 99 not in after.values() and len(after) >= 9
    assert _newest(url, tmp_path / "r5") == after and computed.count == 2


def test_a_store_wiped_and_written_again_never_gets_the_old_table(s3, tmp_path, monkeypatch):
    url = f"s3://{s3.bucket}/store"
    remote_store(url, tmp_path, 6, "w", score=True)
    computed = Calls(monkeypatch, current_rounds, "_compute")
    first = _newest(url, tmp_path / "r1")
    old = _published(url)
    remote = open_remote(url)
    s3.filesystem().rm(remote.root, recursive=True)  # wiped
    remote_store(url, tmp_path, 4, "w2", score=True)  # and written again by another writer
    remote.lite.put(remote.key(current_rounds.PUBLISHED), old)  # with the old table put back
    again = _newest(url, tmp_path / "r2")
    assert computed.count == 2 and len(again) == 4 and set(again) != set(first)
