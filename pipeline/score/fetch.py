"""A query's rows as Arrow, planned once: ``store.fetch.arrow``, which the scorer's queries fetch with."""

from __future__ import annotations

from tracedag.pipeline.store.fetch import arrow

__all__ = ["arrow"]
