"""build_store over a real Parquet store: incremental builds, late spans, latest build in the views, CLI."""

import json
import time

import pyarrow as pa
import pytest
from click.testing import CliRunner

from tests.dag.spanbuild import q, span, write_spans
from tracedag.pipeline.cli import cli
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.schemas.layout import table_dir


def test_trace_split_across_batches_arriving_root_last(tmp_path):
    write_spans(tmp_path, [span("a", "r", 1, 10, received=1), span("b", "a", 2, 5, received=1),
                           span("z", None, 0, 50, trace_id="t2", received=1)])
    first = build_store(tmp_path, idle_seconds=0)
    assert first.traces_built == 2 and first.orphans == 1
    assert q(tmp_path, "select root_span_id, orphan_count, connected from traces where trace_id = 't1'") == [
        ("a", 1, False)]

    write_spans(tmp_path, [span("r", None, 0, 100, received=2)])  # the root arrives last
    t2_build = q(tmp_path, "select build_id from traces where trace_id = 't2'")
    second = build_store(tmp_path, idle_seconds=0)
    assert second.traces_built == 1 and second.plan == "incremental"  # planned from the new file alone
    assert q(tmp_path, "select build_id from traces where trace_id = 't2'") == t2_build  # t2 untouched
    assert q(tmp_path, "select root_span_id, orphan_count, connected, span_count from traces where trace_id = 't1'") == [
        ("r", 0, True, 3)]
    assert q(tmp_path, "select count(*) from traces_all where trace_id = 't1'") == [(2,)]
    nodes = q(tmp_path, "select span_id, parent_span_id, depth, build_id from dag_nodes where trace_id = 't1' order by depth")
    assert [(s, p, d) for s, p, d, _ in nodes] == [("r", None, 0), ("a", "r", 1), ("b", "a", 2)]
    assert {b for *_, b in nodes} == {second.build_id}
    assert q(tmp_path, "select count(*) from dag_edges where trace_id = 't1'") == [(2,)]
    # the first build's edges file held only t1's superseded edge: collected (deleted) after the build
    assert q(tmp_path, "select count(*) from dag_edges_all where trace_id = 't1'") == [(2,)]
    assert second.gc is not None and second.gc.deleted.get("dag_edges") == 1

    third = build_store(tmp_path, idle_seconds=0)
    assert third.traces_built == 0 and third.skipped  # no spans file changed: not even scanned
    fourth = build_store(tmp_path, idle_seconds=0, tolerance_ns=5_000_000)  # a setting changed: all again
    assert fourth.traces_built == 2 and not fourth.skipped


def test_idle_time_holds_back_open_traces(tmp_path):
    now = time.time_ns()
    write_spans(tmp_path, [span("r", None, 0, 10, received=now), span("q", None, 0, 10, trace_id="old", received=1)])
    stats = build_store(tmp_path, idle_seconds=3600)
    assert stats.traces_built == 1 and stats.traces_pending == 1
    assert q(tmp_path, "select trace_id from traces") == [("old",)]
    assert build_store(tmp_path, idle_seconds=0).traces_built == 1


def test_pending_trace_is_built_once_its_idle_time_passed(tmp_path):
    write_spans(tmp_path, [span("r", None, 0, 10, received=time.time_ns())])
    assert build_store(tmp_path, idle_seconds=1).traces_pending == 1
    time.sleep(1.2)
    stats = build_store(tmp_path, idle_seconds=1)
    assert stats.traces_built == 1 and not stats.skipped


def test_full_rebuilds_everything_and_state_is_saved(tmp_path):
    write_spans(tmp_path, [span("r", None, 0, 10), span("q", None, 0, 10, trace_id="t2")])
    build_store(tmp_path, idle_seconds=0)
    stats = build_store(tmp_path, idle_seconds=0, full=True)
    assert stats.traces_built == 2
    state = json.loads((tmp_path / "state" / "build.json").read_text())
    assert state["last_build"]["build_id"] == stats.build_id and state["last_build"]["traces_built"] == 2
    assert q(tmp_path, "select count(*) from traces") == [(2,)]


