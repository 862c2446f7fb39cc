"""The order the suite's files start in (tests/ordering.py): the heaviest first, the same on every worker."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.ordering import WEIGHTS, load_weights, main, sort_by_weight, weights_from_junit


@dataclass
class Item:
    nodeid: str


def _ids(items: list[Item]) -> list[str]:
    return [i.nodeid for i in items]


def test_files_start_heaviest_first_and_keep_their_own_order():
    items = [Item("tests/a.py::t1"), Item("tests/a.py::t2"), Item("tests/b.py::t1"), Item("tests/c.py::t1"),
             Item("tests/c.py::t2"), Item("tests/d.py::t1")]
    # b 90 s, a 10, c 40; d unknown: the median of (10, 40, 90) = 40, tied with c and after it (c came first)
    sort_by_weight(items, {"tests/a.py": 10.0, "tests/b.py": 90.0, "tests/c.py": 40.0})
    assert _ids(items) == ["tests/b.py::t1", "tests/c.py::t1", "tests/c.py::t2", "tests/d.py::t1",
                           "tests/a.py::t1", "tests/a.py::t2"]


def test_no_weights_leave_the_collection_as_it_is():
    items = [Item("tests/b.py::t"), Item("tests/a.py::t")]
    sort_by_weight(items, {})
    assert _ids(items) == ["tests/b.py::t", "tests/a.py::t"]


def test_weights_come_from_a_junit_report_per_file(tmp_path: Path):
    report = tmp_path / "run.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.store.test_gc" name="test_a" time="1.25"/>'
        '<testcase classname="tests.store.test_gc" name="test_b" time="2.0"/>'
        '<testcase classname="tests.serve.test_ui.TestPage" name="test_c" time="3.04"/>'
        '<testcase classname="conftest" name="setup" time="9"/>'
        '</testsuite></testsuites>', encoding="utf-8")
    assert weights_from_junit(report) == {"tests/serve/test_ui.py": 3.0, "tests/store/test_gc.py": 3.2}


def test_a_missing_or_broken_weights_file_orders_nothing(tmp_path: Path):
    assert load_weights(tmp_path / "none.json") == {}
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2", encoding="utf-8")
    assert load_weights(bad) == {}


def test_the_kept_weights_name_test_files_that_exist():
    weights = load_weights(WEIGHTS)
    assert weights, f"{WEIGHTS} is missing: python -m tests.ordering RUN.xml makes it"
    root = Path(__file__).resolve().parent.parent
    gone = [f for f in weights if not (root / f).is_file()]
    assert len(gone) <= len(weights) // 10, f"refresh {WEIGHTS.name}: {gone[:5]} ..."


def test_the_refresh_command_refuses_a_report_without_tests(tmp_path: Path, capsys):
    empty = tmp_path / "empty.xml"
    empty.write_text("<testsuites/>", encoding="utf-8")
    assert main([str(empty)]) == 1
    assert main([]) == 2
    assert "usage" in capsys.readouterr().out
    assert json.loads(WEIGHTS.read_text(encoding="utf-8"))  # untouched


PLUGIN = '''
def pytest_collection_finish(session):
    for item in session.items:
        marker = item.get_closest_marker("timeout")
        print("TIMEOUT", item.nodeid, marker.args[0] if marker else None)
'''


def test_a_module_needing_a_pinned_venv_gives_its_tests_the_venvs_pip_timeout_and_more(tmp_path: Path):
    """conftest: a test that may build a pinned venv (or wait for its build) is not ended at the suite's 300 s."""
    import os
    import subprocess
    import sys

    from tests.conftest import VENV_EXTRA
    from tests.normalize.frameworks.fw_capture import VENVS

    (tmp_path / "timeout_probe.py").write_text(PLUGIN, encoding="utf-8")
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                          "-p", "timeout_probe", "tests/normalize/frameworks/test_fw_google_adk.py",
                          "tests/test_ordering.py"], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    found = dict(line.split()[1:] for line in out.stdout.splitlines() if line.startswith("TIMEOUT "))
    adk = {k: v for k, v in found.items() if "test_fw_google_adk" in k}
    assert adk and set(adk.values()) == {str(int(VENVS["google-adk"].pip_timeout + VENV_EXTRA))}, out.stdout[-2000:]
    assert {v for k, v in found.items() if "test_ordering" in k} == {"None"}
