"""The spool's on-disk format, shared by the writer (collector) and the reader (ingest).

``<data>/spool/`` holds segment files named ``seg-<20-digit sequence>.<state>``:
``.open`` while the collector appends to it, ``.sealed`` once closed (renamed, directory
fsynced). Only sealed segments are converted; after conversion a segment moves to
``spool/done/`` (kept for rebuilds, pruned by retention) or ``quarantine/`` when corrupt.

A segment is a sequence of records::

    magic   4 bytes  b"TDS1"
    length  u32 LE   payload length
    crc32   u32 LE   zlib.crc32 of received + payload
    received u64 LE  receive time, unix ns
    payload          serialized ExportTraceServiceRequest (protobuf; only the spans accepted)

A record whose header or payload runs past the end of the file is a torn tail: it was never
acknowledged (acks follow fsync) and is discarded with a warning. A record with a bad magic
or checksum before the end is corruption.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

MAGIC = b"TDS1"
_HEADER = struct.Struct("<4sIIQ")
HEADER_SIZE = _HEADER.size  # 20

DONE_RETENTION_SECONDS = 24 * 3600.0
"""How long converted segments stay in ``spool/done/`` by default (``--spool-retention``)."""

OPEN_SUFFIX = ".open"
SEALED_SUFFIX = ".sealed"
FILLING_SUFFIX = ".filling"
"""A file segment while ``tracedag ingest`` writes it (never converted; removed when abandoned)."""
FILE_TAG = "file"
"""Segments written by ``tracedag ingest`` (not by the collector) are named ``seg-<seq>.file.<state>``."""


def encode_header(payload: bytes, received_unix_nano: int) -> bytes:
    """Return the header of the record holding ``payload`` (write it followed by the payload)."""
    recv = struct.pack("<Q", received_unix_nano)
    crc = zlib.crc32(payload, zlib.crc32(recv))
    return _HEADER.pack(MAGIC, len(payload), crc, received_unix_nano)


def encode_record(payload: bytes, received_unix_nano: int) -> bytes:
    """Return one spool record (header + payload)."""
    return encode_header(payload, received_unix_nano) + payload


@dataclass(frozen=True)
class Record:
    """One decoded spool record."""

    offset: int
    received_unix_nano: int
    payload: bytes


@dataclass(frozen=True)
class SegmentTail:
    """How a segment ended: ``clean``, ``torn`` (partial last record) or ``corrupt`` at ``offset``."""

    state: Literal["clean", "torn", "corrupt"]
    offset: int  # end of the last good record


@dataclass(frozen=True)
class RecordRef:
    """Where one record of a segment file is: its header's offset, payload length and receive time."""

    offset: int
    length: int
    received_unix_nano: int


class CorruptRecord(ValueError):
    """A record's payload does not match its checksum (or the file changed under the reader)."""


def scan_headers(fd: int, size: int) -> list[RecordRef] | None:
    """Return the records of the segment file ``fd`` (``size`` bytes) from their headers alone, or
    None unless the headers tile the file exactly (a torn tail, a bad magic: read it whole instead).

    Payloads are neither read nor checked here: ``read_payload`` checks each one as it is loaded,
    so a segment is converted with one chunk's payloads in memory rather than the whole file.
    """
    refs: list[RecordRef] = []
    pos = 0
    while pos + HEADER_SIZE <= size:
        magic, length, _crc, received = _HEADER.unpack(os.pread(fd, HEADER_SIZE, pos))
        if magic != MAGIC or pos + HEADER_SIZE + length > size:
            return None
        refs.append(RecordRef(pos, length, received))
        pos += HEADER_SIZE + length
    return refs if pos == size else None


def read_payload(fd: int, ref: RecordRef) -> bytes:
    """Read the payload of ``ref`` from ``fd`` and check it against the header's checksum."""
    header = os.pread(fd, HEADER_SIZE, ref.offset)
    if len(header) != HEADER_SIZE:
        raise CorruptRecord(f"record at {ref.offset}: file shorter than at the scan")
    magic, length, crc, received = _HEADER.unpack(header)
    payload = os.pread(fd, ref.length, ref.offset + HEADER_SIZE)
    if (magic, length, received, len(payload)) != (MAGIC, ref.length, ref.received_unix_nano, ref.length):
        raise CorruptRecord(f"record at {ref.offset}: header changed since the scan")
    if zlib.crc32(payload, zlib.crc32(struct.pack("<Q", received))) != crc:
        raise CorruptRecord(f"record at {ref.offset}: checksum mismatch")
    return payload


def read_records(data: bytes) -> tuple[list[Record], SegmentTail]:
    """Decode every intact record of a segment's bytes and report how it ended."""
    records: list[Record] = []
    pos = 0
    for rec in _iter(data):
        records.append(rec)
        pos = rec.offset + HEADER_SIZE + len(rec.payload)
    if pos == len(data):
        return records, SegmentTail("clean", pos)
    return records, SegmentTail(_classify_rest(data, pos), pos)


def _iter(data: bytes) -> Iterator[Record]:
    pos = 0
    while pos + HEADER_SIZE <= len(data):
        magic, length, crc, received = _HEADER.unpack_from(data, pos)
        end = pos + HEADER_SIZE + length
        if magic != MAGIC or end > len(data):
            return
        payload = data[pos + HEADER_SIZE : end]
        if zlib.crc32(payload, zlib.crc32(struct.pack("<Q", received))) != crc:
            return
        yield Record(pos, received, payload)
        pos = end


def _classify_rest(data: bytes, pos: int) -> Literal["torn", "corrupt"]:
    """A short header or a payload cut by end of file is torn; anything else is corrupt."""
    rest = len(data) - pos
    if rest < HEADER_SIZE:
        return "torn" if MAGIC.startswith(data[pos : pos + 4][: min(rest, 4)]) else "corrupt"
    magic, length, _crc, _recv = _HEADER.unpack_from(data, pos)
    if magic == MAGIC and pos + HEADER_SIZE + length > len(data):
        return "torn"
    return "corrupt"


def segment_name(seq: int, suffix: str) -> str:
    """Return the file name of segment ``seq`` in the given state."""
    return f"seg-{seq:020d}{suffix}"


def file_segment_name(seq: int, suffix: str) -> str:
    """Return the file name of segment ``seq`` written from a dump file (``tracedag ingest``)."""
    return f"seg-{seq:020d}.{FILE_TAG}{suffix}"


def segment_stem(path: Path) -> str:
    """The batch id of a segment's spans: ``seg-<seq>``, or ``seg-<seq>-file`` for a file segment."""
    parts = path.name.split(".")
    return f"{parts[0]}-{FILE_TAG}" if len(parts) > 2 and parts[1] == FILE_TAG else parts[0]


def segment_seq(path: Path) -> int:
    """Return the sequence number of a segment file."""
    return int(path.name.split(".")[0].split("-")[1])
