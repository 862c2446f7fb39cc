"""The child process of ``POST /api/sql``: one checked SELECT over a locked-down connection.

Run as ``python -m tracedag.pipeline.serve.sqlworker DATA``. It imports DuckDB and makes the
views, writes ``READY`` to stderr, then waits for one JSON request on stdin, so a spare worker can
be started ahead of the request. It checks the SQL with the guard (``CHECKED`` on stderr when it
passes: the parent kills a worker whose check outlasts its check deadline, so no parse ever runs
in the server), then runs it. The parent (``sqlproc``) has already capped the address space
(``RLIMIT_AS``) and kills the worker at the deadline; DuckDB's own limits (memory, threads, the
spill directory the parent made, of bounded size) are set before the configuration is locked.
The answer is encoded here, bounded in rows and bytes (``answer``), and written to stdout as it
is made; the last stderr line is JSON: ``{"rows", "truncated"}`` with exit status 0, or
``{"error", "kind"}`` with exit status 3.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, BinaryIO

import duckdb
import pyarrow as pa
import sqlglot

from tracedag import queries
from tracedag.pipeline.serve.answer import BATCH_ROWS, Bounds, Written, write_answer
from tracedag.pipeline.serve.sqlguard import Catalog, catalog, check
from tracedag.pipeline.serve.sqlproc import CHECKED, CHECKING, READY
from tracedag.pipeline.serve.statekey import state_key
from tracedag.pipeline.store import shared_macros
from tracedag.pipeline.store.files import VANISHED_ATTEMPTS, file_vanished, vanished_pause, write_all
from tracedag.pipeline.store.query_macros import create_query_macros
from tracedag.pipeline.store.sandbox import lock_down
from tracedag.pipeline.store.views import connect
from tracedag.queries import macros
from tracedag.schemas.errors import QueryFailed

FAILED = 3


def _limits(con: duckdb.DuckDBPyConnection, request: dict[str, Any], temp: str) -> None:
    con.execute(f"set threads = {int(request.get('threads', 1))}")
    con.execute(f"set memory_limit = '{int(request.get('memory_mb', 512))}MB'")
    con.execute(f"set temp_directory = '{temp}'")
    con.execute(f"set max_temp_directory_size = '{int(request.get('temp_mb', 256))}MB'")
    con.execute("set enable_progress_bar = false")


def _say(line: bytes) -> None:
    sys.stderr.buffer.write(line)
    sys.stderr.buffer.flush()


def run(data: Path, request: dict[str, Any], out: BinaryIO, con: duckdb.DuckDBPyConnection | None = None,
        ) -> Written:
    """Run SQL the guard passed on a locked-down connection, its answer encoded into ``out`` within bounds.

    ``con``: a connection with the views already made (by a spare worker), else one is opened.
    ``request``: ``sql``, ``format``, ``max_rows``, ``max_bytes``, ``truncate``, ``spill`` (the spill
    directory, made and removed by the parent) and DuckDB's limits.
    """
    bounds = Bounds(int(request.get("max_rows", 10_000)), int(request.get("max_bytes", 8 << 20)),
                    bool(request.get("truncate", False)))
    sink = _Held(out)
    for attempt in range(1, VANISHED_ATTEMPTS + 1):
        if con is None:  # a fresh plan: the views list the files there are now
            con = connect(data, threads=int(request.get("threads", 1)))
        try:
            _limits(con, request, str(request["spill"]))
            create_query_macros(con, str(request["sql"]))  # the named queries it calls (the spare declared them)
            lock_down(con, data)
            reader = con.sql(str(request["sql"])).to_arrow_reader(BATCH_ROWS)
            written = write_answer(reader, str(request.get("format", "json")), bounds, sink)
            sink.release()
            return written
        except duckdb.IOException as e:
            # a GC or compaction swap removed a file this plan listed: plan again, unless bytes went out
            if attempt == VANISHED_ATTEMPTS or not file_vanished(e) or not sink.restart():
                raise
            vanished_pause(attempt)
        finally:
            con.close()
            con = None
    raise AssertionError("unreachable")

HOLD_BYTES = 64 * 1024


class _Held:
    """``out``, holding back the first ``HOLD_BYTES`` of an answer: until they go out, a failed plan can be re-run."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.held = bytearray()
        self.sent = False

    def write(self, data: bytes) -> int:
        if self.sent:
            return write_all(self.out, data)
        self.held += data
        if len(self.held) > HOLD_BYTES:
            self.release()
        return len(data)

    def release(self) -> None:
        """Send what is held; from now on every write goes straight out."""
        write_all(self.out, bytes(self.held))
        self.held, self.sent = bytearray(), True

    def restart(self) -> bool:
        """Drop what is held for a new attempt; False when part of the answer already went out."""
        self.held = bytearray()
        return not self.sent


