"""CLI commands: score, labels import, labels agreement."""

from __future__ import annotations

import os
from pathlib import Path

import click

from tracedag.pipeline.commands._engine import engine_for, engine_options
from tracedag.pipeline.commands._options import data_option
from tracedag.pipeline.commands._table import print_whole


def _memory(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """``--memory-limit`` (or ``TRACEDAG_SCORE_MEMORY``) in bytes; None: the default share of the available memory."""
    from tracedag.pipeline.score.memory import mem_available, parse_memory

    if value is None or not value.strip():
        return None
    try:
        return parse_memory(value, mem_available())
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None


@click.command("score")
@data_option  # type: ignore[untyped-decorator, unused-ignore]
@click.option("--judge/--no-judge", "use_judge", default=None,
              help="Also grade steps with the LLM judge (default: on when TRACEDAG_JUDGE_MODEL is set).")
@click.option("--judge-model", envvar="TRACEDAG_JUDGE_MODEL", help="Judge model (env TRACEDAG_JUDGE_MODEL).")
@click.option("--judge-base-url", envvar="TRACEDAG_JUDGE_BASE_URL",
              help="OpenAI-compatible endpoint (env TRACEDAG_JUDGE_BASE_URL).")
@click.option("--judge-concurrency", type=int, help="Judge requests in flight (env TRACEDAG_JUDGE_CONCURRENCY).")
@click.option("--judge-max-steps", type=int, help="Judge at most this many steps in this run.")
@click.option("--judge-price", nargs=2, type=float, metavar="IN OUT",
              help="USD per million input and output tokens (env TRACEDAG_JUDGE_PRICE_IN/_OUT).")
@click.option("--max-iterations", type=int, help="Flag loop iterations at or above this bound.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@click.option("--materialize-part", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Store the named queries' results of every trace in parts of this many traces (whole "
                   "conversations) when the store has more: memory follows the part, not the store.")
@click.option("--memory-limit", envvar="TRACEDAG_SCORE_MEMORY", callback=_memory, metavar="SIZE",
              help="DuckDB's memory while storing the results: e.g. 8GB or 30% of the available memory "
                   "(default 25%; env TRACEDAG_SCORE_MEMORY); beyond it, it spills to the store's disk.")
@engine_options
def score_command(data: Path, use_judge: bool | None, judge_model: str | None, judge_base_url: str | None,
                  judge_concurrency: int | None, judge_max_steps: int | None,
                  judge_price: tuple[float, float] | None, max_iterations: int | None, no_progress: bool,
                  materialize_part: int = 100_000, memory_limit: int | None = None, engine: str = "local",
                  ray_address: str | None = None, workers: int | None = None) -> None:
    """Score every built step not scored yet: rules, evaluations in the spans, optional LLM judge."""

    from tracedag.pipeline.score import JudgeConfig, score_store
    from tracedag.pipeline.score.report import stats_renderable

    if use_judge is None:
        use_judge = bool(os.environ.get("TRACEDAG_JUDGE_MODEL"))
    judge = None
    if use_judge:
        price_in, price_out = judge_price or (None, None)
        judge = JudgeConfig.from_env(model=judge_model, base_url=judge_base_url, concurrency=judge_concurrency,
                                     max_steps=judge_max_steps, price_in=price_in, price_out=price_out)
    with engine_for(engine, ray_address, workers) as running:
        stats = score_store(data, judge=judge, progress=not no_progress, max_iterations=max_iterations,
                            engine=running, materialize_part=materialize_part, memory=memory_limit)
    print_whole(stats_renderable(stats))


@click.group("labels")
def labels_group() -> None:
    """Human labels: import them, and measure how the automatic scores agree with them."""


@labels_group.command("import")
@data_option  # type: ignore[untyped-decorator, unused-ignore]
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--annotator", help="Annotator for rows without an annotator column.")
@click.option("--strict", is_flag=True, help="Import nothing when any row is bad.")
def labels_import(data: Path, file: Path, annotator: str | None, strict: bool) -> None:
    """Import human labels from FILE (.csv or .parquet); bad rows are listed with their line numbers."""

    from tracedag.pipeline.score.labels.human import import_labels
    from tracedag.pipeline.score.labels.report import import_renderable

    result = import_labels(data, file, annotator=annotator, strict=strict)
    print_whole(import_renderable(result, strict))
    if result.bad:
        raise click.exceptions.Exit(1)


@labels_group.command("agreement")
@data_option  # type: ignore[untyped-decorator, unused-ignore]
@click.option("--metric", help="Compare this metric only (default: each step's lowest score).")
def labels_agreement(data: Path, metric: str | None) -> None:
    """Cohen's kappa, confusion matrix and failure recall of each source against the human labels."""

    from tracedag.pipeline.score.labels.agreement import agreement_report
    from tracedag.pipeline.score.labels.report import agreement_renderable

    results, labelled = agreement_report(data, metric)
    print_whole(agreement_renderable(results, labelled))


COMMANDS: list[click.Command] = [score_command, labels_group]
