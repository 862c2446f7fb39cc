"""Issue #29 item 13: a store wiped (or rolled back) under a work directory that remembers it.

Before, ``tracedag ingest --data s3://b/p FILE`` run again after the bucket was wiped and made again
reported every span as a duplicate and exited 0 while the bucket stayed empty. Now the work directory
sees that the store's newest manifest of its writer is missing or older than the generation it
published last: it publishes every file it still holds again, or, when files only the store held
(moved out of the work directory by ``--keep-local``) are gone, refuses with one line saying what
happened and how to go on (``TRACEDAG_ACCEPT_STORE_LOSS=1``, or a new ``--work-dir``).

The fast tests use fsspec's ``memory://`` store in-process (``CliRunner``); the last one runs the
issue's commands against a real S3 server (SeaweedFS).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests.store.objfixtures import quick_module_server as s3_module_server  # noqa: F401  (the SeaweedFS of s3)
from tracedag.pipeline.cli import cli
from tracedag.pipeline.store.listing import newest_manifest, read_listing
from tracedag.pipeline.store.manifests import ACCEPT_LOSS, KeepLocal, publish
from tracedag.pipeline.store.remote import attach, open_remote
from tracedag.pipeline.store.views import connect

SPANS = 5


def _dump(path: Path, first: int = 1) -> Path:
    spans = [{"traceId": f"{first + i:032x}", "spanId": f"{first + i:016x}", "name": f"step-{first + i}",
              "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000"}
             for i in range(SPANS)]
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}))
    return path


@pytest.fixture
def memory_url():
    """A fresh ``memory://`` bucket with a prefix; removed afterwards."""
    fs = fsspec.filesystem("memory")
    bucket = f"b{uuid.uuid4().hex[:10]}"
    fs.mkdir(bucket)
    yield f"memory://{bucket}/p"
    fs.rm(bucket, recursive=True)


def _wipe_and_remake(url: str) -> None:
    """What an operator does: delete the bucket with everything in it, then create it again (empty)."""
    fs = fsspec.filesystem("memory")
    bucket = url.removeprefix("memory://").partition("/")[0]
    fs.rm(bucket, recursive=True)
    assert not fs.exists(bucket)
    fs.mkdir(bucket)


def _ingest(url: str, work: Path, dump: Path, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, ["ingest", str(dump), "--data", url, "--work-dir", str(work), "--writer-id", "w"],
                              env=env)


def _span_count(url: str, reader: Path) -> int:
    """What a fresh work directory reads from the store."""
    attach(reader, url)
    return int(connect(reader, shared_macros=False).execute("select count(*) from spans").fetchone()[0])


def test_a_wiped_store_gets_the_work_directorys_files_again(memory_url, tmp_path, caplog):
    dump, work = _dump(tmp_path / "spans.json"), tmp_path / "w"
    first = _ingest(memory_url, work, dump)
    assert first.exit_code == 0, first.output
    published = newest_manifest(open_remote(memory_url), "w")
    assert published is not None and _span_count(memory_url, tmp_path / "r1") == SPANS
    _wipe_and_remake(memory_url)
    again = _ingest(memory_url, work, dump)
    assert again.exit_code == 0, again.output
    assert "duplicates" in again.output  # the work directory knew them all: true, and now the store has them again
    after = newest_manifest(open_remote(memory_url), "w")
    assert after is not None and after["generation"] > published["generation"]
    assert after["tables"]["spans"] == published["tables"]["spans"]
    assert _span_count(memory_url, tmp_path / "r2") == SPANS
    assert any("no longer holds" in r.getMessage() and "publishing the" in r.getMessage() for r in caplog.records)
    build = CliRunner().invoke(cli, ["build", "--idle", "0", "--data", memory_url, "--work-dir", str(tmp_path / "b")])
    assert build.exit_code == 0, build.output


def _parquet(work: Path, table: str, name: str, values: list[int]) -> None:
    folder = work / "tables" / table
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"x": values}), folder / name)


def test_a_manifest_rolled_back_to_an_older_generation_is_published_again(memory_url, tmp_path):
    work = attach(tmp_path / "w", memory_url, "w")
    _parquet(work, "traces", "part-1.parquet", [1])
    assert publish(work).generation == 1
    _parquet(work, "traces", "part-2.parquet", [2])
    assert publish(work).generation == 2
    remote = open_remote(memory_url)
    remote.fs.rm_file(remote.key("manifests/w/00000000000000000002.json"))  # the store restored from a backup
    remote.fs.rm_file(remote.key("tables/traces/w--part-2.parquet"))
    assert newest_manifest(remote, "w")["generation"] == 1
    stats = publish(work)
    assert stats is not None and stats.republished and stats.uploaded == 2 and stats.generation == 3
    assert sorted(read_listing(remote)["w"]["traces"]) == ["w--part-1.parquet", "w--part-2.parquet"]
    assert remote.fs.exists(remote.key("tables/traces/w--part-2.parquet"))
    assert publish(work).generation is None  # in step again: nothing new, no new generation


