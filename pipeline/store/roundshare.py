"""What a score round on an object store leaves for its readers: the stored rows' freshness answer (``freshness``,
published as ``freshkept`` does) and each trace's newest stored round (``current_rounds.publish``).

Without it the first reader after each round computes both in its own work directory (a scan of the builds and the
state, 0.07-0.17 s CPU, and the state files read again) before it publishes them for the others.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tracedag.pipeline.store import current_rounds, freshness
from tracedag.pipeline.store.remote import binding

if TYPE_CHECKING:
    import duckdb


def share_round(con: duckdb.DuckDBPyConnection, data: Path) -> bool:
    """After a round's files are published to the object store ``data`` works on: compute and publish the freshness
    answer on ``con`` (views over the store as it is now) and publish the current rounds kept here. False: a local
    store (nothing to share)."""
    if binding(data) is None:
        return False
    freshness.freshness(con, data)  # computed from exactly the listed files, kept and published (freshkept)
    current_rounds.publish(data)
    return True
