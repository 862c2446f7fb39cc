"""CLI command: capture (a step's state as a test case for ``tracedag.testing``)."""

from __future__ import annotations

from pathlib import Path

import click

from tracedag.pipeline.commands._options import data_option


@click.command("capture")
@click.argument("trace_id")
@click.option("--before", "span_id", required=True, metavar="SPAN_ID", help="The step to capture the state before.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="Case file to write.")
@data_option
def capture_command(trace_id: str, span_id: str, out: Path, data: Path) -> None:
    """Write the state just before step SPAN_ID of TRACE_ID as a case file (JSON).

    The case holds the conversation so far (messages in order, tool calls with their results),
    the step's inputs and what it produced in the trace; `tracedag.testing.load_case` loads it and
    `run_step` calls one step of your agent on it (the pytest plugin adds a fixture for it).
    """
    from tracedag.pipeline.regress.capture import capture_case, write_case

    case = capture_case(data, trace_id, span_id)
    write_case(case, out)
    step = case["step"]
    click.echo(f"wrote {out}: {len(case['history'])} history items before {step['type']} step {step['name']!r}")
    click.echo(f"next: python -c \"from tracedag.testing import load_case; print(load_case('{out}').messages)\"")


COMMANDS: list[click.Command] = [capture_command]
