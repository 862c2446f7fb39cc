"""Saved regression reports: each ``tracedag regress`` run's JSON result kept in the store.

``<data>/reports/regress-<UTC time>-<hash>.json``: the time is ``YYYYmmddTHHMMSSZ`` (names sort by
time), the hash the first 8 hex digits of a BLAKE2b of the JSON text (two runs in one second get two
files). Written atomically (``.tmp``, fsync, rename, directory fsync); read back by ``tracedag serve``
and ``tracedag report``. A name is accepted only when it matches ``NAME`` exactly, so no request can
reach a path outside the folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tracedag.pipeline.store.manifests import sync_reports
from tracedag.schemas.errors import TracedagError
from tracedag.schemas.fsio import fsync_dir
from tracedag.schemas.layout import reports_dir

NAME = re.compile(r"regress-(\d{8}T\d{6}Z)-([0-9a-f]{8})")


class BadReportName(TracedagError):  # type: ignore[misc,unused-ignore]
    """Not the name of a saved report (``regress-<UTC time>-<hash>``)."""


class NoSuchReport(TracedagError):  # type: ignore[misc,unused-ignore]
    """A well-formed name with no saved report."""


def save_report(data: Path, json_text: str, now: datetime | None = None) -> Path:
    """Write ``json_text`` (``report.to_json``) as a new report of the store at ``data``; its path."""
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    digest = hashlib.blake2b(json_text.encode(), digest_size=4).hexdigest()
    folder = reports_dir(data)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"regress-{stamp}-{digest}.json"
    tmp = final.with_name(final.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json_text)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, final)
    fsync_dir(folder)
    return final


def report_path(data: Path, name: str) -> Path:
    """The file of report ``name`` (with or without ``.json``); ``BadReportName``/``NoSuchReport``."""
    stem = name.removesuffix(".json")
    if not NAME.fullmatch(stem):
        raise BadReportName(f"{name!r} is not a report name (regress-<UTC time>-<hash>; GET /api/regressions lists them)")
    path = reports_dir(data) / f"{stem}.json"
    if not path.is_file():
        sync_reports(data)  # an object store: another machine may have saved it
    if not path.is_file():
        raise NoSuchReport(f"no saved report {stem!r} (GET /api/regressions lists them)")
    return path


def read_report(data: Path, name: str) -> dict[str, Any]:
    """The saved JSON document of report ``name``."""
    doc: dict[str, Any] = json.loads(report_path(data, name).read_text(encoding="utf-8"))
    return doc


def _time(stamp: str) -> str:
    return datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).isoformat().replace("+00:00", "Z")


def summary(name: str, doc: dict[str, Any]) -> dict[str, Any]:
    """One list row: name, time, the two selectors, verdict, exit code and the alert counts."""
    match = NAME.fullmatch(name)
    metrics = doc.get("metrics") or []
    return {
        "name": name,
        "time": _time(match.group(1)) if match else None,
        "baseline": (doc.get("baseline") or {}).get("selector"),
        "candidate": (doc.get("candidate") or {}).get("selector"),
        "verdict": doc.get("verdict"),
        "exit_code": doc.get("exit_code"),
        "fail": sum(1 for m in metrics if m.get("status") == "fail"),
        "warn": sum(1 for m in metrics if m.get("status") == "warn"),
        "metrics": len(metrics),
    }


def list_reports(data: Path) -> list[dict[str, Any]]:
    """Every saved report's ``summary``, newest first; unreadable files are skipped."""
    sync_reports(data)  # an object store: the reports every writer published
    folder = reports_dir(data)
    if not folder.is_dir():
        return []
    rows = []
    for path in sorted(folder.glob("regress-*.json"), reverse=True):
        if not NAME.fullmatch(path.stem):
            continue
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            rows.append(summary(path.stem, doc))
    return rows
