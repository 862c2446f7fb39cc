"""CLI commands: serve (HTTP API, web UI, /metrics) and report (one self-contained HTML file)."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from tracedag.pipeline.commands._options import data_option

_F = TypeVar("_F", bound=Callable[..., Any])


def _with_data(f: _F) -> _F:
    """The shared ``--data`` option, typed for mypy --strict."""
    option: Callable[[_F], _F] = data_option
    return option(f)


def is_loopback(host: str) -> bool:
    """True when ``host`` only listens on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token(path: Path | None, host: str) -> str | None:
    """The bearer token from ``path``; required unless ``host`` is a loopback address."""
    if path is None:
        if not is_loopback(host):
            raise click.UsageError(f"--host {host} listens beyond this machine: give --token-file (a file "
                                   "holding the bearer token clients must send)")
        return None
    token = path.read_bytes().strip().decode("ascii", errors="replace")
    if not all(" " < c < "\x7f" for c in token):
        raise click.UsageError(f"{path}: the token must be printable ASCII without spaces (an HTTP header "
                               "carries it; no client could send this one)")
    if len(token) < 16:
        raise click.UsageError(f"{path}: the token must be at least 16 characters")
    return token


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs --token-file.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option("--token-file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="File holding the bearer token every request must carry (Authorization: Bearer ...).")
@click.option("--allowed-host", multiple=True, metavar="NAME[:PORT]",
              help="Without a token, a further Host name to answer as (besides 127.0.0.1, localhost and [::1] "
                   "at --port); other names get 421, cross-site POSTs 403. Repeatable.")
@click.option("--sql-timeout", default=10.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds a POST /api/sql query may take (the guard's check included, counted from when its "
                   "worker is ready) before the worker is killed (408).")
@click.option("--sql-memory-mb", default=1024, show_default=True, type=click.IntRange(min=64),
              help="DuckDB memory limit of a SQL worker (its address space is capped 1.5 GB above).")
@click.option("--sql-max-rows", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="Rows a POST /api/sql answer holds at most (then truncated: true).")
@click.option("--sql-max-bytes", default=8 << 20, show_default=True, type=click.IntRange(min=1024),
              help="Bytes a POST /api/sql answer holds at most: larger is 413, or the rows that fit with "
                   "?truncate=1 (truncated: true).")
@click.option("--sql-check-timeout", default=2.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds the SQL guard may take to check one statement (then 400).")
@click.option("--header-timeout", default=10.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds a client has to send a request's head (then 408 and the connection is closed).")
@click.option("--body-timeout", default=30.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds a client has to send a request's body after its head (then 408, closed).")
@click.option("--idle-timeout", default=5.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds a keep-alive connection may stay silent between requests.")
@click.option("--max-connections", default=512, show_default=True, type=click.IntRange(min=1),
              help="Connections open at once; more get 503 and are closed at once.")
@_with_data
def serve_command(host: str, port: int, token_file: Path | None, allowed_host: tuple[str, ...],
                  sql_timeout: float, sql_memory_mb: int,
                  sql_max_rows: int, sql_max_bytes: int, sql_check_timeout: float, header_timeout: float,
                  body_timeout: float, idle_timeout: float, max_connections: int, data: Path) -> None:
    """Serve the store read-only: HTTP API, web UI at /, Prometheus /metrics, sandboxed SQL."""
    from tracedag.pipeline.serve.app import create_app
    from tracedag.pipeline.serve.conns import ConnLimits
    from tracedag.pipeline.serve.hostcheck import HostPolicy, allowed_hosts
    from tracedag.pipeline.serve.sqlproc import SqlLimits

    token = read_token(token_file, host)
    sock = _listen(host, port)
    port = int(sock.getsockname()[1])
    limits = SqlLimits(timeout=sql_timeout, memory_mb=sql_memory_mb, max_rows=sql_max_rows, max_bytes=sql_max_bytes,
                       check_timeout=sql_check_timeout)
    app = create_app(data, token=token, limits=limits, hosts=HostPolicy(port, allowed_hosts(allowed_host)))
    where = f"[{host}]" if ":" in host else host
    click.echo(f"tracedag serve: http://{where}:{port}/ (API /api, metrics /metrics, OpenAPI /openapi.json)"
               + (" - bearer token required" if token else ""), err=True)
    _run(app, sock, ConnLimits(header_timeout, body_timeout, idle_timeout, max_connections))


def _listen(host: str, port: int) -> socket.socket:
    """The listening address, bound before anything starts: a taken port is one line and exit status 1."""
    from tracedag.pipeline.serve.conns import bind

    try:
        sock: socket.socket = bind(host, port)
    except OSError as e:
        reason = e.strerror or str(e)
        raise click.ClickException(f"--port {port}: cannot listen on {host}:{port} ({reason}); "
                                   "choose another --port, or stop what listens there") from e
    return sock


def _run(app: Any, sock: socket.socket, conn: Any) -> None:
    import uvicorn

    from tracedag.pipeline.serve.conns import BACKLOG, protocol

    config = uvicorn.Config(app, http=protocol(conn, sock), loop="asyncio", backlog=BACKLOG,
                            timeout_keep_alive=int(max(1, conn.idle_timeout)), log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


@click.command("report")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The HTML file to write.")
@click.option("--traces", "max_traces", default=50, show_default=True, type=click.IntRange(min=1),
              help="Traces inlined in full (the failed ones first, then the newest).")
@click.option("--since", help="Only traces that started in this window: 15m, 1h, 2d, or an ISO time.")
@_with_data
def report_command(out: Path, max_traces: int, since: str | None, data: Path) -> None:
    """Write one self-contained HTML file (trace list, DAGs, data inlined) for CI artifacts and e-mail."""
    from tracedag.pipeline.serve.report import write_report

    stats = write_report(data, out, max_traces=max_traces, since=since)
    click.echo(f"wrote {out} ({stats.size_bytes / 1024:.0f} KiB): {stats.traces} traces listed, "
               f"{stats.detailed} with their DAG. Open it in a browser (works offline).")


COMMANDS: list[click.Command] = [serve_command, report_command]
