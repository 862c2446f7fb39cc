"""A real S3 server for the object-store tests: s3rver (npm), which keeps its objects in a directory.

SeaweedFS (the issue's first choice) has no package on Debian 12 or PyPI; s3rver installs offline from
the npm registry (`.ci/run` puts it in ~/.cache/tracedag/s3rver). It persists every object on disk, so
it can be killed and restarted mid-upload like a real server.
"""

from __future__ import annotations

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


def s3rver_binary() -> str | None:
    """The s3rver launcher: on PATH, or where .ci/run installs it."""
    found = shutil.which("s3rver")
    if found:
        return found
    local = S3RVER_HOME / "node_modules" / ".bin" / "s3rver"
    return str(local) if local.exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class S3Server:
    """One s3rver process over ``root``; ``env`` points boto/s3fs at it."""

    root: Path
    port: int = field(default_factory=_free_port)
    proc: subprocess.Popen[bytes] | None = None
    bucket: str = ""

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
                "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def start(self) -> S3Server:
        binary = s3rver_binary()
        assert binary is not None
        self.root.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([binary, "-d", str(self.root), "-a", "127.0.0.1", "-p", str(self.port), "--silent"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.kill()
        raise AssertionError("s3rver did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def make_bucket(self, name: str) -> None:
        fs = self.filesystem()
        fs.mkdir(name)

    def filesystem(self):  # s3fs.S3FileSystem
        import s3fs

        return s3fs.S3FileSystem(endpoint_url=self.endpoint, key=KEY, secret=SECRET, skip_instance_cache=True,
                                 use_listings_cache=False)


@pytest.fixture
def s3(tmp_path, monkeypatch) -> Iterator[S3Server]:
    """A fresh s3rver with a bucket ``b-<test>``; AWS_* variables point this process and its children at it."""
    if s3rver_binary() is None:
        pytest.skip("s3rver is not installed (.ci/run installs it: npm install --prefix ~/.cache/tracedag/s3rver s3rver)")
    server = S3Server(tmp_path / "s3").start()
    for key, value in server.env.items():
        monkeypatch.setenv(key, value)
    server.bucket = f"b{abs(hash(str(tmp_path))) % 10**10}"
    server.make_bucket(server.bucket)
    try:
        yield server
    finally:
        server.kill()
