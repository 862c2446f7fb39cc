"""The build of one bucket of traces, as a task of a distributed engine (``build --engine ray``).

``build_bucket`` reads the input spans of its bucket itself (the plan's spans files through
``Source``, filtered on the bucket's received-time and trace-id ranges, then on its trace ids) and
returns what ``reconstruct`` makes of them: the same pure function as the local build, on the
same rows. It writes nothing; the driver writes each bucket's tables (``dag.build``).
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.dataset as ds

from tracedag.pipeline.dag.chunks import Source
from tracedag.pipeline.dag.prep import INPUT_COLUMNS
from tracedag.pipeline.dag.reconstruct import reconstruct
from tracedag.pipeline.dag.spec import WorkflowSpec
from tracedag.pipeline.engine import Bucket

logger = logging.getLogger(__name__)


def bucket_filter(source: Source, bucket: Bucket) -> ds.Expression:
    """The bucket's rows: its trace ids, with the ranges statistics can prune on."""
    tid = ds.field("trace_id")
    flt = source.filter(bucket.trace_ids) & (tid >= bucket.lo) & (tid <= bucket.hi)
    received = ds.field("received_unix_nano")
    if bucket.received_from is not None:
        flt = flt & (received >= bucket.received_from)
    if bucket.received_to is not None:
        flt = flt & (received <= bucket.received_to)
    return flt


def load_bucket(source: Source, bucket: Bucket) -> pa.Table:
    """Read the input columns of the spans of ``bucket``."""
    flt = bucket_filter(source, bucket)
    try:
        return source.dataset().to_table(columns=INPUT_COLUMNS, filter=flt)
    except FileNotFoundError:  # compaction swapped a partition after the plan listed it
        logger.info("a spans file went away during the build; listing again")
        return source.dataset(relist=True).to_table(columns=INPUT_COLUMNS, filter=flt)


def build_bucket(bucket: Bucket, source: Source, build_id: str, built_unix_nano: int, tolerance_ns: int,
                 spec: WorkflowSpec | None) -> tuple[pa.Table, pa.Table, pa.Table]:
    """traces, dag_nodes and dag_edges of the traces of ``bucket`` (one engine task)."""
    return reconstruct(load_bucket(source, bucket), build_id, built_unix_nano, tolerance_ns, spec)
