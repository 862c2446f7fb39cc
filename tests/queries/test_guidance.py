"""Errors that guide: a wrong --data, an empty store, a query before build or score, piped tables."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench.gen import make_store
from tracedag.pipeline.cli import cli


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("command", [["build"], ["score"], ["query", "failures"], ["sql", "--print-only"],
                                     ["show", "abc"], ["determinism"], ["labels", "agreement"]])
def test_a_wrong_data_path_is_an_error_naming_what_to_do(tmp_path: Path, command: list[str]) -> None:
    missing = tmp_path / "typo"
    code, _, err = _run(*command, "--data", str(missing))
    assert code == 2
    assert f"{missing} does not exist" in err and "tracedag ingest FILE --data" in err
    assert not missing.exists()  # reading commands never create a store


def test_a_directory_without_a_store_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a store")
    code, _, err = _run("query", "failures", "--data", str(tmp_path))
    assert code == 2 and "holds no tracedag store" in err


def test_build_on_an_empty_store_says_so(tmp_path: Path) -> None:
    (tmp_path / "d" / "state").mkdir(parents=True)
    code, out, err = _run("build", "--data", str(tmp_path / "d"))
    assert code == 0 and "no spans in" in err and "nothing to build" in err and "tracedag build" not in out


def test_queries_before_build_and_score_say_what_to_run(tmp_path: Path) -> None:
    data = tmp_path / "d"
    make_store(data, 600, seed=3)
    code, _, err = _run("query", "root_causes", "--data", str(data))
    assert code == 0 and f"0 rows: nothing is built yet: run `tracedag build --data {data}`" in err
    assert _run("build", "--data", str(data), "--idle", "0")[0] == 0
    code, _, err = _run("query", "failures", "--data", str(data))
    assert code == 0 and f"0 rows: no step is scored yet: run `tracedag score --data {data}`" in err
    code, _, err = _run("query", "--sql", "select * from spans where false", "--data", str(data))
    assert code == 0 and "0 rows" not in err  # the input is there: an empty answer is the answer


def test_piped_tables_are_whole(tmp_path: Path) -> None:
    data = tmp_path / "d"
    make_store(data, 600, seed=4)
    wide = "select trace_id, span_id, name, service_name, step_type, step_name, model, tool_name from spans limit 3"
    cmd = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "query", "--sql", wide, "--data", str(data)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"}).stdout
    assert max(len(line) for line in out.splitlines()) > 80 and "…" not in out
    dump = tmp_path / "a-dump-file-with-the-long-name-a-real-export-job-gives-it-2026-12-02T00-00-00.jsonl"
    dump.write_text('{"resourceSpans": []}\n')
    ingest = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "ingest", str(dump), "--data", str(data)]
    shown = subprocess.run(ingest, capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"}).stdout
    assert dump.name in shown and "…" not in shown  # the 8-column summary is not cut to 80 columns
