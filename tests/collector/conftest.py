"""Fixtures of tests/collector (defined in collector_support.py, which test modules import by name)."""

from collector_support import *  # noqa: F403