def _refuse(reason: str, kind: str) -> None:
    _say(json.dumps({"error": reason, "kind": kind, "again": True}).encode() + b"\n")


class _Spare:
    """The worker's connection while it waits, made again when the store changed since it was made."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.state = state_key(data)
        self.con: duckdb.DuckDBPyConnection = connect(data, declare_macros=True, private=True)  # run() locks it
        self._names: Catalog | None = None

    def fresh(self) -> duckdb.DuckDBPyConnection:
        if state_key(self.data) != self.state:
            self.con.close()
            self.state, self.con = state_key(self.data), connect(self.data, declare_macros=True, private=True)
            self._names = None
        return self.con

    def names(self) -> Catalog:
        """The views and macros of the connection (``fresh()`` first): read once per connection, at the start
        and again for the request cost ~45 ms CPU of each ``POST /api/sql``."""
        con = self.fresh()
        if self._names is None:
            self._names = catalog(con)
        return self._names


def _next_checked(spare: _Spare) -> dict[str, Any] | None:
    """The next request (one JSON line) whose SQL the guard passes; refused ones are answered here."""
    for line in sys.stdin.buffer:
        request: dict[str, Any] = json.loads(line)
        try:
            names = spare.names()  # the views and macros of this store
            _say(CHECKING)
            check(str(request["sql"]), names)
        except QueryFailed as e:
            _refuse(e.reason, type(e).__name__)  # nothing ran: this worker stays the spare
            continue
        _say(CHECKED)
        return request
    return None


def _answer(spare: _Spare, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Run the checked request, its answer on stdout; the exit status and the last line for stderr."""
    try:
        written = run(spare.data, request, sys.stdout.buffer, spare.con)
    except QueryFailed as e:
        return FAILED, {"error": e.reason, "kind": type(e).__name__}
    except (duckdb.Error, pa.ArrowException, AttributeError, OSError) as e:  # OSError: DuckDB's Arrow export
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return FAILED, {"error": first, "kind": "QueryFailed", "memory": "out of memory" in first.lower()}
    except MemoryError:
        return FAILED, {"error": "out of memory", "kind": "QueryFailed", "memory": True}
    return 0, {"rows": written.rows, "truncated": written.truncated}


def preload() -> None:
    """Load, without a connection, what a worker's first connection and parse load: the named queries' macro texts
    and the shared macros' names (files read once a process), the DuckDB dialect's tokenizer and parser. The
    fork-server (``forkserver``) does it once for all its workers (~20 ms CPU a worker)."""
    sqlglot.parse_one("select 1 as n from t where n > 0", read="duckdb")
    for name in queries.names():  # the named queries' macros (read once a process)
        macros.build(name)
    shared_macros.shared_macro_names()


def main(argv: list[str]) -> int:
    """Serve one request, then end at once: stdout closed first (the parent's end of the answer), the
    last line on stderr, and no interpreter shutdown (DuckDB's and Arrow's threads took about a second)."""
    spare = _Spare(Path(argv[1]))
    check("select 1", spare.names())  # the parser's first use loads its dialect: done before the clock runs
    _say(READY)
    request = _next_checked(spare)
    if request is None:
        return 0
    code, last = _answer(spare, request)
    sys.stdout.buffer.flush()
    os.close(sys.stdout.fileno())
    _say(json.dumps(last).encode() + b"\n")
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