def test_files_only_the_store_held_are_lost_so_it_refuses_in_one_line(memory_url, tmp_path):
    dump, work = _dump(tmp_path / "spans.json"), tmp_path / "w"
    assert _ingest(memory_url, work, dump).exit_code == 0
    evicted = publish(work, keep_local=KeepLocal(0, ("spans",)))  # as `collect --keep-local 0` does
    assert evicted is not None and evicted.evicted == 1 and not list((work / "tables" / "spans").rglob("*.parquet"))
    _wipe_and_remake(memory_url)
    refused = _ingest(memory_url, work, _dump(tmp_path / "more.json", first=100))
    assert refused.exit_code in (1, 2), refused.output  # 2: refused at --data, before any work
    error = refused.output.strip().splitlines()[-1]
    assert "Traceback" not in refused.output and error.startswith("Error: "), refused.output
    assert "memory://" in error and "no longer holds" in error and "were kept only in the store" in error, error
    assert f"set {ACCEPT_LOSS}=1 once" in error and "use a new --work-dir" in error, error
    assert read_listing(open_remote(memory_url)) == {}  # nothing published, and no success claimed
    # the user accepts the loss: the new spans go to the store, and re-ingesting the lost file restores it
    accepted = _ingest(memory_url, work, dump, env={ACCEPT_LOSS: "1"})
    assert accepted.exit_code == 0, accepted.output
    assert _span_count(memory_url, tmp_path / "r1") in (SPANS, 2 * SPANS)  # 2x when more.json got in before
    assert _ingest(memory_url, work, tmp_path / "more.json").exit_code == 0  # in step again: no variable needed
    assert _span_count(memory_url, tmp_path / "r2") == 2 * SPANS


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=os.environ.copy())
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_the_issue_on_s3_ingest_after_the_bucket_was_wiped_and_made_again(s3, tmp_path):
    url, work = f"s3://{s3.bucket}/p", tmp_path / "w"
    dump = _dump(tmp_path / "spans.json")
    first = CliRunner().invoke(cli, ["ingest", str(dump), "--data", url, "--work-dir", str(work)])  # in this process
    assert first.exit_code == 0, first.output
    fs = s3.filesystem()
    fs.rm(s3.bucket, recursive=True)  # the bucket wiped and made again
    s3.make_bucket(s3.bucket)
    s3.wait_writable(s3.bucket)
    assert fs.ls(s3.bucket, refresh=True) == []
    again = _run("ingest", str(dump), "--data", url, "--work-dir", str(work))
    _run("build", "--idle", "0", "--data", url, "--work-dir", str(tmp_path / "b"))
    counted = _run("query", "--data", url, "--work-dir", str(tmp_path / "q"), "--format", "csv",
                   "--sql", "select count(*) as n from spans")
    assert counted.stdout.splitlines()[-1].strip() == str(SPANS), counted.stdout
    assert "publishing the 1 files" in again.stderr and "again" in again.stderr, again.stderr  # said, once
    assert again.stderr.count("no longer holds") == 1, again.stderr


def test_a_collector_refused_by_a_wiped_store_says_so_once_not_every_round(memory_url, tmp_path, caplog):
    """The live publisher meets the same ``StoreLost`` every round (each ``publish_interval``): it says it
    once, in its one line and with no traceback, then only a count once a minute, and keeps the files."""
    import logging
    import time

    from tests.collector.collector_support import make_request, make_span, post
    from tracedag.pipeline.service import CollectorConfig, start_collector

    work = attach(tmp_path / "w", memory_url)
    c = start_collector(CollectorConfig(data=work, http_port=0, grpc_port=0, publish_interval=0.02,
                                        keep_local_seconds=0.0))
    try:
        caplog.set_level(logging.INFO, logger="tracedag")
        assert post(c.http_port, make_request([make_span(i) for i in range(SPANS)]).SerializeToString()).status == 200
        _wait(lambda: read_listing(open_remote(memory_url)) != {} and not list((work / "tables" / "spans").rglob("*.parquet")))
        _wipe_and_remake(memory_url)
        _wait(lambda: any("were kept only in the store" in r.getMessage() for r in caplog.records))
        time.sleep(1.0)  # ~50 more rounds, each refused the same way
    finally:
        c.stop(2)
    said = [r for r in caplog.records if "no longer holds" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert said[0].exc_info is None and "publishing to the object store failed" in said[0].getMessage()


def _wait(condition, seconds: float = 30.0) -> None:
    import time
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
