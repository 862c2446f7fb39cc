"""Issue #31: DuckDB's opens of an object store's files take the versions a connection's views were made from
(a real SeaweedFS, real DuckDB).

A long cold query opens a view's files seconds after the view was made: each open used to list its folder
again once the listing was ``LISTING_TTL`` old. Now the entries the views were made from answer those opens
while the connection lives; a connection made after a store was wiped and written again lists it again and
reads the new files.
"""

from __future__ import annotations

import gc
import time

from tests.store.objfixtures import quick_module_server as s3_module_server  # noqa: F401  (the module's SeaweedFS)
from tests.store.objfixtures import remote_store
from tracedag.pipeline.store import cachedfs
from tracedag.pipeline.store.cachedfs import LISTING_TTL
from tracedag.pipeline.store.remote import bind_store, remote_of
from tracedag.pipeline.store.views import connect


def test_duckdb_s_opens_take_the_views_entries_and_a_rewritten_store_is_seen_by_the_next_connection(
        s3, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEDAG_CACHE_WHOLE", "0")  # block copies only: the views name URLs, DuckDB opens them
    url = f"s3://{s3.bucket}/store"
    remote_store(url, tmp_path, 6, "w")
    work = bind_store(url, tmp_path / "r", None, False)
    remote = remote_of(work)
    assert remote is not None and remote.lite is not None
    fs = remote.reading_fs()
    lists: list[str] = []
    listing = remote.lite.ls

    def counted(path: str, detail: bool = True):
        lists.append(path)
        return listing(path, detail=detail)
    monkeypatch.setattr(remote.lite, "ls", counted)
    con = connect(work)
    made = len(lists)
    time.sleep(LISTING_TTL + 0.3)  # every listing is stale now, as in a long query
    assert con.execute("select count(*) from traces").fetchall() == [(6,)]
    assert con.execute("select count(*) from spans").fetchall() == [(18,)]
    assert len(lists) == made, lists[made:]  # every open answered by the entries the views were made from
    assert fs._held
    monkeypatch.setattr(cachedfs, "HOLD_SECONDS", 0.0)  # held longer than that: the opens list the store again
    assert con.execute("select count(*) from traces").fetchall() == [(6,)]
    assert len(lists) > made
    con.close()
    del con
    gc.collect()
    assert not fs._held  # released with the connection
    s3.filesystem().rm(remote.root, recursive=True)  # wiped
    remote_store(url, tmp_path, 4, "w2")  # and written again by another writer
    time.sleep(LISTING_TTL + 0.3)
    con = connect(bind_store(url, tmp_path / "r2", None, False))
    assert con.execute("select count(*) from traces").fetchall() == [(4,)]
    assert con.execute("select count(*) from spans").fetchall() == [(12,)]
    con.close()
