"""The Ray engine on a real local Ray cluster (2 CPUs): build and score equal the local ones, a
killed worker's task reruns without duplicate rows, the CLI shows the engine and its tasks; an S3 store
that two collectors wrote is built and scored by commands that join the cluster by its address."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

import tests.engine.engine_support as support
from tests.collector.collector_support import start_process, stop_process
from tests.engine.engine_support import PausingEngine, make_spans, rows, spans_copy, table_rows
from tests.replay.replay_support import BOOKING_TURNS, example_store
from tests.store.objfixtures import agent_traces, otel_provider, sorted_rows
from tests.store.objfixtures import quick_module_server as s3_module_server  # noqa: F401  (the SeaweedFS of s3)
from tracedag.pipeline.cli import cli
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.demo.config import DemoResult
from tracedag.pipeline.demo.report import engine_line
from tracedag.pipeline.engine import Engine, bucket_target, plan_buckets
from tracedag.pipeline.score import score_store
from tracedag.pipeline.service import CollectorConfig, start_collector
from tracedag.pipeline.store.listing import read_listing
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.remote import attach, open_remote

ray = pytest.importorskip("ray")

TABLES = [("traces", "build_id, built_unix_nano"), ("dag_nodes", "build_id"), ("dag_edges", "build_id")]
SCORES = "build_id, scored_unix_nano"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local Ray cluster of 2 CPUs for the module (its GCS address); the support module travels by value to
    the workers. Its processes keep an object cache of their own in the run's temporary directory."""
    os.environ.setdefault("RAY_DISABLE_IMPORT_WARNING", "1")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRACEDAG_CACHE_DIR", str(tmp_path_factory.mktemp("ray-objcache")))
        context = ray.init(num_cpus=2, object_store_memory=200 * 1024**2, include_dashboard=False,
                           log_to_driver=False, logging_level="ERROR")
    ray.cloudpickle.register_pickle_by_value(support)
    yield str(context.address_info["gcs_address"])
    ray.shutdown()


