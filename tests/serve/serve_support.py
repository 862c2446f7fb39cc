"""Shared parts of the serve tests: a built and scored store, and ``tracedag serve`` as a real process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from bench.gen import make_store
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.runner import score_store


def built_store(data: Path, spans: int = 1500, seed: int = 21) -> Path:
    """A store of ``spans`` generated spans, built and scored (rules and evaluations)."""
    make_store(data, spans, seed=seed)
    build_store(data, idle_seconds=0.0)
    score_store(data)
    return data


@pytest.fixture(scope="session")
def serve_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A built and scored store shared by the serve tests (read-only: the server never writes)."""
    return built_store(tmp_path_factory.mktemp("serve") / "store")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    token: str | None = None

    def client(self, timeout: float = 30.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.Client(base_url=self.url, timeout=timeout, headers=headers)


@contextmanager
def running_server(data: Path, *args: str, token: str | None = None, tmp: Path | None = None) -> Iterator[Server]:
    """``tracedag serve --data DATA ARGS`` on a free loopback port, until the block ends."""
    port = free_port()
    cmd = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "serve", "--data", str(data),
           "--port", str(port), *args]
    if token is not None:
        assert tmp is not None
        token_file = tmp / "token"
        token_file.write_text(token + "\n")
        cmd += ["--token-file", str(token_file)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        yield Server(url, proc, token)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            raise AssertionError(f"tracedag serve exited with {proc.returncode}: {out}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("tracedag serve did not answer /healthz within 30 s")
