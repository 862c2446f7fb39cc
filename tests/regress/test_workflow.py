"""The example GitHub Actions workflow (deploy/github-actions/regress.yml): its replay and gate steps
run as written, with a real collector, simulator, build, score and gate; the baseline and candidate
tools are both this checkout's ``tracedag`` here."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
import yaml

from tracedag.pipeline.cli import cli

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "deploy" / "github-actions" / "regress.yml"


def _steps():
    doc = yaml.safe_load(WORKFLOW.read_text())
    return {s.get("id") or s.get("name") or s.get("uses"): s for s in doc["jobs"]["regress"]["steps"]}


def test_workflow_is_valid_and_uses_existing_options():
    steps = _steps()
    assert {"replay", "gate"} <= set(steps)
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert doc["jobs"]["regress"]["env"]["PORT"] == "4318"
    regress = cli.get_command(None, "regress")  # type: ignore[arg-type]
    options = {o for p in regress.params for o in p.opts}
    for flag in ("--baseline", "--candidate", "--config", "--junit", "--markdown", "--seed"):
        assert flag in options and flag in steps["gate"]["run"]
    assert (ROOT / "deploy" / "github-actions" / "regress.yaml").exists()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _replay_step(run: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The replay step as written, on a port probed free. The step's collector binds the fixed ``$PORT`` of the
    workflow, so a parallel test can take the probed port first: then the step runs again on another port (up
    to three times), as a CI job would be re-run."""
    for _ in range(3):
        env["PORT"] = str(_free_port())
        done = subprocess.run(["bash", "-c", run], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
        log = cwd / "collector.log"
        if done.returncode == 0 or "already in use" not in (log.read_text() if log.exists() else ""):
            return done
        shutil.rmtree(env["DATA"], ignore_errors=True)
    return done


@pytest.mark.slow
def test_replay_and_gate_steps_run_as_written(tmp_path):
    tracedag = str(Path(sys.executable).parent / "tracedag")  # this interpreter's, not PATH's
    env = {**os.environ, "DATA": str(tmp_path / "data"), "REPLAYS": "2",
           "TRACEDAG": tracedag, "TRACEDAG_BASELINE": tracedag, "GITHUB_WORKSPACE": str(ROOT),
           "GITHUB_OUTPUT": str(tmp_path / "out"), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary")}
    steps = _steps()
    replay = _replay_step(steps["replay"]["run"], tmp_path, env)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    gate = subprocess.run(["bash", "-c", steps["gate"]["run"]], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert gate.returncode in (0, 1), gate.stdout + gate.stderr  # 2 would be a broken workflow
    assert f"exit_code={gate.returncode}" in (tmp_path / "out").read_text()
    assert (tmp_path / "summary").read_text().startswith("### tracedag regress: ")
    suite = ET.parse(tmp_path / "regress.xml").getroot()
    assert int(suite.get("tests")) > 20
    assert "paired by scenario_id, replay_index: 10 cases" in gate.stdout
    again = subprocess.run([tracedag, "regress", "--data", env["DATA"], "--baseline", "simulation_id=sim-seed101",
                            "--candidate", "simulation_id=sim-seed202", "--format", "json"], capture_output=True,
                           text=True, timeout=120)
    assert json.loads(again.stdout)["baseline"]["traces"] == 60
