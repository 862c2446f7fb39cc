"""CLI commands: confirm (counterfactual confirmation of root causes)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tracedag.pipeline.commands._options import data_option

if TYPE_CHECKING:
    from tracedag.pipeline.replay import ReplayResult, Target
    from tracedag.pipeline.replay.confirm import PlannedCheck

_F = TypeVar("_F", bound=Callable[..., Any])


def _with_data(f: _F) -> _F:
    """The shared ``--data`` option, typed for mypy --strict."""
    wrapped: _F = data_option(f)
    return wrapped


@click.command("confirm")
@_with_data
@click.option("--agent", "agent", required=True, metavar="TARGET",
              help="module:function (called per turn with the history, returns the reply), an OpenAI-compatible "
                   "chat-completions base URL (http://host:port/v1; with --endpoint) or 'example' (the bundled agent).")
@click.option("--agent-opt", "agent_opts", multiple=True, metavar="NAME=VALUE",
              help="Option of the agent (repeatable), as for tracedag replay.")
@click.option("--conversation", "conversations", multiple=True, metavar="ID",
              help="A failed conversation (or its first trace id) to check; repeatable. Default: every failed "
                   "conversation with a root cause that is not itself a replay.")
@click.option("--where", "where", default=None, metavar="SQL",
              help="Condition over the stored conversations (the columns of tracedag replay --where).")
@click.option("--failed", "failed_only", is_flag=True, help="Only conversations with an ERROR span.")
@click.option("--strategy", default="greedy", show_default=True,
              type=click.Choice(["greedy", "full_path_min", "weighted", "agenteval"]),
              help="The root-cause strategy whose root causes are checked.")
@click.option("--times", default=3, show_default=True, type=click.IntRange(min=1),
              help="Runs of each conversation with the root cause replaced.")
@click.option("--replacement", "replacement", default=None,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The result a root-cause tool call returns when no passing call of it was recorded (JSON or text).")
@click.option("--parallel", default=1, show_default=True, type=click.IntRange(min=1, max=64),
              help="Runs held at the same time.")
@click.option("--endpoint", default=None, metavar="URL",
              help="An agent behind a URL: the OTLP/HTTP collector (storing into --data) its spans and the runs' go to.")
@click.option("--model-url", "model_url", default=None, metavar="URL",
              help="An agent behind a URL: the OpenAI-compatible base URL its model calls are forwarded to by the "
                   "check's proxy (default: $OPENAI_BASE_URL, else https://api.openai.com/v1).")
@click.option("--judge-model", envvar="TRACEDAG_JUDGE_MODEL", default=None,
              help="A model step with no passing run of its scenario gets a correction this judge writes "
                   "(env TRACEDAG_JUDGE_MODEL; key as for tracedag score).")
@click.option("--judge-base-url", envvar="TRACEDAG_JUDGE_BASE_URL", default=None,
              help="OpenAI-compatible endpoint of the judge (env TRACEDAG_JUDGE_BASE_URL).")
def confirm_command(data: Path, agent: str, agent_opts: tuple[str, ...], conversations: tuple[str, ...],
                    where: str | None, failed_only: bool, strategy: str, times: int, replacement: Path | None,
                    parallel: int, endpoint: str | None = None, model_url: str | None = None,
                    judge_model: str | None = None, judge_base_url: str | None = None) -> None:
    """Check root causes by counterfactual replay: re-run each failed conversation with only its root-cause
    step's output replaced.

    A tool root cause gets the recorded result of a passing call of the same tool with the same arguments
    (a parameter-generation failure: the corrected call of a passing run of the same scenario), else
    --replacement; a model step gets the same step's output in a passing run of the same scenario, else a
    correction written by the judge (--judge-model). The
    tool calls before the root step are served from the recording, the rest runs live, --times times.
    Verdict: confirmed when the final failure disappears (or the downstream step scores rise by 0.30) in
    most runs, refuted when it persists, inconclusive otherwise or when no replacement exists. An agent
    behind a URL gets, with every request of a run, a base URL on a local proxy (header
    X-Tracedag-Model-Base-URL): its model calls sent there are forwarded to --model-url except the
    root-cause call, which gets the replacement, and it asks <base>/tracedag/tools for its tools; its spans
    go to the collector --endpoint names. Stored in the root_cause_checks table; tracedag query root_causes
    shows it as its confirmed column. Exit code 0 when every check was stored; 1 when the runs' spans did
    not all reach the store (no verdict is stored then).
    """
    from tracedag.pipeline.commands.replay import _sink
    from tracedag.pipeline.demo.replay_example import example_target
    from tracedag.pipeline.replay import Selection, load_target, parse_opts
    from tracedag.pipeline.replay.confirm import plan_checks, select_checks
    from tracedag.pipeline.replay.confirm_run import default_confirm_id, judge, run_checks, write_checks
    from tracedag.pipeline.replay.confirm_scores import score_runs
    from tracedag.pipeline.score.judge.config import JudgeConfig

    remote = agent.startswith(("http://", "https://"))
    if remote != (endpoint is not None):
        raise click.ClickException("--endpoint goes with an agent behind a URL (the collector its spans go to) "
                                   "and an agent behind a URL needs it")
    sources, causes = select_checks(data, Selection(conversations, where, None, failed_only), strategy)
    corrector = JudgeConfig.from_env(model=judge_model, base_url=judge_base_url) if judge_model else None
    checks = plan_checks(data, sources, causes, replacement, corrector)
    target = load_target(agent, parse_opts(agent_opts), {"example": example_target})
    replay_id = default_confirm_id()
    with _sink(data, endpoint) as url, _proxied(target, checks, agent if remote else None, model_url) as held:
        result = run_checks(checks, held, url, times, replay_id, parallel)
    if result is not None and result.spans_lost:  # verdicts from missing spans would be wrong: none stored
        raise click.ClickException(f"the runs' spans did not all reach {data}: no verdict stored (replay_id={replay_id})")
    if remote and result is not None:
        _wait_for_agent(data, result, target.service_name, replay_id)
    if result is not None:
        score_runs(data)  # the runs' downstream step scores, for the score-based part of the verdict
    rows = judge(data, checks, result, agent, replay_id)
    write_checks(data, rows)
    _report(checks, rows, data)


@contextmanager
def _proxied(target: Target, checks: list[PlannedCheck], url: str | None, model_url: str | None) -> Iterator[Target]:
    """``target`` itself, or for an agent behind ``url`` the target whose runs get a base URL on a model proxy."""
    if url is None:
        yield target
        return
    import os

    from tracedag.pipeline.replay.confirm_proxy import ModelProxy, ProxiedTarget, probe_agent

    probe_agent(url)
    proxy = ModelProxy(model_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1")
    try:
        yield ProxiedTarget(target, proxy, checks)
    finally:
        proxy.close()


def _wait_for_agent(data: Path, result: ReplayResult, service: str, replay_id: str) -> None:
    from tracedag.pipeline.replay.confirm_proxy import wait_for_agent

    turns = {r.run.run_id: len(r.run.turns) for r in result.records if not r.outcome.stopped}
    if turns and not wait_for_agent(data, turns, service):
        raise click.ClickException(f"the agent's spans of the runs did not all reach {data} within 60 s (does it "
                                   f"export to --endpoint?): no verdict stored (replay_id={replay_id})")


def _report(checks: list[PlannedCheck], rows: list[dict[str, Any]], data: Path) -> None:
    from rich.markup import escape
    from rich.table import Table

    from tracedag.pipeline.commands._table import whole_console

    table = Table(title="root cause checks")
    for col in ("conversation", "root cause", "replacement", "runs", "failed again", "verdict"):
        table.add_column(col)
    for row in rows:
        table.add_row(escape(str(row["conversation_id"])), escape(f"{row['root_step_type']} {row['root_step_name']}"),
                      escape(str(row["replacement_kind"] or "none")), str(row["runs"]), str(row["failures_after"]),
                      str(row["verdict"]))
    console = whole_console()
    console.print(table)
    for row in rows:
        console.print(f"{row['conversation_id']}: {row['verdict']}: {row['reason']}", highlight=False, markup=False,
                      soft_wrap=True)
    counts = {v: sum(1 for r in rows if r["verdict"] == v) for v in ("confirmed", "refuted", "inconclusive")}
    console.print(f"{len(checks)} root causes checked: {counts['confirmed']} confirmed, {counts['refuted']} refuted, "
                  f"{counts['inconclusive']} inconclusive; stored in root_cause_checks; next: tracedag query "
                  f"root_causes --data {data} --param per=conversation", highlight=False, markup=False, soft_wrap=True)


COMMANDS: list[click.Command] = [confirm_command]
