"""Stores of source conversations for the replay tests, written through the real collector."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tracedag import instrument as td
from tracedag.pipeline.demo.agent.booking_agent import BookingAgent
from tracedag.pipeline.service import CollectorConfig, start_collector

ROOT = Path(__file__).resolve().parents[2]

BOOKING_TURNS = ("Hi, I'd like to book a tennis court.", "Saturday.", "At 18:00 please.", "Yes, please book it.")
INFO_TURNS = ("What are your opening hours?",)


def example_store(data: Path, conversations: dict[str, Sequence[str]], fault_rate: float = 0.0,
                  labels: dict[str, dict[str, str | int]] | None = None) -> Path:
    """Hold ``conversations`` (id -> user turns) with the example agent and store their spans in ``data``;
    ``labels`` (id -> run labels) labels some of them (``td.run_labels``)."""
    collector = start_collector(CollectorConfig(data=data, http_port=0, grpc_port=None))
    try:
        td.configure(f"http://127.0.0.1:{collector.http_port}", service_name="court-booking-agent",
                     service_version="1.0", set_global=False, schedule_delay_millis=50)
        try:
            for i, (cid, turns) in enumerate(conversations.items()):
                agent = BookingAgent.create("constrained", random.Random(i), random.Random(100 + i),
                                            fault_rate=fault_rate, latency_scale=0.0)
                with td.conversation(cid), td.run_labels(**(labels or {}).get(cid, {})):
                    agent.run(list(turns))
            assert td.force_flush(30_000)
        finally:
            td.shutdown()
        collector.flush()
    finally:
        collector.stop()
    return data


CLI = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()"]
"""``tracedag`` as this interpreter runs it (never a ``tracedag`` found on PATH)."""


def run_tracedag(*args: object, timeout: float = 240, env: dict[str, str] | None = None,
                 ) -> subprocess.CompletedProcess[str]:
    """``tracedag ARGS`` in a process of this interpreter, from the repository root, 200 columns wide."""
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


def in_process(*args: object) -> subprocess.CompletedProcess[str]:
    """``tracedag ARGS`` in this process (click's runner, 200 columns wide), as ``run_tracedag`` gives it: for a
    test that needs the command's work, not its process (exit codes, ctrl-c, a stderr of one line are tested
    on processes)."""
    from click.testing import CliRunner

    from tracedag.pipeline.cli import cli

    words = [str(a) for a in args]
    done = CliRunner().invoke(cli, words, env={"COLUMNS": "200"})
    if done.exception is not None and not isinstance(done.exception, SystemExit):
        raise done.exception  # a traceback, which a process would print: the test fails showing it
    return subprocess.CompletedProcess(words, done.exit_code, done.stdout, done.stderr)


@pytest.fixture(name="files")
def sim_files(tmp_path: Path) -> tuple[Path, Path]:
    """The tiny graph and a one-persona file of the simulated-user tests."""
    from tests.replay.sim_agents import TINY_GRAPH

    graph = tmp_path / "tiny.json"
    graph.write_text(json.dumps(TINY_GRAPH))
    personas = tmp_path / "personas.yaml"
    personas.write_text("personas:\n  - name: plain\n    prompt: You say it plainly.\n    temperature: 0.3\n")
    return graph, personas

