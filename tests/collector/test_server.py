"""start_collector options: DAG building, process-mode conversion, restart recovery; the CLI surface."""


from click.testing import CliRunner

from tests.collector.collector_support import make_request, make_span, post, stored, wait_until
from tracedag.pipeline.cli import cli
from tracedag.pipeline.commands.collect import parse_size
from tracedag.pipeline.service import CollectorConfig, start_collector
from tracedag.pipeline.store.views import connect


def test_build_true_builds_dags_of_idle_traces(tmp_path):
    c = start_collector(CollectorConfig(data=tmp_path, http_port=0, grpc_port=None, build=True,
                                        build_idle_seconds=0.0, build_interval=0.3))
    try:
        root = make_span(0)
        child = make_span(1, trace_id=root.trace_id, parent_span_id=root.span_id)
        assert post(c.http_port, make_request([root, child]).SerializeToString()).status == 200
        c.flush()
        wait_until(lambda: connect(tmp_path).sql("select * from traces").fetchall(), 30, "no DAG built")
    finally:
        c.stop(1)


def test_process_mode_conversion_and_metrics(tmp_path):
    c = start_collector(CollectorConfig(data=tmp_path, http_port=0, grpc_port=None, convert_process=True))
    try:
        assert post(c.http_port, make_request([make_span(i) for i in range(7)]).SerializeToString()).status == 200
        c.flush()
        assert len(stored(tmp_path)) == 7
        wait_until(lambda: "tracedag_ingest_spans_stored_total" in post(c.http_port, b"", None, "/metrics", "GET").body
                   .decode(), 10, "converter metrics not merged")
    finally:
        c.stop(2)


def test_acked_but_unconverted_data_is_converted_after_restart(tmp_path):
    c = start_collector(CollectorConfig(data=tmp_path, http_port=0, grpc_port=None, convert=False))
    assert post(c.http_port, make_request([make_span(i) for i in range(4)]).SerializeToString()).status == 200
    c.stop(1)
    assert stored(tmp_path) == []
    c2 = start_collector(CollectorConfig(data=tmp_path, http_port=None, grpc_port=None))
    c2.flush()
    c2.stop(1)
    assert len(stored(tmp_path)) == 4


def test_cli_help_and_sizes():
    out = CliRunner().invoke(cli, ["collect", "--help"]).output
    assert "0.0.0.0" in out and "--token-file" in out and "--http-port" in out
    assert parse_size("64MiB") == 64 * 2**20 and parse_size("1000") == 1000 and parse_size("2g") == 2 * 2**30
