"""Every command the demo prints (``try:``, ``next:``, ``or …:`` and the ``try next:`` block) runs as printed.

A newcomer copies these lines into a shell, so the test does the same: the demo runs as a user runs it (in an
empty directory, default ``--data ./tracedag-demo``, as a subprocess of this interpreter), each printed command
runs through ``bash -c`` with this interpreter's ``bin/`` first on PATH, in the order the demo prints them, and
the ``next:`` lines those commands print run after them. Three commands need something a shell user would
have: ``tracedag serve`` gets ``--port 0`` (8080 may be taken on a CI machine; the kernel picks a free port) and
is stopped once it answers at the URL it prints; the semantic merge gets the judge variables its line names,
pointing at a local chat-completions server; ``tracedag sql`` without a statement gets a statement on its
standard input.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.demo.demo_support import DemoRun, newcomer_env, private_demo
from tests.score.test_judge import FakeJudge, serve
from tests.serve.serve_support import _announced_url as announced_url
from tests.serve.serve_support import _wait_ready as wait_ready

HINT = re.compile(r"(?:^|[\s;,(])(?:try|next|or)\b[^:\n]*?: (tracedag .+)$")
TIMEOUT = 300


def hints(output: str) -> list[str]:
    """The commands of ``output``: after ``try:``/``next:``/``or …:`` to the end of the line, and the
    indented lines of a ``try next:`` block."""
    found: list[str] = []
    block = False
    for line in output.splitlines():
        if line.strip() == "try next:":
            block = True
            continue
        if block and line.startswith("  tracedag "):
            found.append(line.strip())
            continue
        block = False
        match = HINT.search(line)
        if match:
            found.append(match.group(1).strip())
    return found


def test_hint_parser_reads_every_form():
    text = ("a line; try: tracedag query x --data d\n"
            "  or, as a file: tracedag report --data d --out r.html\n"
            "next: tracedag build --data d && tracedag score --data d\n"
            "try next:\n  tracedag sql --data d\n  tracedag show T --data d\nplain: not a hint\n")
    assert hints(text) == ["tracedag query x --data d", "tracedag report --data d --out r.html",
                           "tracedag build --data d && tracedag score --data d", "tracedag sql --data d",
                           "tracedag show T --data d"]


def _env(**extra: str) -> dict[str, str]:
    return newcomer_env(**extra)


def _run(command: str, cwd: Path, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, input=stdin, capture_output=True,
                          text=True, timeout=TIMEOUT)


def _serve_answers(command: str, cwd: Path, env: dict[str, str]) -> None:
    """Start ``tracedag serve`` as printed (plus ``--port 0``: the kernel picks a free port, no other test can take
    it first); it must answer /healthz and the web UI at the URL it prints."""
    proc = subprocess.Popen(["bash", "-c", f"exec {command} --port 0"], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        output: list[str] = []
        url = announced_url(proc, output)
        wait_ready(url, proc, output)
        with urllib.request.urlopen(f"{url}/", timeout=10) as r:
            assert r.status == 200 and b"<html" in r.read().lower()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _same_step(body: dict) -> str:
    return json.dumps({"same": False, "confidence": 0.9, "reason": "different actions"})


@pytest.fixture
def demo(demo_newcomer: DemoRun, tmp_path: Path) -> tuple[Path, str]:
    """The demo run as a user runs it (an empty directory, the default data directory; run once per test run by
    tests/demo/demo_support.py), copied here: the printed commands write into its store."""
    run = private_demo(demo_newcomer, tmp_path / "newcomer")
    return run.cwd, run.output


def _check(command: str, cwd: Path, env: dict[str, str]) -> str:
    """Run one printed command; return its output (for the ``next:`` lines it prints)."""
    if re.match(r"tracedag serve\b", command):
        _serve_answers(command, cwd, env)
        return ""
    stdin = "select count(*) as traces from traces;\n" if re.fullmatch(r"tracedag sql --data \S+", command) else None
    done = _run(command, cwd, env, stdin)
    output = done.stdout + done.stderr
    # a regression gate that finds a regression exits 1 by design (the demo's line says FAIL, as expected)
    allowed = (0, 1) if command.startswith("tracedag regress ") and "FAIL" in done.stdout else (0,)
    assert done.returncode in allowed, f"`{command}` exited {done.returncode}:\n{output[-3000:]}"
    assert "Traceback" not in output, f"`{command}`:\n{output[-3000:]}"
    return done.stdout


@pytest.mark.timeout(1500)  # about fifteen commands, a Ray cluster among them
def test_every_printed_command_runs_as_printed(demo):
    cwd, output = demo
    printed = hints(output)
    assert len(printed) >= 12, printed
    assert not [c for c in printed if re.search(r"\.\.\.|BUCKET|PREFIX|TRACE_ID|\bDIR\b", c)], printed
    fake = FakeJudge(_same_step)
    with serve(fake) as url:
        judged = _env(TRACEDAG_JUDGE_MODEL="local-judge", TRACEDAG_JUDGE_BASE_URL=url)
        ran: list[str] = []
        for command in printed:
            if "--engine ray" in command and not _has_ray():
                continue
            # only the semantic merge's line names the judge variables; every other command runs without them
            env = judged if "--merge semantic" in command else _env()
            started = time.monotonic()
            follow = [c for c in hints(_check(command, cwd, env)) if c not in printed and c not in ran]
            print(f"{time.monotonic() - started:6.1f} s  {command}")
            ran.append(command)
            for nxt in follow:
                _check(nxt, cwd, env)
                ran.append(nxt)
    assert any(c.startswith("tracedag replay ") for c in ran) and any(c.startswith("tracedag build ") for c in ran)


def _has_ray() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None
