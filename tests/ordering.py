"""The order test files start in: the longest first, so that no long file starts last and runs alone.

README's ``python -m pytest`` runs in parallel with ``--dist loadfile``: xdist hands each worker whole files,
one after another, in the order of the collection, and a worker that is done waits for the others. xdist's
own order (files with the most tests first) started long files with few tests last: the demo's printed
commands (2 tests, ~90 s), the framework captures (a few tests each, minutes when their venv is built), so
one core ran them alone at the end of the run. ``sort_by_weight`` puts the files in decreasing order of
their weight (``file_weights.json``: seconds per file in a recorded run; a file not in it counts as the
median file), the greedy longest-first schedule, which ends within the longest file of the ideal split.

Refresh the weights from a run's JUnit report (``python -m pytest --junitxml=run.xml``)::

    python -m tests.ordering run.xml
"""

from __future__ import annotations

import json
import statistics
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

WEIGHTS = Path(__file__).with_name("file_weights.json")


def load_weights(path: Path = WEIGHTS) -> dict[str, float]:
    """Seconds per test file (its path from the repository root); empty when there is no usable file."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return {str(k): float(v) for k, v in doc.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def sort_by_weight(items: list, weights: dict[str, float]) -> None:
    """Order ``items`` (pytest items) by their file's weight, heaviest first; the order within a file and between
    files of equal weight is kept, so every worker collects the same order (xdist checks it)."""
    if not weights or not items:
        return
    default = statistics.median(weights.values())
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(_file_of(item.nodeid), len(first_seen))
    items.sort(key=lambda item: (-weights.get(_file_of(item.nodeid), default), first_seen[_file_of(item.nodeid)]))


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def weights_from_junit(report: Path) -> dict[str, float]:
    """Seconds per test file from a JUnit report (each test's setup, call and teardown), rounded to 0.1 s."""
    totals: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        path = _path_of_class(case.get("classname") or "")
        if path:
            totals[path] = totals.get(path, 0.0) + float(case.get("time") or 0.0)
    return {k: round(v, 1) for k, v in sorted(totals.items())}


def _path_of_class(classname: str) -> str:
    """``tests.store.test_gc`` or ``tests.store.test_gc.TestX`` -> ``tests/store/test_gc.py``."""
    parts = classname.split(".")
    modules = [i for i, p in enumerate(parts) if p.startswith("test_")]
    if not modules:
        return ""
    return "/".join(parts[: modules[-1] + 1]) + ".py"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.ordering RUN.xml   (a report of python -m pytest --junitxml=RUN.xml)")
        return 2
    weights = weights_from_junit(Path(argv[0]))
    if not weights:
        print(f"{argv[0]}: no test cases")
        return 1
    WEIGHTS.write_text(json.dumps(weights, indent=0, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{WEIGHTS}: {len(weights)} files, {sum(weights.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
