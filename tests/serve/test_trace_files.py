"""#31 a trace's reads name only the files that may hold it (``serve.tracefiles``): the row groups' trace id
filters never miss a trace's row, a rewritten file is read again, a vanished one plans the read again, a
filter not understood holds every trace, and a server just started reads the filters kept on disk."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tracedag.pipeline.serve import tracefiles
from tracedag.pipeline.serve.data import Store
from tracedag.pipeline.store.files import file_vanished, parquet_files
from tracedag.pipeline.store.parquet import write_atomic


def _ids_by_file(files: list[Path]) -> dict[Path, set[str]]:
    return {f: set(pq.read_table(f, columns=["trace_id"]).column(0).to_pylist()) for f in files}


def test_every_row_groups_filter_holds_its_traces_and_few_others(serve_store: Path) -> None:
    files = parquet_files(serve_store, "spans") + parquet_files(serve_store, "step_scores")
    others = [f"{random.Random(i).getrandbits(128):032x}" for i in range(500)]
    for f in files:
        pf = pq.ParquetFile(f)
        groups = tracefiles.read_groups(f)
        assert groups is not None and len(groups) == pf.num_row_groups
        for g, group in enumerate(groups):
            assert group.bits is not None, f"{f} row group {g}: no Bloom filter"
            ids = set(pf.read_row_group(g, columns=["trace_id"]).column(0).to_pylist())
            assert all(group.may_hold(t, tracefiles.trace_key(t)) for t in ids)
            false_hits = sum(tracefiles.bloom_may_hold(group.bits, tracefiles.trace_key(t)) for t in others)
            assert false_hits <= 25, f"{f} row group {g}: {false_hits} of 500 unknown ids pass"


def test_the_files_named_hold_every_row_of_the_trace(serve_store: Path) -> None:
    for table in ("spans", "dag_nodes", "dag_edges", "step_scores"):
        held = _ids_by_file(parquet_files(serve_store, table))
        for tid in sorted(set().union(*held.values())):
            named = set(tracefiles.files_holding(list(held), [tid]))
            assert {f for f, ids in held.items() if tid in ids} <= named, (table, tid)
        unknown = tracefiles.sources(serve_store, [table], ["f" * 32])
        assert unknown[table] is None or unknown[table].count("'") < 2 * len(held)


def test_a_rewritten_file_is_read_again(serve_store: Path, tmp_path: Path) -> None:
    src = parquet_files(serve_store, "spans")[0]
    copy = tmp_path / "copy.parquet"
    shutil.copy(src, copy)
    rows = pq.read_table(copy)
    first = rows.column("trace_id")[0].as_py()
    assert tracefiles.files_holding([copy], [first]) == [copy]
    kept = rows.filter(pc.not_equal(rows["trace_id"], first))
    write_atomic(kept.replace_schema_metadata(rows.schema.metadata), copy)  # same name, other size and time
    assert tracefiles.files_holding([copy], [first]) == []
    write_atomic(pa.table({"x": [1]}), copy)  # no trace_id column: may hold anything
    assert tracefiles.files_holding([copy], [first]) == [copy]


def test_a_vanished_file_plans_the_read_again(tmp_path: Path) -> None:
    gone = tmp_path / "gone.parquet"
    try:
        tracefiles.files_holding([gone], ["a" * 32])
    except FileNotFoundError as e:
        assert file_vanished(e)
    else:
        raise AssertionError("a missing file was named")


def test_a_filter_not_understood_holds_every_trace() -> None:
    assert tracefiles.bitset(b"") is None
    assert tracefiles.bitset(b"\x16\x40" + bytes(32)) is None  # not numBytes first
    assert tracefiles.bitset(b"\x15\x82\x01" + bytes(32)) is None  # 65 bytes: not whole blocks
    assert tracefiles.bitset(b"\x15\x80\x01" + bytes(31)) is None  # longer than the blob
    assert tracefiles.bitset(b"\x15\x40" + bytes(32)) == bytes(32)
    assert tracefiles.Group(None, None, None).may_hold("a", tracefiles.trace_key("a"))
    assert not tracefiles.Group("b", "c", None).may_hold("a", tracefiles.trace_key("a"))


def test_a_trace_reads_the_same_with_the_filters_kept_or_not(serve_store: Path) -> None:
    store = Store(serve_store)
    ids = sorted(store.trace_ids())[:4]
    tracefiles.KEPT.clear()
    first = {t: store.trace_json(t) for t in ids}
    again = Store(serve_store)  # a new connection, the filters kept
    assert {t: again.trace_json(t) for t in ids} == first


def _copy(serve_store: Path, tmp_path: Path) -> Path:
    data = tmp_path / "store"
    shutil.copytree(serve_store, data, ignore=shutil.ignore_patterns(tracefiles.KEPT_DIR))
    return data


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    read: list[Path] = []
    real = tracefiles.read_groups

    def counting(path: Path) -> tuple[tracefiles.Group, ...] | None:
        read.append(path)
        return real(path)
    monkeypatch.setattr(tracefiles, "read_groups", counting)
    return read


def test_a_server_just_started_reads_the_kept_filters_not_the_footers(serve_store: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    data = _copy(serve_store, tmp_path)
    read = _reads(monkeypatch)
    ids = sorted(Store(data).trace_ids())[:3]
    tracefiles.KEPT.clear()
    first = {t: Store(data).trace_json(t) for t in ids}
    tables = ("spans", "dag_nodes", "dag_edges", "step_scores")
    assert {p for p in read} == {f for t in tables for f in parquet_files(data, t)}  # each footer read once
    assert all(tracefiles.kept_path(data, t).is_file() for t in tables)
    read.clear()
    tracefiles.KEPT.clear()  # a server just started
    assert {t: Store(data).trace_json(t) for t in ids} == first
    assert read == []
    spans = parquet_files(data, "spans")[0]  # rewritten (same rows): its kept filters no longer count
    write_atomic(pq.read_table(spans), spans)
    tracefiles.KEPT.clear()
    assert Store(data).trace_json(ids[0]) == first[ids[0]]
    assert read == [spans]


def test_a_kept_file_not_readable_or_not_writable_is_passed_by(serve_store: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    data = _copy(serve_store, tmp_path)
    ids = sorted(Store(data).trace_ids())[:2]
    want = {t: Store(data).trace_json(t) for t in ids}
    kept = tracefiles.kept_path(data, "spans")
    kept.write_bytes(b"not an arrow file")
    tracefiles.KEPT.clear()
    read = _reads(monkeypatch)
    assert {t: Store(data).trace_json(t) for t in ids} == want
    assert set(parquet_files(data, "spans")) <= set(read)
    assert kept.read_bytes() != b"not an arrow file"  # written again
    for t in ("spans", "dag_nodes", "dag_edges", "step_scores"):
        tracefiles.kept_path(data, t).unlink()

    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied (a read-only mount)")
    monkeypatch.setattr(tracefiles.ipc, "new_file", refused)
    tracefiles.KEPT.clear()
    assert {t: Store(data).trace_json(t) for t in ids} == want
    assert not kept.exists() and not list(kept.parent.iterdir())


def test_the_warm_up_reads_the_filters_before_a_trace_is_asked(serve_store: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    data = _copy(serve_store, tmp_path)
    tracefiles.KEPT.clear()
    Store(data).warm()
    assert all(tracefiles.kept_path(data, t).is_file() for t in ("spans", "dag_nodes", "dag_edges", "step_scores"))
    read = _reads(monkeypatch)
    store = Store(data)
    tid = sorted(store.trace_ids())[0]
    store.trace_json(tid)
    assert read == []
    tracefiles.KEPT.clear()  # restarted: the warm-up reads the kept filters, no footer
    Store(data).warm()
    assert read == []


def test_many_traces_read_the_views(serve_store: Path) -> None:
    ids = [f"{i:032x}" for i in range(tracefiles.MAX_PICKED + 1)]
    assert tracefiles.sources(serve_store, ["spans"], ids) == {"spans": "spans_all"}
    assert tracefiles.sources(serve_store, ["spans"], ids[:1])["spans"] != "spans_all"
