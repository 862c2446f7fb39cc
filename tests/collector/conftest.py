"""Fixtures of tests/collector (defined in collector_support.py, which test modules import by name).

tests/ goes on sys.path too, for the shared ``pinned_venv`` module."""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from collector_support import *  # noqa: E402, F403
