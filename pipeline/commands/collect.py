"""CLI commands: collect (the OTLP collector)."""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import click

from tracedag.collector.spoolfmt import DONE_RETENTION_SECONDS
from tracedag.pipeline.commands._options import new_data_option as _shared_data_option

_F = TypeVar("_F", bound=Callable[..., Any])
data_option: Callable[[_F], _F] = _shared_data_option

_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1024**3, "gb": 1000**3, "gib": 1024**3}


def parse_size(text: str) -> int:
    """Parse a byte size such as ``67108864``, ``64MiB`` or ``1g``."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise click.BadParameter(f"not a size: {text!r} (e.g. 64MiB)")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def _seconds(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A finite number of seconds, 0 or more (click's FloatRange lets nan and inf through); None: not given."""
    if value is None:
        return None
    if not math.isfinite(value) or value < 0:
        raise click.BadParameter(f"{value} is not a number of seconds (0 or more)")
    return value


@click.command("collect")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; use 0.0.0.0 to listen on all interfaces.")
@click.option("--http-port", default=4318, show_default=True, type=int, help="OTLP/HTTP port (0: any free port).")
@click.option("--grpc-port", default=4317, show_default=True, type=int, help="OTLP/gRPC port (0: any free port).")
@data_option
@click.option("--token", "tokens", multiple=True, envvar="TRACEDAG_TOKEN",
              help="Accepted bearer token (repeatable; env TRACEDAG_TOKEN). Without tokens, no auth.")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path),
              help="File of bearer tokens, one per line; re-read when it changes.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="TLS certificate (PEM).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="TLS private key (PEM).")
@click.option("--tls-client-ca", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="CA (PEM) for mutual TLS: clients must present a certificate it signed.")
@click.option("--max-body", default="64MiB", show_default=True, help="Largest request, after decompression.")
@click.option("--max-attribute-bytes", default=None,
              help="Cut longer string/bytes attribute values to this size (e.g. 64KiB), with a warning; "
                   "default: keep them whole.")
@click.option("--max-span-attributes", type=int, default=None,
              help="Reject spans with more attributes (partial success); default: no limit.")
@click.option("--max-span-events", type=int, default=None,
              help="Reject spans with more events (partial success); default: no limit.")
@click.option("--max-inflight", default="128MiB", show_default=True,
              help="Decompressed bytes in flight before answering 503.")
@click.option("--header-timeout", default=10.0, show_default=True, type=float,
              help="Seconds a client may take to send a request's headers (slow clients are closed).")
@click.option("--body-timeout", default=30.0, show_default=True, type=float,
              help="Seconds a client may take to send a request body (then 408 and close).")
@click.option("--idle-timeout", default=60.0, show_default=True, type=float,
              help="Seconds an idle keep-alive HTTP connection stays open.")
@click.option("--max-connections", default=0, show_default=True, type=int,
              help="HTTP connections at once (0: no cap); over it, new connections get 503 and are closed.")
@click.option("--spool-retention", default=DONE_RETENTION_SECONDS / 3600, show_default=True, type=click.FloatRange(min=0),
              help="Hours converted spool segments stay in spool/done/ (to rebuild Parquet from); 0 deletes "
                   "them once converted.")
@click.option("--build/--no-build", default=False, show_default=True,
              help="Live analysis: build the DAGs of complete traces and score their steps continuously, so "
                   "failures and root causes are queryable seconds after a trace completes.")
@click.option("--build-idle", default=30.0, show_default=True, type=float,
              help="Seconds without new spans before a trace whose root span never came is built.")
@click.option("--build-grace", default=1.0, show_default=True, type=float,
              help="Seconds without new spans before a trace whose root span is in is built.")
@click.option("--build-interval", default=1.0, show_default=True, type=float,
              help="Seconds between live analysis rounds.")
@click.option("--materialize-interval", default=None, type=float, callback=_seconds, hidden=True,
              help="Ignored (kept so that existing service units still start): the named queries' results are "
                   "stored as traces are scored, by a thread of their own.")
@click.option("--materialize-part", default=20_000, show_default=True, type=click.IntRange(min=1),
              help="With --build: traces (whole conversations) one pass of the results' store takes at most. The "
                   "store stores what was scored since its last pass; a trace not stored yet is computed from the "
                   "SQL by queries.")
@click.option("--judge/--no-judge", "use_judge", default=None,
              help="With --build, also grade steps with the LLM judge, in its own thread (default: on when "
                   "TRACEDAG_JUDGE_MODEL is set; endpoint and key as for tracedag score).")
@click.option("--judge-max-steps", default=100, show_default=True, type=int,
              help="Steps the live judge grades at most per round (it never holds the rules back).")
@click.option("--judge-interval", default=10.0, show_default=True, type=float,
              help="Seconds between live judge rounds.")
@click.option("--convert", "convert_mode", type=click.Choice(["process", "thread"]), default="process",
              show_default=True, help="Convert the spool to Parquet in a child process or a thread.")
@click.option("--grace", default=10.0, show_default=True, type=float,
              help="Seconds to drain in-flight requests on SIGTERM/SIGINT.")
