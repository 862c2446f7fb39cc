"""Issue #31: writers' manifests give each file's ETag, and readers take files' versions from them instead of
listing the tables' folders (a real SeaweedFS, real Parquet, real DuckDB).

A warm connection then lists no table folder; a manifest of an older version (no ETags) reads the same rows
through the folders' listings; a file overwritten in place is never read as the copy of the version before it,
whether the manifest was published again with the new ETag or still names the old one.
"""

from __future__ import annotations

import io
import json
import time

import pyarrow.parquet as pq

from tests.store.objfixtures import quick_module_server as s3_module_server  # noqa: F401  (the module's SeaweedFS)
from tests.store.objfixtures import remote_store
from tracedag.pipeline.store import listing
from tracedag.pipeline.store.cachedfs import LISTING_TTL
from tracedag.pipeline.store.remote import bind_store
from tracedag.pipeline.store.s3lite import S3Lite
from tracedag.pipeline.store.views import connect

COUNT = "select count(*) from spans"


def _count(url: str, work) -> int:
    con = connect(bind_store(url, work, None, False))
    try:
        return int(con.execute(COUNT).fetchall()[0][0])
    finally:
        con.close()


def _newest(fs, bucket: str) -> tuple[str, dict]:
    gens = sorted(fs.ls(f"{bucket}/store/manifests/w", detail=False))
    return gens[-1], json.loads(fs.cat_file(gens[-1]))


def _table_lists(monkeypatch) -> list[str]:
    """The folders under tables/ this process lists from now on."""
    seen: list[str] = []
    original = S3Lite.ls

    def counted(self, path: str, detail: bool = True):
        if "/tables/" in path or path.endswith("/tables"):
            seen.append(path)
        return original(self, path, detail)

    monkeypatch.setattr(S3Lite, "ls", counted)
    return seen


def _later() -> None:
    time.sleep(max(LISTING_TTL, listing.LISTING_TTL) + 0.2)  # this process's listings are stale: read again


def test_a_manifest_gives_each_file_s_etag_and_a_warm_read_lists_no_table_folder(s3, tmp_path, monkeypatch):
    url = f"s3://{s3.bucket}/store"
    remote_store(url, tmp_path, 6, "w")
    fs = s3.filesystem()
    _, manifest = _newest(fs, s3.bucket)
    for table, files in manifest["tables"].items():
        assert set(manifest["etags"][table]) == set(files)
        for rel, etag in manifest["etags"][table].items():  # the listing's ETag: copies cached before stay warm
            listed = {r["name"]: r for r in S3Lite.from_env().ls(f"{s3.bucket}/store/tables/{table}/{rel}".rpartition("/")[0])}
            assert listed[f"{s3.bucket}/store/tables/{table}/{rel}"]["ETag"] == etag
    assert _count(url, tmp_path / "r0") == 18  # cold
    _later()
    seen = _table_lists(monkeypatch)
    assert _count(url, tmp_path / "r1") == 18  # warm
    assert seen == []


def test_a_manifest_without_etags_reads_the_same_through_the_folders_listings(s3, tmp_path, monkeypatch):
    url = f"s3://{s3.bucket}/store"
    remote_store(url, tmp_path, 6, "w")
    fs = s3.filesystem()
    key, manifest = _newest(fs, s3.bucket)
    del manifest["etags"]  # as the previous version wrote it
    fs.pipe_file(key, json.dumps(manifest).encode())
    seen = _table_lists(monkeypatch)
    assert _count(url, tmp_path / "r0") == 18
    assert seen != []  # each table's folder listed for its files' versions
    _later()
    seen.clear()
    assert _count(url, tmp_path / "r1") == 18
    assert seen != []


def _overwrite(fs, bucket: str, manifest: dict) -> tuple[str, str, int]:
    """One spans file of the store overwritten in place with its first row only: (its name under tables/spans/,
    the key, rows removed)."""
    rel = sorted(manifest["tables"]["spans"])[0]
    key = f"{bucket}/store/tables/spans/{rel}"
    table = pq.read_table(io.BytesIO(fs.cat_file(key)))
    assert table.num_rows > 1
    sink = io.BytesIO()
    pq.write_table(table.slice(0, 1), sink)
    fs.pipe_file(key, sink.getvalue())
    return rel, key, table.num_rows - 1


def test_a_file_overwritten_in_place_is_never_read_from_the_old_version_s_copy(s3, tmp_path):
    url = f"s3://{s3.bucket}/store"
    remote_store(url, tmp_path, 6, "w")
    fs = s3.filesystem()
    assert _count(url, tmp_path / "r0") == 18  # every file's copy in the cache, under the manifest's ETags
    gen, manifest = _newest(fs, s3.bucket)
    rel, key, removed = _overwrite(fs, s3.bucket, manifest)
    info = fs.info(key)
    manifest["tables"]["spans"][rel] = int(info["size"])
    manifest["etags"]["spans"][rel] = info["ETag"]
    manifest["generation"] += 1  # the writer publishes the new version
    fs.pipe_file(gen.rpartition("/")[0] + f"/{manifest['generation']:020d}.json", json.dumps(manifest).encode())
    _later()
    assert _count(url, tmp_path / "r1") == 18 - removed


def test_a_file_overwritten_under_a_manifest_that_names_the_old_version_is_read_as_the_store_has_it(s3, tmp_path):
    url = f"s3://{s3.bucket}/store"
    remote_store(url, tmp_path, 6, "w")
    fs = s3.filesystem()
    _, manifest = _newest(fs, s3.bucket)
    _, _, removed = _overwrite(fs, s3.bucket, manifest)  # the manifest still names the old ETag and size
    assert _count(url, tmp_path / "r0") == 18 - removed  # its If-Match GET fails: the folder is listed, read anew


def test_a_work_directory_bound_again_is_read_again(tmp_path):
    from tracedag.pipeline.store.remote import attach, binding

    work = attach(tmp_path / "w", "s3://bucket-a/p", "one")
    assert binding(work)[1] == "one"
    assert binding(work)[1] == "one"  # remembered while the file is the same
    attach(work, "s3://bucket-a/p", "other")  # written again: another inode
    assert binding(work)[1] == "other"
    path = work / "state" / "remote.json"
    path.write_text(path.read_text().replace('"other"', '"third"'))  # in place: another size and mtime
    assert binding(work)[1] == "third"
    path.unlink()
    assert binding(work) is None
