"""Domain exceptions. Each keeps the ids an operator needs as attributes."""

from __future__ import annotations


class TracedagError(Exception):
    """Base class of every tracedag error; the CLI turns it into a clean message."""


class Retryable:
    """Marker mixin: the operation may succeed if tried again later (disk full, overload)."""


class BadBatch(TracedagError):
    """A spool batch or input file could not be decoded."""

    def __init__(self, batch_id: str, reason: str) -> None:
        super().__init__(f"batch {batch_id}: {reason}")
        self.batch_id = batch_id
        self.reason = reason


class SchemaMismatch(TracedagError):
    """A Parquet file does not carry the schema version the reader expects."""

    def __init__(self, path: str, expected: str, found: str | None) -> None:
        super().__init__(f"{path}: expected schema {expected}, found {found or 'none'}")
        self.path = path
        self.expected = expected
        self.found = found


class QueryFailed(TracedagError):
    """A named or ad-hoc query failed."""

    def __init__(self, query_name: str, reason: str) -> None:
        super().__init__(f"query {query_name}: {reason}")
        self.query_name = query_name
        self.reason = reason


class StorageFull(TracedagError, Retryable):
    """The data directory has no space left; writes resume when space returns."""
