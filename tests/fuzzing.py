"""How many examples a property test draws: a sample in every run of the suite, the whole budget on demand.

Each property test states its full budget, ``@settings(max_examples=examples(300), ...)``. A plain
``python -m pytest`` draws a quarter of it (at least ``FLOOR``): hypothesis picks new random examples on each
run, so successive runs still cover the space, and a run stays within the suite's time. ``-m slow`` (the
on-demand soak and fuzzing run, tests/conftest.py) or ``TRACEDAG_FUZZ=full`` draws every example.
"""

from __future__ import annotations

import os

SHARE = 4
FLOOR = 10


def full() -> bool:
    """True when the whole budget is asked for: ``TRACEDAG_FUZZ=full`` (which ``-m slow`` sets, tests/conftest.py)."""
    return os.environ.get("TRACEDAG_FUZZ", "").strip().lower() == "full"


def examples(budget: int) -> int:
    """The examples this run draws of a test whose full budget is ``budget``."""
    return budget if full() else min(budget, max(FLOOR, budget // SHARE))