@click.option("--keep-local", "keep_local", default=24.0, show_default=True, type=click.FloatRange(min=0),
              help="With --data on an object store: hours the spool directory keeps its own copy of spans files "
                   "already uploaded (they stay in the store).")
def collect(
    host: str, http_port: int, grpc_port: int, data: Path, tokens: tuple[str, ...], token_file: Path | None,
    tls_cert: Path | None, tls_key: Path | None, tls_client_ca: Path | None, max_body: str, max_attribute_bytes: str | None,
    max_span_attributes: int | None, max_span_events: int | None, max_inflight: str,
    header_timeout: float, body_timeout: float, idle_timeout: float, max_connections: int, spool_retention: float,
    build: bool, build_idle: float, build_grace: float, build_interval: float, materialize_interval: float | None,
    materialize_part: int, use_judge: bool | None,
    judge_max_steps: int, judge_interval: float, convert_mode: str, grace: float, keep_local: float,
) -> None:
    """Receive OTLP traces (HTTP 4318 and gRPC 4317), store them durably and convert them to Parquet.

    A port in use: one line naming it and its option, exit 1, and nothing created in --data.
    """
    from tracedag.pipeline.service import CollectorConfig

    if materialize_interval is not None:
        click.echo("tracedag collect: --materialize-interval is ignored: the named queries' results are stored as "
                   "traces are scored, by a thread of their own (--materialize-part bounds a pass)", err=True)
    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if tls_client_ca and not tls_cert:
        raise click.UsageError("--tls-client-ca needs --tls-cert and --tls-key")
    config = CollectorConfig(
        data=data, host=host, http_port=http_port, grpc_port=grpc_port, tokens=tokens, token_file=token_file,
        tls_cert=tls_cert, tls_key=tls_key, tls_client_ca=tls_client_ca, max_body_bytes=parse_size(max_body),
        max_attribute_bytes=parse_size(max_attribute_bytes) if max_attribute_bytes else None,
        max_span_attributes=max_span_attributes, max_span_events=max_span_events,
        header_timeout=header_timeout, body_timeout=body_timeout, idle_timeout=idle_timeout,
        max_connections=max_connections, spool_retention=spool_retention * 3600,
        max_inflight_bytes=parse_size(max_inflight), build=build, build_idle_seconds=build_idle,
        build_grace_seconds=build_grace, build_interval=build_interval,
        materialize_part=materialize_part, convert_process=convert_mode == "process",
        judge=_live_judge(use_judge, judge_max_steps) if build else None, judge_interval=judge_interval,
        keep_local_seconds=keep_local * 3600,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        """Ask the main loop to drain and stop."""
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    running = _start(config, data)
    scheme = "https" if tls_cert else "http"
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"tracedag collect: OTLP/HTTP {scheme}://{shown}:{running.http_port}/v1/traces", nl=True)
    click.echo(f"tracedag collect: OTLP/gRPC {shown}:{running.grpc_port}")
    click.echo(f"tracedag collect: data in {data}; metrics at {scheme}://{shown}:{running.http_port}/metrics")
    if running.config.build:
        click.echo(f"tracedag collect: live analysis every {running.config.build_interval:g} s; named queries' "
                   f"results stored as scored, by a thread of their own, at most {running.config.materialize_part} "
                   "traces a pass")
    click.echo(f"listening http_port={running.http_port} grpc_port={running.grpc_port}")
    while not stop.wait(0.5):
        pass
    click.echo("tracedag collect: draining and flushing ...")
    running.stop(grace)
    click.echo("tracedag collect: stopped")


def _start(config: Any, data: Path) -> Any:
    """Start the collector; when a port is taken, remove what the attempt created (the data directory
    when it did not exist, else its new spool and state files) and say which port and option."""
    from tracedag.collector.server import PortUnavailable
    from tracedag.pipeline.service import start_collector

    before = _entries(data)
    try:
        return start_collector(config)
    except PortUnavailable:
        _remove_new(data, before)
        raise


def _entries(data: Path) -> set[Path] | None:
    """Every path under ``data`` but its tables (None when ``data`` does not exist)."""
    if not data.exists():
        return None
    found: set[Path] = set()
    for root, dirs, files in os.walk(data):
        if Path(root) == data:
            dirs[:] = [d for d in dirs if d != "tables"]
        found.update(Path(root) / n for n in (*dirs, *files))
    return found


def _remove_new(data: Path, before: set[Path] | None) -> None:
    """Remove what appeared under ``data`` since ``before`` (all of ``data`` when it was not there)."""
    if before is None:
        shutil.rmtree(data, ignore_errors=True)
        return
    for path in sorted((_entries(data) or set()) - before, key=lambda p: len(p.parts), reverse=True):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _live_judge(use_judge: bool | None, max_steps: int) -> Any:
    """The live judge's configuration, or None (off unless asked for or TRACEDAG_JUDGE_MODEL is set)."""
    if use_judge is None:
        use_judge = bool(os.environ.get("TRACEDAG_JUDGE_MODEL"))
    if not use_judge:
        return None
    from tracedag.pipeline.score import JudgeConfig

    return JudgeConfig.from_env(max_steps=max_steps)


COMMANDS: list[click.Command] = [collect]
