"""Terminal output a person reads (#28): default columns, whole tables in a pipe, `show` marks the
root cause and its propagation path, one definition of a step's score, explanations as raised."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracedag.pipeline.cli import cli

ROOT_DEFAULT = ["root_step_name", "root_step_type", "root_taxonomy_l1", "failed_step_name", "hops_from_root",
                "trace_id"]


def run(store: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [*args, "--data", str(store)])
    return result.exit_code, result.output


def header(out: str) -> list[str]:
    """The column names of the first rich table in ``out`` (the line after the top border)."""
    lines = out.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    return [c.strip() for c in lines[top + 1].strip("┃").split("┃")]


def body(out: str) -> list[list[str]]:
    """The cells of the body rows of the first rich table in ``out``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    rows = []
    for line in lines[start + 1:]:
        if not line.startswith("│"):
            break
        rows.append([c.strip() for c in line.strip("│").split("│")])
    return rows


def test_root_causes_shows_the_columns_a_user_wants_first(query_store: Path) -> None:
    code, out = run(query_store, "query", "root_causes")
    assert code == 0, out
    assert header(out) == ROOT_DEFAULT
    # t1-chain: r fails, greedy moves once to s1 (search, tool, tool_execution); hand-worked in test_propagation
    assert ["search", "tool", "tool_execution", "planner", "1", "t1-chain"] in body(out)
    assert "5 rows" in out and "more columns: --wide, or --columns a,b,c" in out


def test_wide_prints_every_column_and_columns_picks_them(query_store: Path) -> None:
    code, out = run(query_store, "query", "root_causes", "--wide")
    assert code == 0, out
    cols = header(out)
    assert len(cols) == 27 and cols[:3] == ["trace_id", "strategy", "failed_span_id"]  # + silent_producer, data_arg
    assert "more columns" not in out
    code, out = run(query_store, "query", "root_causes", "--columns", "trace_id, root_span_id,longest_chain")
    assert code == 0, out
    assert header(out) == ["trace_id", "root_span_id", "longest_chain"]
    assert ["t1-chain", "s1", "4"] in body(out)
    # --columns applies to every format; the machine formats otherwise keep every column
    code, out = run(query_store, "query", "root_causes", "--columns", "failed_span_id,hops_from_root", "--format", "json",
                    "-p", "trace_id=t2-converge")
    assert code == 0, out
    assert json.loads(out) == [{"failed_span_id": "j", "hops_from_root": 2}]
    code, out = run(query_store, "query", "root_causes", "--format", "json", "-p", "trace_id=t2-converge")
    assert len(json.loads(out)[0]) == 27  # root_causes: 24 columns, confirmed, silent_producer, data_arg


def test_an_unknown_column_is_a_clear_error_listing_the_columns(query_store: Path) -> None:
    code, out = run(query_store, "query", "root_causes", "--columns", "root_step_name,hops")
    assert code == 2
    assert "root_causes has no column hops; its columns: trace_id, strategy, failed_span_id" in out
    assert "hops_from_root, longest_chain" in out and "Traceback" not in out
    code, out = run(query_store, "query", "root_causes", "--wide", "--columns", "trace_id")
    assert code == 2 and "--wide or --columns, not both" in out


@pytest.mark.parametrize(("name", "first"), [
    ("failures", ["step_name", "step_type", "score", "taxonomy_l1", "recovered", "explanation", "trace_id"]),
    ("propagation", ["step_name", "step_type", "score", "taxonomy_l1", "kind", "longest_chain", "recovered",
                     "trace_id"]),
    ("trace_summary", ["trace_id", "service_name", "start_time", "duration_ms", "failed_steps", "workflow_score",
                       "passed", "root_cause_step", "root_cause_category"]),
    ("validations", ["scenario", "run_key", "passed", "coverage", "missing", "out_of_order", "explanation"]),
])
def test_other_wide_queries_have_default_columns(query_store: Path, name: str, first: list[str]) -> None:
    code, out = run(query_store, "query", name)
    assert code == 0, out
    assert header(out) == first
    code, out = run(query_store, "query", name, "--wide")
    assert len(header(out)) > len(first)


