"""CLI command: regress (the CI regression gate)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import click

from tracedag.pipeline.commands._options import data_option
from tracedag.schemas.errors import TracedagError


class DataError(click.ClickException):
    """A usage or data error of the gate: exit 2, like a click usage error."""

    exit_code = 2


@click.command("regress")
@data_option
@click.option("--baseline", required=True, metavar="SEL",
              help="Baseline runs: run labels key=value[,key=value] (service_version=1.2.0, run_id=nightly/*, "
                   "variant_id=..., simulation_id=...) or sql:<WHERE over traces t / root span r>.")
@click.option("--candidate", required=True, metavar="SEL", help="Candidate runs, same syntax.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="regress.yaml: resamples, confidence, pair_by, per-metric warn/fail levels.")
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "json"]), default="table", show_default=True)
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write JUnit XML here (one test case per metric).")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the Markdown report here (a pull-request comment).")
@click.option("--strict", is_flag=True, help="Warn-level alerts fail the gate too.")
@click.option("--seed", type=click.IntRange(min=0), default=None, help="Bootstrap seed (overrides the config).")
@click.option("--resamples", type=click.IntRange(min=100), default=None, help="Bootstrap resamples (config: 2000).")
@click.option("--all", "all_rows", is_flag=True, help="Table: list unchanged metrics too.")
@click.option("--no-save", "no_save", is_flag=True,
              help="Do not keep the JSON result in <data>/reports/ (tracedag serve and report show the saved ones).")
def regress_command(data: Path, baseline: str, candidate: str, config_path: Path | None, fmt: str,
                    junit_path: Path | None, markdown_path: Path | None, strict: bool, seed: int | None,
                    resamples: int | None, all_rows: bool, no_save: bool) -> None:
    """Compare candidate runs against baseline runs, paired by scenario, and gate on regressions.

    Per metric (workflow score, pass rate, step scores, visits and latency per step type and name,
    failure rate per taxonomy category, root causes, determinism, latency p50/p95, tokens): the mean
    paired difference and a seeded paired-bootstrap CI; an alert needs the effect beyond its level
    and the CI clear of zero. Exit 0: nothing fails; 1: a fail-level alert (warn too with --strict);
    2: a usage or data error (empty selection, no common scenarios, malformed config).
    """
    from tracedag.pipeline.regress import load_config, run_regress
    from tracedag.pipeline.regress import report as rep

    try:
        config = load_config(config_path).replace(seed=seed, resamples=resamples)
        with _status() as phase:
            result = run_regress(data, baseline, candidate, config, strict=strict, progress=phase)
    except TracedagError as e:
        raise DataError(str(e)) from e
    if markdown_path is not None:
        markdown_path.write_text(rep.markdown(result), encoding="utf-8")
    if junit_path is not None:
        junit_path.write_text(rep.junit(result), encoding="utf-8")
    _print(result, fmt, all_rows)
    if not no_save:
        from tracedag.pipeline.regress.saved import save_report

        saved = save_report(data, rep.to_json(result))
        line = f"saved {saved} (tracedag serve shows it under Regressions; --no-save skips)"
        if fmt == "table":
            click.echo(line)
        elif sys.stderr.isatty():  # json/markdown: stdout stays the document alone
            click.echo(line, err=True)
    sys.exit(result.exit_code)


def _print(result: object, fmt: str, all_rows: bool) -> None:
    from tracedag.pipeline.commands._table import print_whole
    from tracedag.pipeline.regress import report as rep
    from tracedag.pipeline.regress.model import RegressResult

    assert isinstance(result, RegressResult)
    if fmt == "json":
        click.echo(rep.to_json(result), nl=False)
        return
    if fmt == "markdown":
        click.echo(rep.markdown(result), nl=False)
        return
    for line in rep.header_lines(result):
        click.echo(line)
    print_whole(rep.rich_table(result, all_rows))
    hidden = sum(m.status == "ok" for m in result.metrics)
    if hidden and not all_rows:
        click.echo(f"{hidden} unchanged metrics not listed (--all lists them)")
    click.echo(rep.verdict(result))


class _status:
    """A spinner on stderr naming the phase (only on a terminal)."""

    def __enter__(self) -> Callable[[str], None]:
        from rich.console import Console

        console = Console(stderr=True)
        self._live = console.status("regress") if console.is_terminal else None
        if self._live is not None:
            self._live.start()
        return self._phase

    def _phase(self, phase: str) -> None:
        if self._live is not None:
            self._live.update(f"regress: {phase}")

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()


COMMANDS: list[click.Command] = [regress_command]
