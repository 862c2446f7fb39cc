"""Every path of a data directory, named once; the collector and every stage take them from here.

``<data>/``
    ``spool/``                  raw OTLP batches, the source of truth: ``seg-N.open`` (the
                                collector appends), ``seg-N.sealed`` (ready to convert)
    ``spool/done/``             converted segments, kept ``--spool-retention`` hours for rebuilds
    ``spool/failed/``           segments that failed conversion repeatedly, with ``.exception`` notes
    ``tables/<table>/``         Parquet files of each table (spans and evaluations in
                                ``recv_hour=`` partitions; derived tables by build generation)
    ``state/``                  locks and the small files that make stages incremental
    ``quarantine/``             corrupt spool segments and Parquet files, kept for inspection
    ``pictures/``, ``graphs/``  what ``tracedag demo`` and ``determinism`` draw and write
    ``reports/``                the JSON result of each ``tracedag regress`` run
                                (``regress-<UTC time>-<hash>.json``), listed by ``tracedag serve``

Readers glob ``tables/<table>/**/*.parquet``; writers write ``<name>.parquet.tmp`` and rename.
"""

from __future__ import annotations

from pathlib import Path

SPOOL = "spool"
TABLES = "tables"
STATE = "state"
QUARANTINE = "quarantine"
PICTURES = "pictures"
GRAPHS = "graphs"
REPORTS = "reports"
TOP_LEVEL = frozenset({SPOOL, TABLES, STATE, QUARANTINE, PICTURES, GRAPHS, REPORTS})
"""The folders a data directory may hold (``tracedag demo`` only wipes a directory made of these)."""

# locks in state/: each is an exclusive flock held by one process at a time
COLLECTOR_LOCK = "collector.lock"  # the running collector (one per data directory)
INGEST_LOCK = "ingest.lock"  # the spans writers' commit lock (converters, tracedag ingest)
COMPACT_LOCK = "compact.lock"  # one compaction at a time
BUILD_LOCK = "build.lock"  # one DAG build (and derived-table GC) at a time
SCORE_LOCK = "score.lock"  # one scoring run at a time
JUDGE_LOCK = "judge.lock"  # one live judge round at a time (tracedag collect --build with a judge)


def is_store(data: Path) -> bool:
    """Whether ``data`` is a data directory tracedag wrote (it holds a spool, tables or state)."""
    return data.is_dir() and any((data / name).is_dir() for name in (SPOOL, TABLES, STATE))


def spool_dir(data: Path) -> Path:
    """``<data>/spool``: open and sealed segments."""
    return data / SPOOL


def spool_done_dir(data: Path) -> Path:
    """``<data>/spool/done``: converted segments kept for rebuilds."""
    return data / SPOOL / "done"


def spool_failed_dir(data: Path) -> Path:
    """``<data>/spool/failed``: segments that kept failing conversion."""
    return data / SPOOL / "failed"


def quarantine_dir(data: Path) -> Path:
    """``<data>/quarantine``: corrupt segments and files."""
    return data / QUARANTINE


def tables_dir(data: Path) -> Path:
    """``<data>/tables``: every table's Parquet files."""
    return data / TABLES


def table_dir(data: Path, table: str) -> Path:
    """``<data>/tables/<table>``."""
    return data / TABLES / table


def state_dir(data: Path) -> Path:
    """``<data>/state``: locks and incremental state."""
    return data / STATE


MERGED_FROM_KEY = b"tracedag.merged_from"
"""Footer key of a compaction's merged spans file: the JSON list of the file names it merged (a build
plan that saw all of them knows the file brings no new span)."""


def state_file(data: Path, name: str) -> Path:
    """``<data>/state/<name>``: a lock (one of the ``*_LOCK`` names), a converter's metrics text, the
    judge's answer cache."""
    return data / STATE / name



def spans_generation_file(data: Path) -> Path:
    """Changes whenever spans files are added (writers refresh their dedupe index)."""
    return data / STATE / "spans.generation"


def spans_epoch_file(data: Path) -> Path:
    """Changes whenever spans files are replaced by a compaction (writers reload their index)."""
    return data / STATE / "spans.epoch"


def converter_stage_dir(data: Path, shard: int) -> Path:
    """Where converter ``shard`` stages a segment's Parquet before committing it."""
    return data / STATE / f"convert-{shard}"


def ingest_stage_dir(data: Path, pid: int) -> Path:
    """Where the ``tracedag ingest`` process ``pid`` stages its segments' Parquet before committing it."""
    return data / STATE / f"ingest-{pid}"


def compact_staging_dir(data: Path) -> Path:
    """Where a compaction writes its merged files before the directory exchange."""
    return data / STATE / "compact"


def build_state_file(data: Path) -> Path:
    """The DAG builder's incremental state (what was built up to which receive time)."""
    return data / STATE / "build.json"


def build_tmp_dir(data: Path, build_id: str) -> Path:
    """Where one build writes its derived files before they are swapped in."""
    return data / STATE / "build-tmp" / build_id


def build_inflight_dir(data: Path) -> Path:
    """Markers of builds in progress (the GC keeps their inputs)."""
    return data / STATE / "build-inflight"


def dag_gc_dir(data: Path) -> Path:
    """The derived-table garbage collector's working files."""
    return data / STATE / "dag-gc"


def pictures_dir(data: Path) -> Path:
    """``<data>/pictures``: SVG pictures of agent graphs."""
    return data / PICTURES


def graphs_dir(data: Path) -> Path:
    """``<data>/graphs``: agent graphs written by the demo."""
    return data / GRAPHS


def reports_dir(data: Path) -> Path:
    """``<data>/reports``: saved ``tracedag regress`` results, one JSON file per run."""
    return data / REPORTS
