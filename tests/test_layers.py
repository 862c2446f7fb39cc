"""The layout's rules (pyproject's import-linter contracts) hold, and a wrong import breaks them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# How the folders install (pyproject's package-dir); import-linter reads a tree laid out that way.
PACKAGE = {"collector": "collector", "pipeline": "pipeline", "schemas": "schemas", "queries": "queries",
           "instrument": "pipeline/instrument", "testing": "pipeline/testing"}


def _lay_out(tmp: Path) -> Path:
    pkg = tmp / "tracedag"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, folder in PACKAGE.items():
        skip = ("__pycache__", "instrument", "testing") if name == "pipeline" else ("__pycache__",)
        shutil.copytree(ROOT / folder, pkg / name, ignore=shutil.ignore_patterns(*skip))
    return pkg


def _lint(tmp: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
           str(ROOT / "pyproject.toml"), "--no-cache"]
    return subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, env={"PYTHONPATH": str(tmp), "PATH": "/usr/bin:/bin"})


def test_import_contracts_hold(tmp_path):
    _lay_out(tmp_path)
    r = _lint(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout and "7 kept" in r.stdout, r.stdout


def test_a_wrong_import_breaks_the_contracts(tmp_path):
    pkg = _lay_out(tmp_path)
    spool = pkg / "collector" / "spool.py"  # the request path reaching up into the stages
    spool.write_text(spool.read_text() + "\nfrom tracedag.pipeline.dag import build_store  # noqa\n")
    normalize = pkg / "pipeline" / "normalize" / "rules.py"  # a lower layer importing a higher one
    normalize.write_text(normalize.read_text() + "\nfrom tracedag.pipeline.ingest import segments  # noqa\n")
    labels = pkg / "pipeline" / "score" / "labels" / "agreement.py"  # one kind of score reaching into another
    labels.write_text(labels.read_text() + "\nfrom tracedag.pipeline.score.judge import config  # noqa\n")
    r = _lint(tmp_path)
    assert r.returncode == 1
    assert "tracedag.collector.spool -> tracedag.pipeline.dag" in r.stdout, r.stdout
    assert "tracedag.pipeline.normalize.rules -> tracedag.pipeline.ingest.segments" in r.stdout, r.stdout
    flat = " ".join(r.stdout.split())  # the report wraps long lines
    assert "tracedag.pipeline.score.labels.agreement -> tracedag.pipeline.score.judge.config" in flat, r.stdout


def test_tests_mirror_the_package_and_never_edit_sys_path():
    tests = ROOT / "tests"
    packages = {p.name for p in (ROOT / "pipeline").iterdir() if (p / "__init__.py").exists()}
    packages |= {"collector", "queries", "schemas"}
    areas = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert areas <= packages, sorted(areas - packages)
    assert sorted(p.relative_to(tests).as_posix() for p in tests.rglob("conftest.py")) == ["conftest.py"]
    edits = [p.relative_to(ROOT).as_posix() for p in tests.rglob("*.py")
             if p.name != "test_layers.py" and ("sys.path.insert" in p.read_text() or "sys.path.append" in p.read_text())]
    assert edits == []
