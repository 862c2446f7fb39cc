"""Reading the spans of the traces to build, one bounded chunk at a time.

One chunk: a direct filtered read. Several chunks: one pass over the spans files routes each row
to its chunk's Arrow IPC file under ``<data>/state/build-tmp/<build_id>/``; each file is then
memory-mapped and reconstructed in turn. Every span is read from Parquet once, whatever the number of
chunks, so time grows linearly with the store and memory with the chunk size.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from tracedag.pipeline.dag.prep import INPUT_COLUMNS
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.remote import open_remote, remote_of
from tracedag.schemas.layout import tables_dir
from tracedag.schemas.spans import SPANS_V1

logger = logging.getLogger(__name__)

INPUT_SCHEMA = pa.schema([SPANS_V1.field(c) for c in INPUT_COLUMNS])


@dataclass(frozen=True)
class Source:
    """The spans files a build reads: the plan's listing, and the earliest arrival it needs (None: all).

    Row groups and files whose spans all arrived before ``received_from`` are skipped on their
    footer statistics, so a live round reads the last seconds of the store, not all of it.
    """

    data: Path
    files: list[Path] | None = None  # None: list the store now
    received_from: int | None = None
    store: str | None = None  # the object store ``data`` works on (set from it): a task on another machine reads it

    def __post_init__(self) -> None:
        if self.store is None:
            remote = remote_of(self.data)
            object.__setattr__(self, "store", None if remote is None else remote.url)

    def dataset(self, relist: bool = False) -> ds.Dataset:
        files = parquet_files(self.data, "spans") if relist or self.files is None else self.files
        return spans_dataset(self.data, arrived_since(files, self.received_from), self.store)

    def filter(self, trace_ids: pa.Array) -> ds.Expression:
        flt = ds.field("trace_id").isin(trace_ids)
        if self.received_from is not None:
            flt = flt & (ds.field("received_unix_nano") >= self.received_from)
        return flt


_MAXIMA: dict[tuple[str, int, int, str], int | str | None] = {}
"""(path, size, mtime, column) -> the greatest value of the column in a file per its statistics (None: unknown)."""


def arrived_since(files: list[Path], received_from: int | None) -> list[Path]:
    """``files`` without those whose every span arrived before ``received_from``, per their footers (read once
    per file version: spans files never change in place). The scan would skip them on the same statistics, but
    only after opening each: a live round then opened every spans file of the store. A file that is not here
    (in an object store) or whose statistics do not tell is kept."""
    return files if received_from is None else reaching(files, "received_unix_nano", received_from)


def reaching(files: list[Path], column: str, bound: int | str) -> list[Path]:
    """``files`` without those whose every value of the top-level ``column`` (an int or string column) is below
    ``bound``, per their footers (read once per file version; a published file never changes under its name). A
    file that is not here or whose statistics do not tell is kept."""
    kept = []
    for f in files:
        top = _greatest(f, column)
        if top is None or top >= bound:  # type: ignore[operator]  # an int column's bound is an int, a string's a str
            kept.append(f)
    return kept


def _greatest(path: Path, column: str) -> int | str | None:
    try:
        st = path.stat()
    except OSError:
        return None
    key = (str(path), st.st_size, st.st_mtime_ns, column)
    if key not in _MAXIMA:
        if len(_MAXIMA) > 10_000:
            _MAXIMA.clear()
        try:
            meta = pq.ParquetFile(path).metadata
        except (OSError, pa.ArrowInvalid):
            return None  # the scan reports it
        _MAXIMA[key] = _max_statistic(meta, column)
    return _MAXIMA[key]


def _max_statistic(meta: pq.FileMetaData, column: str) -> int | str | None:
    """The greatest value of the top-level int or string ``column`` over the row groups of ``meta`` (None: not
    known)."""
    col = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == column), -1)
    if col < 0:
        return None
    best: int | str | None = None
    for g in range(meta.num_row_groups):
        if meta.row_group(g).num_rows == 0:
            continue
        st = meta.row_group(g).column(col).statistics
        if st is None or not st.has_min_max or not isinstance(st.max, int | str):
            return None
        best = st.max if best is None else max(best, st.max)
    return best


def spans_dataset(data: Path, files: list[Path], store: str | None = None) -> ds.Dataset:
    """A dataset of spans files: local paths, and (for a work directory of the object store ``store``)
    published ones, read from the store (also where the work directory is not: an engine task elsewhere)."""
    remote = remote_of(data) or (open_remote(store) if store else None)
    if remote is None:
        return ds.dataset([str(f) for f in files], schema=SPANS_V1, format="parquet")
    local = [str(f) for f in files if f.exists()]
    published = [remote.key("tables/" + f.relative_to(tables_dir(data)).as_posix()) for f in files if not f.exists()]
    parts = [ds.dataset(local, schema=SPANS_V1, format="parquet")]
    if published:
        fs = pafs.PyFileSystem(pafs.FSSpecHandler(remote.fs))
        parts.append(ds.dataset(published, schema=SPANS_V1, format="parquet", filesystem=fs))
    return parts[0] if len(parts) == 1 else ds.dataset(parts)


def load_spans(source: Source, trace_ids: pa.Array) -> pa.Table:
    """Read the input columns of the spans of ``trace_ids``."""
    flt = source.filter(trace_ids)
    try:
        return source.dataset().to_table(columns=INPUT_COLUMNS, filter=flt)
    except FileNotFoundError:  # compaction swapped a partition after we listed it
        logger.info("a spans file went away during the build; listing again")
        return source.dataset(relist=True).to_table(columns=INPUT_COLUMNS, filter=flt)


def _route(source: Source, chunks: list[pa.Array], tmp: Path) -> None:
    """Write the spans of each chunk to ``tmp/chunk-<k>.arrow`` in one pass over the spans files."""
    ids = pa.concat_arrays(chunks)
    bounds = np.cumsum([len(c) for c in chunks])
    writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
    try:
        scanner = source.dataset().scanner(
            columns=INPUT_COLUMNS, filter=source.filter(ids), batch_readahead=2, fragment_readahead=1
        )
        for batch in scanner.to_batches():
            pos = pc.index_in(batch.column("trace_id"), value_set=ids).to_numpy(zero_copy_only=False)
            chunk = np.searchsorted(bounds, pos, side="right")
            for k in np.unique(chunk).tolist():
                if k not in writers:
                    writers[k] = pa.ipc.new_stream(str(tmp / f"chunk-{k}.arrow"), INPUT_SCHEMA)
                writers[k].write_batch(batch.take(pa.array(np.flatnonzero(chunk == k))))
    finally:
        for w in writers.values():
            w.close()


def chunk_tables(source: Source, chunks: list[pa.Array], tmp: Path) -> Generator[pa.Table, None, None]:
    """Yield the input spans of each chunk of trace ids, in order."""
    if len(chunks) == 1:
        yield load_spans(source, chunks[0])
        return
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        _route(source, chunks, tmp)
        for k in range(len(chunks)):
            path = tmp / f"chunk-{k}.arrow"
            if not path.exists():
                yield INPUT_SCHEMA.empty_table()
                continue
            with pa.memory_map(str(path)) as source:
                yield pa.ipc.open_stream(source).read_all()
            path.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
