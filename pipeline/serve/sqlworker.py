"""The child process of ``POST /api/sql``: one checked SELECT over a locked-down connection.

Run as ``python -m tracedag.pipeline.serve.sqlworker DATA``. It imports DuckDB and makes the
views, then waits for one JSON request on stdin (``sql``, ``max_rows``, ``threads``, ``memory_mb``, ``temp_mb``), so a
spare worker can be started ahead of the request. The parent (``sqlproc``) has already capped
the address space (``RLIMIT_AS``) and kills the worker at the deadline; DuckDB's own limits
(memory, threads, a private spill directory of bounded size) are set before the configuration
is locked. The answer on stdout is an Arrow IPC stream of at most ``max_rows`` rows, with
``truncated`` in the schema metadata; a failure is one JSON line on stderr and exit status 3.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from tracedag.pipeline.serve.data import state_key
from tracedag.pipeline.serve.sqlguard import catalog, check
from tracedag.pipeline.store.sandbox import lock_down
from tracedag.pipeline.store.views import connect
from tracedag.schemas.errors import QueryFailed

FAILED = 3


def _limits(con: duckdb.DuckDBPyConnection, request: dict[str, Any], temp: str) -> None:
    con.execute(f"set threads = {int(request.get('threads', 1))}")
    con.execute(f"set memory_limit = '{int(request.get('memory_mb', 512))}MB'")
    con.execute(f"set temp_directory = '{temp}'")
    con.execute(f"set max_temp_directory_size = '{int(request.get('temp_mb', 256))}MB'")
    con.execute("set enable_progress_bar = false")


def run(data: Path, request: dict[str, Any], con: duckdb.DuckDBPyConnection | None = None) -> pa.Table:
    """Check the SQL again, then run it on a locked-down connection; at most ``max_rows`` + marker.

    ``con``: a connection with the views already made (by a spare worker), else one is opened.
    """
    sql = str(request["sql"])
    con = con or connect(data, threads=int(request.get("threads", 1)))
    check(sql, catalog(con))  # the views and macros of this store (analysis outputs included)
    max_rows = int(request.get("max_rows", 10_000))
    with tempfile.TemporaryDirectory(prefix="tracedag-sql-") as temp:
        try:
            _limits(con, request, temp)
            lock_down(con, data)
            reader = con.sql(sql).to_arrow_reader(min(max_rows + 1, 65_536))
            batches: list[pa.RecordBatch] = []
            rows = 0
            for batch in reader:
                batches.append(batch)
                rows += batch.num_rows
                if rows > max_rows:
                    break
            table = pa.Table.from_batches(batches, schema=reader.schema)
        finally:
            con.close()
    truncated = table.num_rows > max_rows
    table = table.slice(0, max_rows)
    meta = {b"truncated": b"true" if truncated else b"false"}
    return table.replace_schema_metadata(meta)


def main(argv: list[str]) -> int:
    data = Path(argv[1])
    state = state_key(data)
    con = connect(data)  # made while the worker waits as the spare; made again if the store changed since
    request = json.loads(sys.stdin.buffer.read() or b"{}")
    if state_key(data) != state:
        con.close()
        con = connect(data)
    try:
        table = run(data, request, con)
    except QueryFailed as e:
        sys.stderr.write(json.dumps({"error": e.reason}) + "\n")
        return FAILED
    except (duckdb.Error, pa.ArrowException, AttributeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        sys.stderr.write(json.dumps({"error": first}) + "\n")
        return FAILED
    except MemoryError:
        sys.stderr.write(json.dumps({"error": "out of memory", "memory": True}) + "\n")
        return FAILED
    with pa.ipc.new_stream(sys.stdout.buffer, table.schema) as writer:
        writer.write_table(table)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
