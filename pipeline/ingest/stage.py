"""Staged conversion: a segment's chunks are converted and written to a private temp file
outside the writer lock, so one converter's Parquet writing overlaps another's and at most one
chunk's Arrow data is in memory at a time.

Only de-duplication and the rename into ``tables/`` happen under the lock (``StoreWriter.commit_staged``).
The temp file lives in ``<data>/state/convert-<shard>/`` (cleaned by that shard at start); if the
lock-time check finds rows already stored, the file is read back, filtered and written normally.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracedag.pipeline.convert.converted import Converted
from tracedag.pipeline.convert.records import convert_records
from tracedag.pipeline.normalize.evaluations import extract_evaluations
from tracedag.pipeline.store.dedupe import DedupeIndex
from tracedag.pipeline.store.parquet import parquet_options
from tracedag.schemas.layout import converter_stage_dir, state_dir

logger = logging.getLogger(__name__)

@dataclass
class Staged:
    """A converted segment in a temp Parquet file: row keys, content hashes and evaluations."""

    path: Path
    keys: np.ndarray
    content: np.ndarray
    evaluations: pa.Table | None
    rows: int
    bad_records: int
    duplicates: int = 0  # dropped before staging (already indexed, or repeated in the segment)
    conflicts: int = 0

    def discard(self) -> None:
        """Delete the temp file."""
        self.path.unlink(missing_ok=True)


def stage_dir(data: Path, shard: int) -> Path:
    """Return (and create) the private staging directory of converter ``shard``."""
    d = converter_stage_dir(data, shard)
    d.mkdir(parents=True, exist_ok=True)
    return d


def clean_stage_dir(data: Path, shard: int, shards: int = 1) -> None:
    """Remove a shard's leftover temp files (a crash left them; they were never visible).

    Shard 0 also removes the directories of shards that no longer exist (fewer converters now).
    """
    dirs = [stage_dir(data, shard)]
    if shard == 0:
        dirs += [d for d in state_dir(data).glob("convert-*") if not d.name[8:].isdigit() or int(d.name[8:]) >= shards]
    for d in dirs:
        for f in d.iterdir():
            f.unlink(missing_ok=True)


def stage_chunks(
    chunks: Iterator[list[tuple[bytes, int]]], batch_id: str, path: Path, index: DedupeIndex | None = None,
) -> Staged:
    """Convert ``chunks`` one by one, each into its own row group of the file ``path``, in arrival order.

    Rows are not sorted: a 4096-row group of random trace ids spans the whole id range whatever
    its order, so sorting buys no row-group pruning, and on agent spans it changed the file size
    by under 0.5 % while its copy of every column cost about 5 % of the conversion's CPU.

    ``chunks`` is consumed lazily: only one chunk's payloads need to be in memory at a time.
    Rows already in ``index`` (a possibly stale copy; the commit checks again under the lock) or
    repeated within the segment are dropped here, so the commit rarely has to rewrite the file.
    """
    keys: list[np.ndarray] = []
    contents: list[np.ndarray] = []
    evals: list[pa.Table] = []
    rows = bad = 0
    seen = DedupeIndex(max_keys=1 << 40)
    dup = [0, 0]
    writer: pq.ParquetWriter | None = None
    try:
        if "enospc" in os.environ.get("TRACEDAG_FAULT", "").split(","):
            raise OSError(errno.ENOSPC, "No space left on device (injected)", str(path))
        with open(path, "wb") as fh:
            try:
                for chunk in chunks:
                    conv = _drop_known(convert_records(chunk, batch_id, consume=True), index, seen, dup)
                    del chunk
                    bad += conv.bad_records
                    if not conv.table.num_rows:
                        continue
                    table = conv.table
                    keys.append(conv.keys)
                    contents.append(conv.content)
                    del conv
                    e = extract_evaluations(table)
                    if e.num_rows:
                        evals.append(e)
                    if writer is None:
                        writer = pq.ParquetWriter(fh, table.schema, **parquet_options(table, fast=True))
                    writer.write_table(table, row_group_size=64 * 1024)
                    rows += table.num_rows
            finally:
                if writer is not None:
                    writer.close()
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return Staged(path, _cat(keys), _cat(contents), pa.concat_tables(evals) if evals else None, rows, bad,
                  dup[0], dup[1])


def _drop_known(conv: Converted, index: DedupeIndex | None, seen: DedupeIndex, dup: list[int]) -> Converted:
    """Drop rows of ``conv`` found in ``index`` or earlier in the segment (``seen``); count them in ``dup``."""
    if index is None:
        return conv
    res = index.check(conv.keys, conv.content)
    keep = res.keep & seen.check(conv.keys, conv.content).keep
    dropped = int(len(keep) - keep.sum())
    if dropped:
        dup[0] += dropped
        dup[1] += res.conflicts
        conv = Converted(conv.table.filter(pa.array(keep)), conv.keys[keep], conv.content[keep], conv.bad_records)
    seen.add("segment", conv.keys, conv.content)
    return conv


def _cat(arrays: Iterable[np.ndarray]) -> np.ndarray:
    parts = list(arrays)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
