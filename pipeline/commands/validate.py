"""CLI commands: ``validate learn`` and ``validate check`` (structural validation, DESIGN.md §10)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tracedag.pipeline.commands._options import data_option
from tracedag.schemas.errors import TracedagError

if TYPE_CHECKING:
    import pyarrow as pa

    from tracedag.pipeline.score.judge.same_step import SameStepJudge
    from tracedag.pipeline.validate import Learned

_F = TypeVar("_F", bound=Callable[..., Any])
_STATES = ("step_key", "step_name", "step_type:step_name", "node", "tool")  # validate.runs.STATES
_MERGES = ("normalized", "exact", "semantic")  # validate.learning.MERGES


class BadInput(click.ClickException):
    """A domain error at the edge: one line, exit code 2 (bad data, model or selection)."""

    exit_code = 2


@contextmanager
def _clean_errors(what: str) -> Iterator[None]:
    from rich.console import Console

    try:
        with Console(stderr=True).status(what):
            yield
    except TracedagError as e:
        raise BadInput(str(e)) from e


def _with_data(f: _F) -> _F:
    return data_option(f)


def _runs_option(f: _F) -> _F:
    option: Callable[[_F], _F] = click.option(
        "--runs", "selection", default=None, metavar="SEL",
        help="Runs to use: run labels key=value[,key=value] (scenario_id=p02, service_version=1.2.0, run_id=nightly/*, "
             "simulation_id=...; a key is a traces column, a root-span column or a tracedag.<key> attribute), or "
             "sql:<condition over traces t and the root span r>; the same syntax as tracedag regress. Default: every run.")
    return option(f)


@click.group("validate")
def validate_group() -> None:
    """Structural validation: learn the essential states of good runs, check runs reach them in order."""


@validate_group.command("learn")
@_with_data
@_runs_option
@click.option("--by", "by", default=None, metavar="SQL",
              help="SQL expression over the root span naming a run's scenario (default: scenario_id).")
@click.option("--state", "state", type=click.Choice(_STATES), default="step_key", show_default=True,
              help="What a state is: the DAG step key of nodes and tools, their step name, type:name, "
                   "graph nodes only, or tools only.")
@click.option("--merge", "merge", type=click.Choice(_MERGES), default="normalized", show_default=True,
              help="Merge states whose names are equal after replacing ids, numbers and dates (normalized), "
                   "or only equal names (exact); semantic: normalized, then ask the judge's LLM whether two names "
                   "at the same point of the runs are the same step (recorded in the model for review).")
@click.option("--merge-confidence", "merge_confidence", default=0.9, show_default=True, type=click.FloatRange(0, 1),
              help="--merge semantic: merge only when the LLM says 'same' with at least this confidence.")
@click.option("--judge-model", envvar="TRACEDAG_JUDGE_MODEL", default=None,
              help="--merge semantic: the LLM to ask (env TRACEDAG_JUDGE_MODEL).")
@click.option("--judge-base-url", envvar="TRACEDAG_JUDGE_BASE_URL", default=None,
              help="--merge semantic: its OpenAI-compatible endpoint (env TRACEDAG_JUDGE_BASE_URL).")
@click.option("--agent", "agent", default=None, help="Agent to learn (needed when the runs are of several).")
@click.option("--min-runs", default=2, show_default=True, type=click.IntRange(min=1),
              help="Fewest passing runs a scenario needs.")
@click.option("--max-runs", default=None, type=click.IntRange(min=1),
              help="Learn from at most this many passing runs per scenario (the earliest).")
@click.option("--skip-thin", is_flag=True,
              help="Leave out scenarios with fewer than --min-runs passing runs (listed) instead of failing.")
@click.option("--keep-outliers", is_flag=True,
              help="Learn from every passing run, also one lacking states all the others reach.")
@click.option("--include-replays", is_flag=True,
              help="Learn from tracedag replay runs too (default: they are left out, and checked against the model).")
@click.option("--update", "update", is_flag=True,
              help="Re-learn into an existing --out model: keep a person's edits and print what changed.")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Model file to write (.json, or .yaml/.yml for YAML).")
def learn_command(data: Path, selection: str | None, by: str | None, state: str, merge: str,
                  merge_confidence: float, judge_model: str | None, judge_base_url: str | None, agent: str | None,
                  min_runs: int, max_runs: int | None, skip_thin: bool, keep_outliers: bool, include_replays: bool,
                  update: bool, out: Path) -> None:
    """Learn each scenario's essential states from its passing runs (dominators of acceptance)."""
    from tracedag.pipeline.validate import learn, read_model
    from tracedag.pipeline.validate.learning import LearnOptions

    options = LearnOptions(state=state, merge=merge, min_runs=min_runs, max_runs=max_runs, agent=agent,
                           keep_outliers=keep_outliers, skip_thin=skip_thin, min_confidence=merge_confidence,
                           include_replays=include_replays)
    with _clean_errors("learning skeletons"):
        asker = _semantic_asker(data, judge_model, judge_base_url) if merge == "semantic" else None
        try:
            previous = read_model(out) if update and out.exists() else None
            learned = learn(data, options, selection, by, previous, asker)
        finally:
            if asker is not None:
                asker.close()
    from tracedag.pipeline.validate.model import save_model

    save_model(learned.model, out)
    _print_learned(learned, out, data)


