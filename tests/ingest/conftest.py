"""Fixtures of tests/ingest (defined in ingest_support.py, which test modules import by name)."""

from ingest_support import *  # noqa: F403
