"""The judge cache: ``<data>/state/judge_cache.sqlite``, keyed by (rubric version, model, inputs).

Only validated verdicts are stored, so a rerun over the same steps costs nothing while a step
whose judging failed is asked again.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any


def cache_key(rubric_tag: str, model: str, messages: list[dict[str, str]]) -> str:
    """sha256 over the rubric version, the judge model and the exact messages sent."""
    blob = json.dumps([rubric_tag, model, messages], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class JudgeCache:
    """A small thread-safe key-value store in SQLite."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("pragma journal_mode=wal")
        self._db.execute(
            "create table if not exists verdicts (key text primary key, rubric text, model text, "
            "value text not null, created_unix_nano integer)"
        )

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored verdict for ``key``, or None."""
        with self._lock:
            row = self._db.execute("select value from verdicts where key = ?", (key,)).fetchone()
        if row is None:
            return None
        value: dict[str, Any] = json.loads(row[0])
        return value

    def put(self, key: str, rubric: str, model: str, value: dict[str, Any]) -> None:
        """Store a validated verdict."""
        with self._lock:
            self._db.execute(
                "insert or replace into verdicts values (?, ?, ?, ?, ?)",
                (key, rubric, model, json.dumps(value, ensure_ascii=False), time.time_ns()),
            )

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()