def test_small_chunks_give_the_same_tables(tmp_path):
    rows = [span(f"s{i}", None if i == 0 else "s0", i, i + 0.5, trace_id=f"t{k}") for k in range(5) for i in range(4)]
    write_spans(tmp_path, rows)
    build_store(tmp_path, idle_seconds=0, chunk_spans=3)
    chunked = q(tmp_path, "select trace_id, span_id, topo_index, nested_left, iteration from dag_nodes order by all")
    build_store(tmp_path, idle_seconds=0, full=True)
    whole = q(tmp_path, "select trace_id, span_id, topo_index, nested_left, iteration from dag_nodes order by all")
    assert chunked == whole and len(whole) == 20
    assert not any((tmp_path / "state" / "build-tmp").glob("*"))  # routed chunk files are removed


def test_spec_flags_deviant_traces(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("nodes:\n  plan: {}\n  act: {}\n  check: {step_name: check}\n"
                    "edges:\n  - [plan, act]\n  - [act, check]\nrequired: [plan, check]\n")
    write_spans(tmp_path / "d", [
        span("r", None, 0, 100), span("p", "r", 0, 10, name="plan"), span("a", "r", 11, 20, name="act"),
        span("c", "r", 21, 30, name="check"),
        span("r", None, 0, 100, trace_id="bad"), span("a", "r", 0, 10, name="act", trace_id="bad"),
        span("p", "r", 11, 20, name="plan", trace_id="bad"),
    ])
    stats = build_store(tmp_path / "d", idle_seconds=0, spec=spec)
    assert stats.deviant == 1
    rows = dict(q(tmp_path / "d", "select trace_id, deviation_reason from traces"))
    assert rows["t1"] is None
    assert rows["bad"] == "act -> plan not allowed; required check missing"
    assert q(tmp_path / "d", "select spec_node from dag_nodes where trace_id = 't1' order by topo_index") == [
        ("plan",), ("act",), ("check",), (None,)]


def test_bad_spec_is_a_clean_cli_error(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("nodes: [1, 2]\n")
    (tmp_path / "state").mkdir()
    r = CliRunner().invoke(cli, ["build", "--data", str(tmp_path), "--spec", str(spec)])
    assert r.exit_code != 0 and "workflow spec" in r.output and "Traceback" not in r.output


def test_cli_build_and_show(tmp_path):
    write_spans(tmp_path, [
        span("r", None, 0, 100, name="agent", step_type="agent"),
        span("a", "r", 0, 10, name="search", step_type="tool", status=2),
        span("b", "r", 11, 20, name="search", step_type="tool", status=1),
    ])
    r = CliRunner().invoke(cli, ["build", "--data", str(tmp_path), "--idle", "0"])
    assert r.exit_code == 0, r.output
    assert "traces built" in r.output and "method inferred" in r.output
    scores = pa.table({"trace_id": ["t1"], "span_id": ["a"], "build_id": [None], "metric": ["rule"], "score": [1.0]})
    from tracedag.schemas.tables import STEP_SCORES_V1

    full = pa.table({f.name: scores.column(f.name) if f.name in scores.column_names else pa.nulls(1, f.type)
                     for f in STEP_SCORES_V1}).cast(STEP_SCORES_V1)
    write_parquet_atomic(full, table_dir(tmp_path, "step_scores"))
    r = CliRunner().invoke(cli, ["show", "t1", "--data", str(tmp_path)], env={"COLUMNS": "160"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert "inferred" in lines[0] and "3 spans" in lines[0]
    search = [ln for ln in lines if "search" in ln]
    assert len(search) == 2 and "ERROR" in search[0] and "1.0" in search[0] and "retry" in search[1]
    assert search[0].index("search") > lines[2].index("agent")  # indented under its parent


@pytest.mark.parametrize("arg", ["nope", ""])
def test_show_unknown_trace(tmp_path, arg):
    write_spans(tmp_path, [span("r", None, 0, 10), span("r", None, 0, 10, trace_id="t2")])
    build_store(tmp_path, idle_seconds=0)
    r = CliRunner().invoke(cli, ["show", arg, "--data", str(tmp_path)])
    assert r.exit_code != 0 and "Traceback" not in r.output
