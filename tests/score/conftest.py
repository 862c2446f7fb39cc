"""Fixtures of tests/score (defined in score_support.py, which test modules import by name)."""

from score_support import *  # noqa: F403
