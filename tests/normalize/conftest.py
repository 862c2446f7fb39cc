"""Put tests/ on sys.path so the shared capture module imports as ``from realspans import ...``."""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
