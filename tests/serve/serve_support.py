"""Shared parts of the serve tests: a built and scored store, and ``tracedag serve`` as a real process."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import pytest

from bench.gen import make_store
from tests.loopback import http_client
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


@pytest.fixture(scope="session")
def plain_server(serve_store: Path) -> Iterator[Server]:
    """``tracedag serve --data serve_store`` with the default options, started once per worker for the modules
    that only read through it (GET pages and APIs, statements the guard refuses): a server start costs ~4 s of
    CPU (its imports, the warm pass, two spare SQL workers), and five modules each started their own. A module
    that changes a server (its options, its limits, its processes) or measures one starts its own."""
    with running_server(serve_store) as s:
        yield s


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
        return http_client(base_url=self.url, timeout=timeout, headers=headers)


@contextmanager
def running_server(data: Path, *args: str, token: str | None = None, tmp: Path | None = None) -> Iterator[Server]:
    """``tracedag serve --data DATA ARGS`` on loopback port 0, until the block ends.

    The server binds a port the kernel picks (no other test can take it between a probe and the bind) and
    prints its URL once it listens; the test reads that line and then its first /healthz, waiting on the
    process, not on a deadline a loaded machine can miss (pytest-timeout is the backstop).
    """
    cmd = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "serve", "--data", str(data),
           "--port", "0", *args]
    if token is not None:
        assert tmp is not None
        token_file = tmp / "token"
        token_file.write_text(token + "\n")
        cmd += ["--token-file", str(token_file)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    output: list[str] = []
    try:
        url = _announced_url(proc, output)
        _wait_ready(url, proc, output)
        yield Server(url, proc, token)
    finally:
        with suppress(ProcessLookupError):  # it may have exited on its own (the test then says why)
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


_ANNOUNCED = re.compile(r"tracedag serve: (http://\S+?)/ ")


def _announced_url(proc: subprocess.Popen[bytes], output: list[str]) -> str:
    """The URL of the server's ``tracedag serve: http://HOST:PORT/ ...`` line (printed once the port is bound);
    its later output goes on into ``output`` from a thread, so a full pipe never blocks the server."""
    assert proc.stdout is not None
    for raw in proc.stdout:  # ends when the process exits without having printed it
        output.append(raw.decode(errors="replace"))
        found = _ANNOUNCED.search(output[-1])
        if found:
            threading.Thread(target=_drain, args=(proc.stdout, output), daemon=True).start()
            return found.group(1)
    raise AssertionError(f"tracedag serve exited with {proc.wait()}: {''.join(output)}")


def _drain(stream: IO[bytes], output: list[str]) -> None:
    for raw in stream:
        output.append(raw.decode(errors="replace"))


def _wait_ready(url: str, proc: subprocess.Popen[bytes], output: list[str]) -> None:
    """Until /healthz answers (the port is bound before the server listens) or the server exits. One client for
    every try: ``httpx.get`` makes a client, and its TLS context, each time (~20 ms CPU; 18 s across the suite).
    The server speaks plain HTTP: ``http_client`` makes no TLS context at all."""
    with http_client(timeout=None) as client:
        while proc.poll() is None:
            try:
                if client.get(f"{url}/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
    proc.wait()
    raise AssertionError(f"tracedag serve exited with {proc.returncode}: {''.join(output)}")