@pytest.fixture(scope="module")
def spans(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("spans")
    make_spans(data)
    return data


@pytest.fixture(scope="module")
def local(spans, tmp_path_factory) -> Path:
    """The spans built and scored in this process."""
    data = spans_copy(spans, tmp_path_factory.mktemp("local"))
    build_store(data, idle_seconds=0)
    score_store(data)
    return data


def _sorted_rows(table: pa.Table) -> list[tuple[object, ...]]:
    return sorted(tuple(r.values()) for r in table.to_pylist())


def _same_build(data: Path, local: Path) -> None:
    for table, exclude in TABLES:
        mine, theirs = table_rows(data, table, exclude), table_rows(local, table, exclude)
        assert len(mine) == len(theirs) > 0 and mine == theirs, table


def test_build_and_score_on_ray_equal_local(cluster, spans, local, tmp_path):
    data = spans_copy(spans, tmp_path)
    engine = Engine(workers=2)
    stats = build_store(data, idle_seconds=0, engine=engine)
    assert stats.engine == "ray" and stats.tasks >= 2 and stats.traces_built == rows(local, "select count(*) from traces")[0][0]
    _same_build(data, local)
    names = sorted(p.name for p in (data / "tables" / "dag_nodes").glob("*.parquet"))
    assert names == [f"{stats.build_id}-b{k:04d}.parquet" for k in range(stats.tasks)]

    scored = score_store(data, engine=engine)
    assert scored.engine == "ray" and scored.tasks >= 2 and scored.steps == stats.spans
    mine, theirs = table_rows(data, "step_scores", SCORES), table_rows(local, "step_scores", SCORES)
    assert len(mine) == len(theirs) > 0 and mine == theirs
    assert rows(data, "select count(*) from step_scores where score <= 2")[0][0] > 0  # failures among them
    causes = [_sorted_rows(run_named(d, "root_causes", {})) for d in (data, local)]
    assert causes[0] == causes[1] and causes[1]
    assert not engine.started  # the cluster is the fixture's: the engine joined it and leaves it running


def test_killed_worker_reruns_its_bucket_without_duplicates(cluster, spans, local, tmp_path):
    data = spans_copy(spans, tmp_path / "data")
    pause = tmp_path / "pause"
    pause.mkdir()
    engine = PausingEngine(workers=2, pause_dir=str(pause))
    done: list[object] = []
    driver = threading.Thread(target=lambda: done.append(build_store(data, idle_seconds=0, engine=engine)))
    driver.start()
    deadline = time.monotonic() + 60
    while not (pause / "paused").exists():
        assert time.monotonic() < deadline and driver.is_alive(), "bucket 0 never started"
        time.sleep(0.05)
    pid = int((pause / "paused").read_text())
    os.kill(pid, signal.SIGKILL)  # the worker dies in the middle of its task
    driver.join(120)
    assert not driver.is_alive() and done
    attempts = [line.split() for line in (pause / "attempts").read_text().splitlines()]
    zero = [p for b, p in attempts if b == "0"]
    assert len(zero) == 2 and zero[0] == str(pid) and zero[1] != str(pid)  # the task ran again elsewhere
    nodes = rows(data, "select count(*), count(distinct (trace_id, span_id)) from dag_nodes_all")[0]
    assert nodes[0] == nodes[1] == rows(local, "select count(*) from dag_nodes")[0][0]
    _same_build(data, local)


def test_cli_build_and_score_show_the_engine_and_its_tasks(cluster, spans, tmp_path):
    data = spans_copy(spans, tmp_path)
    runner = CliRunner()
    built = runner.invoke(cli, ["build", "--data", str(data), "--idle", "0", "--engine", "ray", "--workers", "2"])
    assert built.exit_code == 0, built.output
    assert "ray (2 tasks)" in built.output or "ray (3 tasks)" in built.output
    scored = runner.invoke(cli, ["score", "--data", str(data), "--no-progress", "--engine", "ray"])
    assert scored.exit_code == 0, scored.output
    assert "rules on ray (" in scored.output
    assert ray.is_initialized()  # the command did not stop a cluster it did not start


def test_replay_on_ray_holds_each_run_as_a_task_with_the_same_spans(cluster, tmp_path_factory):
    source = example_store(tmp_path_factory.mktemp("replay") / "data", {"c-book": BOOKING_TURNS})
    runs = "select run_id, count(distinct trace_id), list(name order by name) from spans where run_id is not null group by 1 order by 1"
    seen = {}
    for engine in ("local", "ray"):
        data = tmp_path_factory.mktemp(engine) / "data"
        shutil.copytree(source, data)
        res = CliRunner().invoke(cli, ["replay", "--data", str(data), "--agent", "example", "--agent-opt", "fault_rate=0",
                                       "--agent-opt", "noise=0", "--times", "3", "--replay-id", "rp", "--engine", engine])
        assert res.exit_code == 0, res.output
        assert "3 of 3 runs finished, 0 failed" in res.output
        assert ("engine: ray (3 tasks, one per run)" in res.output) == (engine == "ray")
        seen[engine] = rows(data, runs)
    assert seen["ray"] == seen["local"] and [r[:2] for r in seen["ray"]] == [(f"rp/c-book/r{i}", 1) for i in range(3)]


def test_demo_engine_line_commands_run_on_ray(cluster, local, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(local, data)
    traces = rows(local, "select count(*) from traces")[0][0]
    line = engine_line(DemoResult(data=data, counts={"traces": traces}))
    match = re.search(rf"built {traces} traces in this process.*; try: (tracedag build .*) && (tracedag score .*)$", line)
    assert match, line
    for command in match.groups():
        done = CliRunner().invoke(cli, shlex.split(command)[1:])
        assert done.exit_code == 0 and "ray (" in done.output, done.output
    _same_build(data, local)
    assert table_rows(data, "step_scores", SCORES) == table_rows(local, "step_scores", SCORES)


CLI = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()"]
NODES = "select * exclude (build_id) from dag_nodes"
EDGES = "select * exclude (build_id) from dag_edges"


def _tracedag(*args: str) -> str:
    """``tracedag ARGS`` in a process of its own (as another machine would run it); its stdout."""
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=180, env=os.environ.copy())
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _in_process(*args: str) -> str:
    """``tracedag ARGS`` run in this process; its stdout."""
    done = CliRunner().invoke(cli, list(args))
    assert done.exit_code == 0, done.output
    return done.stdout


def test_two_collectors_one_s3_store_built_on_ray_equals_local(cluster, s3, tmp_path):
    """Two collector processes write one S3 store at once (each its local spool and collector id); commands
    that join the module's Ray cluster by its address build and score it; a third work directory reads what
    they published and it equals the same spans collected, built and scored locally (in this process)."""
    url = f"s3://{s3.bucket}/store"
    local = tmp_path / "local"
    a, a_http, _ = start_process(url, "--spool", str(tmp_path / "spool-a"), "--collector-id", "a")
    b, _, b_grpc = start_process(url, "--spool", str(tmp_path / "spool-b"), "--collector-id", "b")
    ref = start_collector(CollectorConfig(data=local, http_port=0, grpc_port=0))
    try:
        # collector a over OTLP/HTTP, collector b over OTLP/gRPC, the reference store gets both
        ref_http = ref.http_port
        to_a = otel_provider(HttpExporter(endpoint=f"http://127.0.0.1:{a_http}/v1/traces"),
                             HttpExporter(endpoint=f"http://127.0.0.1:{ref_http}/v1/traces"))
        to_b = otel_provider(GrpcExporter(endpoint=f"127.0.0.1:{b_grpc}", insecure=True),
                             HttpExporter(endpoint=f"http://127.0.0.1:{ref_http}/v1/traces"))
        to_both = otel_provider(HttpExporter(endpoint=f"http://127.0.0.1:{a_http}/v1/traces"),
                                GrpcExporter(endpoint=f"127.0.0.1:{b_grpc}", insecure=True),
                                HttpExporter(endpoint=f"http://127.0.0.1:{ref_http}/v1/traces"))
        agent_traces(to_a, 0, 12)
        agent_traces(to_b, 100, 12)
        agent_traces(to_both, 200, 3)  # the same spans reach both collectors: deduplicated at build
        for p in (to_a, to_b, to_both):
            p.shutdown()
    finally:
        ref.stop(10)
        for proc in (a, b):
            assert stop_process(proc) == 0
    listing = read_listing(open_remote(url))
    assert set(listing) == {"a", "b"}
    names = [n for w in listing.values() for n in w["spans"]]
    assert all(n.rpartition("/")[2].startswith(("a--", "b--")) for n in names), names
    builder = tmp_path / "builder"
    # the store is built and scored on the Ray cluster that both commands join by its address, as on a
    # deployment's cluster; the reference is built and scored locally
    for args in (("build", "--idle", "0"), ("score",)):
        out = _tracedag(*args, "--data", url, "--work-dir", str(builder), "--engine", "ray", "--ray-address", cluster)
        assert "ray" in out, out
        _in_process(*args, "--data", str(local))
    reader = tmp_path / "reader"  # a fresh work directory reads everything from the store
    attach(reader, url)
    # the 3 traces both collectors stored are in the store twice, and once in every view
    assert sorted_rows(reader, "select count(*) from spans")[0][0] == 27 * 4
    assert sorted_rows(reader, "select count(*) from dag_nodes")[0][0] == 27 * 4
    for sql in ("select * exclude (received_unix_nano, batch_id) from spans", NODES, EDGES,
                "select * exclude (build_id, built_unix_nano, last_received_unix_nano) from traces",
                "select * exclude (build_id, scored_unix_nano) from step_scores"):
        assert sorted_rows(reader, sql) == sorted_rows(local, sql), sql
    remote_causes = _tracedag("query", "root_causes", "--data", url, "--work-dir", str(reader), "--format", "csv")
    local_causes = _in_process("query", "root_causes", "--data", str(local), "--format", "csv")
    assert sorted(remote_causes.splitlines()) == sorted(local_causes.splitlines())
    assert len(local_causes.splitlines()) > 1


def test_without_ray_the_engine_is_a_one_line_error(spans, tmp_path):
    data = spans_copy(spans, tmp_path)
    code = ("import sys; sys.modules['ray'] = None; from tracedag.pipeline.cli import cli; "
            f"cli(['build', '--data', {str(data)!r}, '--idle', '0', '--engine', 'ray'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "pip install 'tracedag[ray]'" in done.stderr and "Traceback" not in done.stderr


def test_an_unreachable_cluster_is_a_one_line_error_in_seconds(spans, tmp_path):
    data = spans_copy(spans, tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens on it
    started = time.monotonic()
    done = subprocess.run([str(Path(sys.executable).parent / "tracedag"), "build", "--data", str(data), "--idle", "0",
                           "--engine", "ray", "--ray-address", f"127.0.0.1:{port}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and time.monotonic() - started < 30
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr


def test_buckets_cover_every_trace_once_by_window_then_id_range():
    ids = pa.array([f"{i:032x}" for i in range(0, 200, 3)])
    n = ids.to_numpy(zero_copy_only=False).size
    rng = np.random.default_rng(0)
    spans = rng.integers(1, 40, n)
    first = np.where(np.arange(n) % 2 == 0, support.T0, support.T0 + 5 * support.HOUR) + rng.integers(0, 10**9, n)
    first[7] = 0  # unknown first arrival: read from the beginning
    last = first + 10**9
    target = bucket_target(int(spans.sum()), 3, 10**9)
    buckets = plan_buckets(ids, spans, first, last, target)
    seen = [t for b in buckets for t in b.trace_ids.to_pylist()]
    assert sorted(seen) == ids.to_pylist() and len(set(seen)) == n
    assert sum(b.spans for b in buckets) == spans.sum()
    for b in buckets:
        tids = b.trace_ids.to_pylist()
        assert tids == sorted(tids) and b.lo == tids[0] and b.hi == tids[-1]
        rows_of = [ids.to_pylist().index(t) for t in tids]
        assert b.spans <= target + spans[rows_of].max()
        assert b.received_to is not None and b.received_to >= last[rows_of].max()
        if 7 in rows_of:
            assert b.received_from is None
        else:
            assert b.received_from == first[rows_of].min()
    # the late window's buckets do not read the early window's hours
    late = [b for b in buckets if b.received_from is not None and b.received_from >= support.T0 + 5 * support.HOUR]
    assert late and len(buckets) >= 3
    assert bucket_target(10, 4, 2) == 2 and bucket_target(0, 2, 100) == 1