def _semantic_asker(data: Path, model: str | None, base_url: str | None) -> SameStepJudge:
    from tracedag.pipeline.score.judge.same_step import same_step_judge

    return same_step_judge(data, model=model, base_url=base_url)


def _print_semantic(learned: Learned) -> None:
    info = learned.model.learned_from.get("semantic_merge")
    if not isinstance(info, dict):
        return
    click.echo(f"semantic merge by {info['model']} (confidence >= {info['min_confidence']}): "
               f"{info['pairs_asked']} pair(s) asked, {info['merged']} merged, {info['not_confident']} not confident, "
               f"{info['failed']} without an answer")
    for name, s in learned.model.scenarios.items():
        for m in s.semantic_merges:
            click.echo(f"  merged in {name}: {' = '.join(m['names'])} -> {m['into']} ({m['confidence']:.2f})")


def _print_learned(learned: Learned, out: Path, data: Path) -> None:
    from rich.table import Table

    from tracedag.pipeline.commands._table import print_whole

    model = learned.model
    t = Table(title=f"validation model for {model.agent} ({model.state} states)", title_justify="left")
    for col in ("scenario", "runs", "outliers", "states", "essential states, in order"):
        t.add_column(col, overflow="fold")
    for name, s in model.scenarios.items():
        t.add_row(name, str(len(s.runs)), str(len(s.excluded_runs)), f"{s.prefix_tree_states} -> {len(s.states)}",
                  " > ".join(s.essential))
    print_whole(t)
    _print_semantic(learned)
    if model.learned_from.get("replays_left_out"):
        click.echo(f"left out {model.learned_from['replays_left_out']} replayed run(s) (--include-replays learns "
                   "from them too)")
    for thin in model.learned_from.get("skipped_scenarios", []):
        click.echo(f"left out scenario {thin['scenario']}: {thin['passing_runs']} passing of {thin['runs']} run(s)")
    for line in learned.changes:
        click.echo(f"changed: {line}")
    if learned.updated and not learned.changes:
        click.echo("unchanged: the runs confirm the previous model")
    click.echo(f"wrote {out} (edit 'essential' to require or relax a state); next: "
               f"tracedag validate check --data {data} --model {out}")


@validate_group.command("check")
@_with_data
@_runs_option
@click.option("--model", "model_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Model file written by tracedag validate learn.")
@click.option("--fail-under", default=None, type=click.FloatRange(0, 1),
              help="Exit 1 when the pass rate is below this (a CI gate).")
def check_command(data: Path, selection: str | None, model_path: Path, fail_under: float | None) -> None:
    """Check each run reaches its scenario's essential states in order; write the validations table."""
    from tracedag.pipeline.validate import check

    with _clean_errors("checking runs"):
        table = check(data, model_path, selection)
    rate = _print_checked(table)
    click.echo(f"wrote the validations table; next: tracedag query validations --data {data} "
               "--param failed_only=true")
    if fail_under is not None and rate is not None and rate < fail_under:
        raise click.ClickException(f"pass rate {rate:.0%} is below --fail-under {fail_under:.0%}")


def _print_checked(table: pa.Table) -> float | None:
    from rich.table import Table

    from tracedag.pipeline.commands._table import print_whole

    rows = table.to_pylist()
    per: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        per.setdefault(str(r["scenario"]), []).append(r)
    t = Table(title="structural validation", title_justify="left")
    for col in ("scenario", "runs", "passed", "pass rate", "most common reason for failing"):
        t.add_column(col, overflow="fold")
    for name, group in sorted(per.items()):
        judged = [r for r in group if r["passed"] is not None]
        ok = sum(1 for r in judged if r["passed"])
        reasons = [str(r["explanation"]) for r in judged if not r["passed"]]
        common = max(set(reasons), key=reasons.count) if reasons else (group[0]["explanation"] if not judged else "")
        t.add_row(name, str(len(group)), str(ok), f"{ok / len(judged):.0%}" if judged else "—", common)
    print_whole(t)
    judged = [r for r in rows if r["passed"] is not None]
    passed = sum(1 for r in judged if r["passed"])
    rate = passed / len(judged) if judged else None
    click.echo(f"{passed} of {len(judged)} runs passed" + (f" ({rate:.0%})" if rate is not None else ""))
    return rate


COMMANDS: list[click.Command] = [validate_group]
