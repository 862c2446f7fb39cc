"""Issue #31: the stored rows' freshness answer published with an object store (a real SeaweedFS, real DuckDB).

A reader's fresh work directory takes the answer the first reader computed (one GET of
``state/materialized-fresh.json``) instead of scanning the builds and the state; a new build, a changed SQL
definition, a store wiped and written again each make another key, and a published answer of another key is
never taken (the answer is computed again and the new one published).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.store.objfixtures import Calls, remote_store, tracedag_ok
from tests.store.objfixtures import quick_module_server as s3_module_server  # noqa: F401  (the module's SeaweedFS)
from tests.store.s3_server import agent_runs_dump
from tracedag.pipeline.store import freshkept, freshness, materialized
from tracedag.pipeline.store.remote import bind_store, open_remote
from tracedag.pipeline.store.views import connect


def _read(url: str, work: Path) -> freshness.Freshness:
    """The freshness a new reader process with the fresh work directory ``work`` finds."""
    freshness._FRESH.clear()
    data = bind_store(url, work, None, False)
    con = connect(data, shared_macros=False)
    try:
        return freshness.freshness(con, data)
    finally:
        con.close()


def _published(url: str) -> dict:
    remote = open_remote(url)
    return json.loads(remote.lite.cat_file(remote.key(freshkept.PUBLISHED)))


def test_a_fresh_work_directory_takes_the_published_answer_and_a_new_listing_asks_again(s3, tmp_path, monkeypatch):
    url = f"s3://{s3.bucket}/store"
    remote_store(url, tmp_path, 6, "w", score=True)
    asked = Calls(monkeypatch, freshness, "_freshness_now")
    first = _read(url, tmp_path / "r1")
    assert first.fresh and asked.count == 1  # computed, and published for the others
    assert _read(url, tmp_path / "r2") == first and asked.count == 1  # a new work directory: one GET
    assert freshness.known_freshness(bind_store(url, tmp_path / "r3", None, False)) == first
    # an answer published under this listing's digest is the one taken (no scan of the tables)
    doc = _published(url)
    remote = open_remote(url)
    remote.lite.put(remote.key(freshkept.PUBLISHED), json.dumps({**doc, "answer": {**doc["answer"], "usable": False}}).encode())
    assert not _read(url, tmp_path / "r4").usable and asked.count == 1
    # another SQL definition: another key, computed (and the newest round did not see that SQL)
    today = materialized.definitions_hash
    monkeypatch.setattr(materialized, "definitions_hash", lambda: "another-sql")
    assert not _read(url, tmp_path / "r5").usable and asked.count == 2
    monkeypatch.setattr(materialized, "definitions_hash", today)
    # a new build of more traces, not scored yet: a new listing, asked again; the old answer is not taken
    dump = agent_runs_dump(tmp_path / "more.json", 9)
    tracedag_ok("ingest", str(dump), "--data", url, "--work-dir", str(tmp_path / "w"))
    tracedag_ok("build", "--idle", "0", "--data", url, "--work-dir", str(tmp_path / "w"))
    after_build = _read(url, tmp_path / "r6")
    assert asked.count == 3 and not after_build.fresh
    assert _published(url)["digest"] != doc["digest"]
    tracedag_ok("score", "--no-judge", "--data", url, "--work-dir", str(tmp_path / "w"))
    assert _read(url, tmp_path / "r7").fresh and asked.count == 4


def test_a_store_wiped_and_written_again_never_gets_the_old_answer(s3, tmp_path, monkeypatch):
    url = f"s3://{s3.bucket}/store"
    remote_store(url, tmp_path, 6, "w", score=True)
    asked = Calls(monkeypatch, freshness, "_freshness_now")
    assert _read(url, tmp_path / "r1").fresh and asked.count == 1
    remote = open_remote(url)
    old = remote.lite.cat_file(remote.key(freshkept.PUBLISHED))
    s3.filesystem().rm(remote.root, recursive=True)  # wiped
    remote_store(url, tmp_path, 4, "w2", score=True)  # and written again by another writer, with fewer traces
    # the old answer left behind (a wipe that missed it) is another listing's: not taken
    remote.lite.put(remote.key(freshkept.PUBLISHED), old)
    again = _read(url, tmp_path / "r2")
    assert again.fresh and asked.count == 2
    assert _published(url)["digest"] != json.loads(old)["digest"]