def _piped(*args: str) -> str:
    """stdout of the real CLI in a pipe (not a terminal), as a CI log gets it."""
    done = subprocess.run([sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_piped_table_is_whole_not_cut_to_80_columns(query_store: Path) -> None:
    out = _piped("query", "root_causes", "--wide", "--data", str(query_store))
    widths = {len(line) for line in out.splitlines() if line.startswith(("┃", "│"))}
    assert len(widths) == 1 and widths.pop() > 200  # one natural width, far wider than 80
    assert "…" not in out
    assert len(header(out)) == 27
    assert body(out)[1][:3] == ["t2-converge", "greedy", "j"]
    assert "2023-11-14 22:13:21.032000" in out
    # a long cell is whole (a terminal table caps cells at 60 characters)
    out = _piped("query", "--sql", "select 'start ' || repeat('x', 150) || ' end' as long_text", "--data",
                 str(query_store))
    assert body(out) == [["start " + "x" * 150 + " end"]]
    # every line of `tracedag queries` names its query, whole descriptions and parameters: no wrapped cell
    listing = _piped("queries")
    from tracedag import queries

    named = [line.split("│")[1].strip() for line in listing.splitlines() if line.startswith("│")]
    assert named == queries.names() and "…" not in listing


def test_a_table_written_to_a_file_is_whole(query_store: Path, tmp_path: Path) -> None:
    target = tmp_path / "roots.txt"
    code, out = run(query_store, "query", "root_causes", "--wide", "--output", str(target))
    assert code == 0, out
    text = target.read_text(encoding="utf-8")
    assert "…" not in text and max(len(line) for line in text.splitlines()) > 200


def test_one_definition_of_a_step_score_in_the_query_docs() -> None:
    from tracedag import queries

    with_threshold = [n for n in queries.names() if "fail_threshold" in {p.name for p in queries.describe(n).params}]
    assert {"failures", "propagation", "root_causes", "trace_summary", "amplification"} <= set(with_threshold)
    for name in with_threshold:
        helps = {p.name: p.help for p in queries.describe(name).params}
        assert "score (the minimum over its step_scores rows)" in helps["fail_threshold"], name
    assert "the minimum over the step's step_scores rows" in queries.describe("failures").description
    root = Path(queries.__file__).parent.parent
    texts = [*root.joinpath("queries").glob("*.sql"), *root.joinpath("pipeline").rglob("*.py")]
    wrong = re.compile(r"aggregated score|minimum over metrics|mean score of|avg\(score\) from dag_nodes join step_scores")
    assert [str(p) for p in texts if wrong.search(p.read_text(encoding="utf-8"))] == []


def test_failures_explanation_keeps_the_exception_case_and_says_it_once(tmp_path: Path) -> None:
    from tests.realspans import capture, to_table
    from tracedag.pipeline.dag import build_store
    from tracedag.pipeline.score import score_store
    from tracedag.pipeline.store.parquet import write_parquet_atomic
    from tracedag.schemas.layout import table_dir

    with capture("shop-agent") as (provider, exporter):
        tracer = provider.get_tracer("shop")
        with tracer.start_as_current_span("invoke_agent shop", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                            "gen_ai.agent.name": "shop"}):
            try:
                with tracer.start_as_current_span("execute_tool charge_card", attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "charge_card",
                        "error.type": "ValueError"}):
                    raise ValueError("Card DECLINED for order A-42")
            except ValueError:
                pass
        spans = exporter.get_finished_spans()
    data = tmp_path / "data"
    write_parquet_atomic(to_table(spans), table_dir(data, "spans"))
    build_store(data, idle_seconds=0)
    score_store(data)
    code, out = run(data, "query", "failures", "--columns", "step_name,explanation", "--format", "json")
    assert code == 0, out
    # error.type, the status description and the exception event all carry the error: said once, as raised
    assert json.loads(out) == [{"step_name": "charge_card",
                                "explanation": "the tool raised or reported an error: ValueError: Card DECLINED for "
                                               "order A-42 (also fired: status_error, exception_event)"}]


def _cause_column(out: str) -> dict[str, str]:
    """step name -> the cause cell of `tracedag show`'s table (box-less: split by the header's offsets)."""
    lines = out.splitlines()
    head = next(line for line in lines if line.startswith("step "))
    start, end = head.index("cause"), head.index("flags")
    return {line.split()[0]: line[start:end].strip() for line in lines[lines.index(head) + 1:]
            if line.startswith(" ") or line[:1].isalpha() and not line.startswith("root cause")}


def test_show_marks_the_root_cause_and_the_propagation_path(query_store: Path) -> None:
    code, out = run(query_store, "show", "t2-converge")
    assert code == 0, out
    # greedy from merge (1.0): clean_a (1.0) before clean_b (2.0), then fetch_a, clean_a's only failing upstream
    assert _cause_column(out) == {"orchestrator": "", "fetch_a": "◆ root cause", "fetch_b": "",
                                  "clean_a": "↓ path (1)", "clean_b": "", "merge": "✖ failure (2)"}
    assert ("root cause: fetch_a (tool, score 2.0) → clean_a → merge (the trace's failure); 2 hops from the root, "
            "longest failure chain 2 (tracedag query root_causes)") in out
    code, out = run(query_store, "show", "t1-chain")
    # planner's failing predecessors are all four children; greedy moves once, to search (1.0)
    assert _cause_column(out)["search"] == "◆ root cause" and _cause_column(out)["planner"] == "✖ failure (1)"
    assert "1 hop from the root, longest failure chain 4" in out
    code, out = run(query_store, "show", "t3-retry")
    assert _cause_column(out)["summarize"] == "◆ root cause = failure"
    code, out = run(query_store, "show", "t5-clean")
    assert code == 0 and "root cause" not in out and "cause" not in out.splitlines()[1]


