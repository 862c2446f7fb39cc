"""``tracedag sql``: a statement argument, statements on standard input, and the interactive shell (a pty)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from tracedag.pipeline.cli import cli
from tracedag.pipeline.commands._shell import complete, statements

TRACEDAG = Path(sys.executable).parent / "tracedag"


def sql(store: Path, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["sql", *args, "--data", str(store)], input=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_a_statement_argument_prints_its_table_and_exits_0(rca_store: Path) -> None:
    code, out, err = sql(rca_store, "select count(*) as n from traces")
    assert code == 0, err
    assert re.search(r"│\s*10\s*│", out) and "1 rows" in out


def test_statements_on_stdin_run_in_order_errors_print_and_the_rest_runs(rca_store: Path) -> None:
    script = ("select 41 + 1 as answer;\n"
              "select root_step_name, count(*) as n\n"
              "  from root_causes(per := 'conversation')  -- a statement over lines; ';' in a comment\n"
              "  where root_step_name <> ';'\n"
              "  group by 1 order by n desc, 1 limit 1;\n"
              "select trce_id from traces;\n"
              ".tables\n"
              "select 'after the error' as s;\n")
    code, out, err = sql(rca_store, stdin=script)
    assert code == 1  # one statement failed
    assert re.search(r"│\s*42\s*│", out)
    assert re.search(r"│ get_weather\s*│\s*3\s*│", out)
    assert "after the error" in out
    assert "Referenced column \"trce_id\" not found" in err and "Candidate bindings" in err
    assert "views:" in out and "root_causes()" in out


def test_dot_commands(rca_store: Path) -> None:
    code, out, err = sql(rca_store, stdin=".help\n.queries\n.schema traces\n.schema root_causes\n.schema nope\n.quit\n"
                                          "select 'never run' as s;\n")
    assert ".schema NAME" in out
    assert "root_causes(fail_threshold := 2.0, since_ns := 0, trace_id := '', strategy := 'greedy'" in out
    assert "score_agreement_pairs(metric := NULL)" in out
    assert "built_unix_nano" in out  # a column of the traces view
    assert "root_step_name" in out  # a column of the named query
    assert "no view or named query nope" in err
    assert "never run" not in out
    assert code == 1


def test_a_big_result_is_read_up_to_a_screenful_of_rows(rca_store: Path) -> None:
    code, out, err = sql(rca_store, stdin="select i from range(50000) t(i);\nselect 1 as one;\n")
    assert code == 0, err
    assert "stopped reading after" in err and "LIMIT" in err
    caption = re.search(r"(\d+) rows \(\d+ not shown", " ".join(out.split()))  # a narrow table wraps its caption
    assert caption, out[-300:]
    shown = int(caption.group(1))
    assert 10_000 < shown < 50_000
    assert re.search(r"│\s*1\s*│", out)  # the next statement ran


def test_statement_grouping() -> None:
    assert complete("select 1;") and complete("select 1; -- done\n")
    assert not complete("select ';'") and not complete("select 'a;") and not complete("select 1 /* ; */")
    assert list(statements(["select 1", " + 1;", ".tables", "select 2"])) == ["select 1\n + 1;", ".tables", "select 2"]


def _read_until(fd: int, marker: bytes, timeout: float = 60) -> bytes:
    seen = b""
    end = time.monotonic() + timeout
    while marker not in seen:
        ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            raise AssertionError(f"no {marker!r} in {seen.decode(errors='replace')!r}")
        try:
            seen += os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
    return seen


def test_the_interactive_shell_on_a_terminal_keeps_history(rca_store: Path, tmp_path: Path) -> None:
    history = tmp_path / "history"
    main, child = pty.openpty()
    env = dict(os.environ, TRACEDAG_HISTORY=str(history), COLUMNS="120", TERM="dumb")
    proc = subprocess.Popen([str(TRACEDAG), "sql", "--data", str(rca_store)], stdin=child, stdout=child,
                            stderr=child, env=env, close_fds=True)
    os.close(child)
    try:
        assert b"tracedag SQL on" in _read_until(main, b"tracedag> ")
        os.write(main, b"select 6 *\n")
        _read_until(main, b"...> ")  # the statement goes on
        os.write(main, b"7 as answer;\n")
        assert b"42" in _read_until(main, b"tracedag> ")
        os.write(main, b"select nope;\n")
        assert b"Error:" in _read_until(main, b"tracedag> ")  # and the shell goes on
        os.write(main, b"\x04")  # Ctrl-D
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)
    assert "select 6 *" in history.read_text() and "select nope;" in history.read_text()
