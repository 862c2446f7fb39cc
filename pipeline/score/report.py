"""Rich tables for the end of ``tracedag score``: steps by source, failures by category, judge cost."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from tracedag.pipeline.score.judge.config import JudgeStats
from tracedag.pipeline.score.runner import ScoreStats


def sources_table(stats: ScoreStats) -> Table:
    """Steps and rows scored by source."""
    t = Table(title="steps scored by source")
    t.add_column("source")
    t.add_column("steps", justify="right")
    t.add_column("rows", justify="right")
    for source in ("rule", "evaluation", "judge"):
        t.add_row(source, str(stats.steps_by_source[source]), str(stats.rows_by_source[source]))
    return t


def evaluations_line(stats: ScoreStats) -> Text:
    """How the evaluations in the spans were mapped this run."""
    ev = stats.evaluations
    return Text(f"evaluations: {ev.seen} new on built steps, {ev.mapped} mapped, {ev.unmappable} unmappable; "
                f"{ev.unmatched_step} in the store target no built step")


def failures_table(stats: ScoreStats) -> Table:
    """Failing (step, metric) rows by taxonomy category, most frequent first."""
    t = Table(title="failures by category")
    for name in ("l1", "l2", "l3"):
        t.add_column(name)
    t.add_column("rows", justify="right")
    for (l1, l2, l3), n in stats.failures_by_category.most_common():
        t.add_row(l1, l2, l3, str(n))
    if not stats.failures_by_category:
        t.add_row("-", "-", "-", "0")
    return t


def judge_table(j: JudgeStats) -> Table:
    """Judge calls, cache hits, retries, errors, tokens and cost."""
    t = Table(title=f"judge: {j.model}")
    t.add_column("what")
    t.add_column("value", justify="right")
    cost = "n/a (no price for this model)" if j.cost_usd is None else f"${j.cost_usd:.4f}"
    for name, value in (("steps judged", j.judged), ("requests", j.calls), ("cache hits", j.cache_hits),
                        ("retries", j.retries), ("malformed answers", j.malformed), ("judge errors", j.errors),
                        ("input tokens", j.input_tokens), ("output tokens", j.output_tokens), ("cost", cost)):
        t.add_row(name, str(value))
    return t


def stats_renderable(stats: ScoreStats) -> RenderableType:
    """Every table of a run, ready for ``Console.print``."""
    head = Text(f"scored {stats.steps} steps of {stats.builds} new builds, {len(stats.files)} files written"
                + (f"; rules on {stats.engine} ({stats.tasks} tasks)" if stats.engine != "local" else ""))
    parts: list[RenderableType] = [head, sources_table(stats), evaluations_line(stats), failures_table(stats)]
    if stats.judge is not None:
        parts.append(judge_table(stats.judge))
        if stats.judge.same_family_models:
            models = ", ".join(stats.judge.same_family_models)
            parts.append(Text(f"warning: the judge is of the same model family as the agent's {models}",
                              style="yellow"))
    return Group(*parts)
