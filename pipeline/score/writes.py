"""``step_scores`` files written in the background, in order, while scoring goes on.

Parquet encoding, compression and the fsyncs release the GIL: the rule pass's passing rows are
written while the other steps go through the rules, and while the evaluations are mapped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pyarrow as pa

from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.schemas.fsio import file_lock
from tracedag.schemas.layout import SCORE_LOCK, state_file


class Writes:
    """One background thread writing tables as new files of ``directory``, in submission order."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="score-writes")
        self._pending: list[Future[Path]] = []

    def write(self, make: Callable[[], pa.Table]) -> None:
        """Write the table ``make`` returns (made in the background too) as one new file."""
        self._pending.append(self._pool.submit(lambda: write_parquet_atomic(make(), self._dir)))

    def close(self) -> list[Path]:
        """Wait for every file; return their paths (raises what a write raised)."""
        try:
            return [future.result() for future in self._pending]
        finally:
            self._pool.shutdown()


@contextmanager
def background_writes(directory: Path, files: list[Path]) -> Iterator[Writes]:
    """``Writes`` into ``directory`` for the ``with`` block; the paths written are added to ``files``."""
    writes = Writes(directory)
    try:
        yield writes
    finally:
        files.extend(writes.close())


def score_lock(data: Path) -> AbstractContextManager[bool]:
    """One scorer at a time per data directory (two would score the same builds twice): held by
    ``runner.score_store`` and by ``labels.human`` while it rewrites the human step scores."""
    return file_lock(state_file(data, SCORE_LOCK))
