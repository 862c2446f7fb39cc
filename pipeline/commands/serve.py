"""CLI commands: serve (HTTP API, web UI, /metrics) and report (one self-contained HTML file)."""

from __future__ import annotations

import ipaddress
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
    token = path.read_text().strip()
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
              help="Seconds before a POST /api/sql query's worker is killed.")
@click.option("--sql-memory-mb", default=1024, show_default=True, type=click.IntRange(min=64),
              help="DuckDB memory limit of a SQL worker (its address space is capped 1.5 GB above).")
@click.option("--sql-max-rows", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="Rows a POST /api/sql answer holds at most (then truncated: true).")
@click.option("--sql-max-bytes", default=8 << 20, show_default=True, type=click.IntRange(min=1024),
              help="Bytes a POST /api/sql answer holds at most: larger is 413, or the rows that fit with "
                   "?truncate=1 (truncated: true).")
@click.option("--sql-check-timeout", default=2.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds the SQL guard may take to check one statement (then 400).")
@_with_data
def serve_command(host: str, port: int, token_file: Path | None, allowed_host: tuple[str, ...],
                  sql_timeout: float, sql_memory_mb: int,
                  sql_max_rows: int, sql_max_bytes: int, sql_check_timeout: float, data: Path) -> None:
    """Serve the store read-only: HTTP API, web UI at /, Prometheus /metrics, sandboxed SQL."""
    import uvicorn

    from tracedag.pipeline.serve.app import create_app
    from tracedag.pipeline.serve.hostcheck import HostPolicy, allowed_hosts
    from tracedag.pipeline.serve.sqlproc import SqlLimits

    token = read_token(token_file, host)
    limits = SqlLimits(timeout=sql_timeout, memory_mb=sql_memory_mb, max_rows=sql_max_rows, max_bytes=sql_max_bytes,
                       check_timeout=sql_check_timeout)
    app = create_app(data, token=token, limits=limits, hosts=HostPolicy(port, allowed_hosts(allowed_host)))
    where = f"[{host}]" if ":" in host else host
    click.echo(f"tracedag serve: http://{where}:{port}/ (API /api, metrics /metrics, OpenAPI /openapi.json)"
               + (" - bearer token required" if token else ""), err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


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
