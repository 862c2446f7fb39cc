"""The spool writer: group commit, sealing, recovery of torn and corrupt segments, I/O errors."""

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from tracedag.collector import spool as spool_mod
from tracedag.collector.spool import SpoolUnavailable, SpoolWriter
from tracedag.collector.spoolfmt import encode_record, read_records


def _records(data: Path, suffix: str = ".sealed") -> list[bytes]:
    out = []
    for path in sorted((data / "spool").glob(f"*{suffix}")):
        recs, tail = read_records(path.read_bytes())
        assert tail.state == "clean", path
        out += [r.payload for r in recs]
    return out


def test_concurrent_appends_share_fsyncs_and_all_are_sealed(tmp_path):
    w = SpoolWriter(tmp_path)
    before = spool_mod._GROUP.count()
    payloads = [f"p{i}".encode() * 50 for i in range(200)]

    def worker(chunk):
        for p in chunk:
            w.append(p, time.time_ns())

    threads = [threading.Thread(target=worker, args=(payloads[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    syncs = spool_mod._GROUP.count() - before
    w.close()
    assert sorted(_records(tmp_path)) == sorted(payloads)
    assert syncs < len(payloads)  # group commit: fewer fsyncs than records
    assert not list((tmp_path / "spool").glob("*.open"))


def test_segments_seal_by_size_and_age(tmp_path):
    w = SpoolWriter(tmp_path, segment_bytes=1000, seal_age=0.2)
    w.start(0.05)
    for _ in range(7):
        w.append(b"x" * 400, 1)
    sealed = list((tmp_path / "spool").glob("*.sealed"))
    assert len(sealed) >= 2  # size-based
    deadline = time.time() + 3
    while list((tmp_path / "spool").glob("*.open")) and time.time() < deadline:
        time.sleep(0.05)
    assert not list((tmp_path / "spool").glob("*.open"))  # age-based
    w.close()
    assert len(_records(tmp_path)) == 7


def test_no_segment_without_data(tmp_path):
    w = SpoolWriter(tmp_path)
    w.flush()
    w.close()
    assert list((tmp_path / "spool").iterdir()) == []


def test_recovery_truncates_torn_tail(tmp_path, caplog):
    spool = tmp_path / "spool"
    spool.mkdir()
    good = encode_record(b"good", 5) + encode_record(b"good2", 6)
    (spool / "seg-00000000000000000007.open").write_bytes(good + encode_record(b"torn-away", 7)[:-3])
    w = SpoolWriter(tmp_path)
    w.append(b"after", 8)
    w.close()
    assert _records(tmp_path) == [b"good", b"good2", b"after"]
    assert "torn tail" in caplog.text


def test_recovery_quarantines_corrupt_segment_keeps_intact_prefix(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    bad = bytearray(encode_record(b"second", 2))
    bad[-1] ^= 0xFF  # checksum mismatch, not at a torn end
    raw = encode_record(b"first", 1) + bytes(bad) + encode_record(b"third", 3)
    (spool / "seg-00000000000000000003.open").write_bytes(raw)
    before = spool_mod._QUARANTINED.value()
    SpoolWriter(tmp_path).close()
    assert _records(tmp_path) == [b"first"]
    assert (tmp_path / "quarantine" / "seg-00000000000000000003.open").read_bytes() == raw
    assert spool_mod._QUARANTINED.value() == before + 1


def test_new_segments_sort_after_existing_ones(tmp_path):
    (tmp_path / "spool" / "done").mkdir(parents=True)
    far = 10**19
    (tmp_path / "spool" / "done" / f"seg-{far:020d}.sealed").write_bytes(b"")
    w = SpoolWriter(tmp_path)
    w.append(b"x", 1)
    w.close()
    (sealed,) = (tmp_path / "spool").glob("*.sealed")
    assert int(sealed.name[4:24]) > far


def test_enospc_fails_the_group_then_recovers(tmp_path, monkeypatch):
    w = SpoolWriter(tmp_path)
    w.append(b"acked", 1)
    real_fdatasync = os.fdatasync
    state = {"full": True}

    def fdatasync(fd):
        if state["full"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fdatasync(fd)

    monkeypatch.setattr(spool_mod.os, "fdatasync", fdatasync)
    with pytest.raises(SpoolUnavailable, match="disk full"):
        w.append(b"not-acked", 2)
    assert w.error and "disk full" in w.error
    state["full"] = False
    w.append(b"acked-again", 3)
    assert w.error is None
    w.close()
    assert _records(tmp_path) == [b"acked", b"acked-again"]


def test_a_segment_is_sealed_when_it_comes_of_age_not_at_the_next_tick(tmp_path):
    w = SpoolWriter(tmp_path, seal_age=0.2)
    w.start(3.0)
    try:
        time.sleep(0.1)  # the sealer is asleep in its 3 s tick when the segment opens
        opened = time.monotonic()
        w.append(b"x" * 100, 1)
        while not list((tmp_path / "spool").glob("*.sealed")) and time.monotonic() - opened < 10:
            time.sleep(0.02)
        assert time.monotonic() - opened < 2.5  # the tick was shortened to the segment's age
    finally:
        w.close()
    assert len(_records(tmp_path)) == 1


def _sealed_within(data: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not list((data / "spool").glob("*.sealed")):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_segment_is_sealed_early_only_while_no_sealed_segment_waits(tmp_path):
    w = SpoolWriter(tmp_path, seal_age=60.0, early_seal_age=0.2)
    w.start(0.05)
    try:
        w.append(b"a" * 100, 1)
        assert _sealed_within(tmp_path, 10)  # the converters are idle (nothing sealed): sealed at 0.2 s, not 60 s
        w.append(b"b" * 100, 1)  # the first segment is not converted: a backlog
        time.sleep(1.0)
        assert len(list((tmp_path / "spool").glob("*.sealed"))) == 1
        assert list((tmp_path / "spool").glob("*.open"))  # waits for its full age
        for path in (tmp_path / "spool").glob("*.sealed"):
            path.rename(path.with_suffix(".done"))  # converted
        assert _sealed_within(tmp_path, 10)
    finally:
        w.close()