def test_show_scores_a_step_as_the_failures_do(query_store: Path) -> None:
    # reply: judge 1.0, human 4.0: the human label wins, as in failures.sql (reply is not a failure)
    code, out = run(query_store, "show", "t4-ties")
    reply = next(line for line in out.splitlines() if line.strip().startswith("reply"))
    assert " 4.0 " in reply and "failure" not in reply


def test_show_says_whether_a_trace_is_in_the_store(query_store: Path, tmp_path: Path) -> None:
    from tests.realspans import capture, to_table
    from tracedag.pipeline.store.parquet import write_parquet_atomic
    from tracedag.schemas.layout import table_dir

    code, out = run(query_store, "show", "0af7651916cd43dd8448eb211c80319c")
    assert code == 1
    assert f"trace 0af7651916cd43dd8448eb211c80319c is not in the store {query_store}" in out
    assert "not built" not in out
    with capture("shop-agent") as (provider, exporter):
        with provider.get_tracer("shop").start_as_current_span("invoke_agent shop"):
            pass
        spans = exporter.get_finished_spans()
    data = tmp_path / "data"
    write_parquet_atomic(to_table(spans), table_dir(data, "spans"))
    trace_id = f"{spans[0].context.trace_id:032x}"
    code, out = run(data, "show", trace_id)
    assert code == 1 and f"trace {trace_id} has 1 span in the store {data} but is not built yet" in out
    build = re.search(r"`tracedag (build [^`]+)`", out.replace("\n", " "))
    assert build is not None
    result = CliRunner().invoke(cli, build.group(1).split())  # the command as printed builds it
    assert result.exit_code == 0, result.output
    code, out = run(data, "show", trace_id)
    assert code == 0 and "shop" in out


def test_show_in_a_pipe_is_whole(query_store: Path) -> None:
    out = _piped("show", "t2-converge", "--data", str(query_store))
    assert "…" not in out and "root cause: fetch_a" in out
    assert max(len(line) for line in out.splitlines()) > 80


def _on_a_terminal(*args: str, columns: int) -> str:
    """stdout of the real CLI on a pseudo-terminal ``columns`` wide."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    try:
        done = subprocess.run([sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", *args],
                              stdout=follower, stderr=subprocess.PIPE, timeout=120,
                              env={k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | {"TERM": "xterm"})
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
    assert done.returncode == 0, done.stderr
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode()).replace("\r\n", "\n")


def test_on_a_terminal_the_table_fits_its_width(query_store: Path) -> None:
    out = _on_a_terminal("query", "root_causes", "--data", str(query_store), columns=120)
    assert header(out) == ROOT_DEFAULT  # the main columns fit a 120-column terminal whole
    assert max(len(line) for line in out.splitlines()) <= 120
    wide = _on_a_terminal("query", "root_causes", "--wide", "--data", str(query_store), columns=100)
    assert max(len(line) for line in wide.splitlines()) <= 100 and "…" in wide  # squeezed, not wrapped


@pytest.mark.parametrize("store", ["query_store", "rca_store"])
def test_show_finds_the_root_cause_root_causes_finds(store: str, request: pytest.FixtureRequest) -> None:
    from tracedag.pipeline.dag.show import load_shown
    from tracedag.pipeline.store.querying import run_named

    data = request.getfixturevalue(store)
    roots = {r["trace_id"]: r for r in run_named(data, "root_causes").to_pylist()}
    traces = run_named(data, "trace_summary").column("trace_id").to_pylist()
    for trace_id in traces:
        cause = load_shown(data, trace_id).cause
        row = roots.get(trace_id)
        if row is None:
            assert cause is None, trace_id
            continue
        assert cause is not None, trace_id
        assert (cause.root_span_id, cause.failed_span_id, cause.hops_from_root, cause.longest_chain) == (
            row["root_span_id"], row["failed_span_id"], row["hops_from_root"], row["longest_chain"]), trace_id
        assert cause.path[0] == row["root_span_id"] and cause.path[-1] == row["failed_span_id"]
        assert len(cause.path) == row["hops_from_root"] + 1, trace_id
