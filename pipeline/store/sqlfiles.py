"""What the ``.sql`` files of the queries package say, read again only when one of them changes.

A trace's first view asks the SQL definitions' hash (``materialized.definitions_hash``) and each stored query's
header (``queries.describe``) several times; reading the files through ``importlib.resources`` costs ~4 ms CPU per
hash and ~1.5 ms per header. The answers are remembered by the files' stamp (each one's name, size and modification
time), so an edited or added file is read again; a package that is not plain files (a zip) is read each time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

from tracedag import queries

_T = TypeVar("_T")
Stamp = tuple[tuple[str, int, int], ...]
_KEPT: dict[tuple[Stamp, str], object] = {}
_MOST = 256


def stamp() -> Stamp:
    """The ``.sql`` files of the queries package (name, size, mtime); () when they are not plain files."""
    try:
        with os.scandir(Path(queries.__file__).parent) as found:
            return tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns)
                                for e in found if e.name.endswith(".sql")))
    except (OSError, TypeError):  # a package in a zip (no __file__ directory)
        return ()


def remembered(key: str, compute: Callable[[], _T]) -> _T:
    """``compute()``, remembered under ``key`` while the ``.sql`` files are as they are (``stamp``)."""
    now = stamp()
    if not now:
        return compute()
    if (now, key) not in _KEPT:
        if len(_KEPT) >= _MOST or any(kept != now for kept, _ in _KEPT):  # a file changed: every answer is old
            _KEPT.clear()
        _KEPT[(now, key)] = compute()
    return cast(_T, _KEPT[(now, key)])


def described(name: str) -> queries.QueryDoc:
    """``queries.describe(name)``, remembered while the ``.sql`` files are as they are."""
    return remembered(f"describe {name}", lambda: queries.describe(name))
