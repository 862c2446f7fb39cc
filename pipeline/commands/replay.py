"""CLI commands: replay."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import click

from tracedag.pipeline.commands._engine import engine_for, engine_options
from tracedag.pipeline.commands._options import data_option

if TYPE_CHECKING:
    from tracedag.pipeline.replay import ReplayResult

_F = TypeVar("_F", bound=Callable[..., Any])


def _with_data(f: _F) -> _F:
    """The shared ``--data`` option, typed for mypy --strict."""
    return data_option(f)


@click.command("replay")
@_with_data
@click.option("--agent", "agent", required=True, metavar="TARGET",
              help="module:function (called per turn with the history, returns the reply), an OpenAI-compatible "
                   "chat-completions base URL (http://host:port/v1), or 'example' (the bundled agent).")
@click.option("--agent-opt", "agent_opts", multiple=True, metavar="NAME=VALUE",
              help="Option of the agent (repeatable). example: variant, seed, fault_rate, noise, latency_scale and "
                   "the tweaks drop_time_rate, skip_availability_rate, calendar_latency, rephrase; URL: model, "
                   "api_key, timeout.")
@click.option("--conversation", "conversations", multiple=True, metavar="ID",
              help="A stored conversation id (or its first trace id) to replay; repeatable. Default: every "
                   "conversation that is not itself a replay.")
@click.option("--where", "where", default=None, metavar="SQL",
              help="Condition over the stored conversations: conversation_id, first_trace_id, traces, spans, "
                   "start_time_unix_nano, end_time_unix_nano, failed, service_name, service_version, agent_name, "
                   "scenario_id, variant_id, replay_index, is_replay.")
@click.option("--since", "since", default=None, metavar="DURATION", help="Only conversations active in the last 30m, 24h, 7d...")
@click.option("--failed", "failed_only", is_flag=True, help="Only conversations with an ERROR span.")
@click.option("--times", default=1, show_default=True, type=click.IntRange(min=1), help="Replays of each conversation.")
@click.option("--variants", default=0, show_default=True, type=click.IntRange(min=0, max=50),
              help="Also replay K rewrites of every conversation (variant_id v1..vK), each --times times.")
@click.option("--rewrite-model", default=None, envvar="TRACEDAG_REWRITE_MODEL",
              help="Rewrite turns with this model (OpenAI-compatible) instead of the offline rules.")
@click.option("--rewrite-base-url", default=None, envvar="TRACEDAG_REWRITE_BASE_URL",
              help="OpenAI-compatible endpoint of --rewrite-model (default: the openai client's).")
@click.option("--parallel", default=1, show_default=True, type=click.IntRange(min=1, max=64),
              help="Conversations held at the same time.")
@click.option("--tools", type=click.Choice(["live", "recorded"]), default="live", show_default=True,
              help="recorded: tracedag.instrument tools return the result recorded in the source conversation for "
                   "the same tool name and arguments instead of running.")
@click.option("--unmatched", type=click.Choice(["live", "fail"]), default="live", show_default=True,
              help="With --tools recorded: a call with no recorded match runs live, or fails the run.")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
              help="A run label on every replayed run (repeatable), e.g. service_version=candidate.")
@click.option("--replay-id", default=None, help="Names the whole replay (run label replay_id; default replay-<time>).")
@click.option("--endpoint", default=None,
              help="Send the spans to this OTLP/HTTP endpoint instead of storing them into --data through an "
                   "in-process collector.")
@click.option("--fail-on-failure", "fail_on_failure", is_flag=True,
              help="Exit 1 when a run's agent failed too (default: a failing agent is a result, listed; exit 1 only "
                   "when a run could not run).")
@engine_options
def replay_command(data: Path, agent: str, agent_opts: tuple[str, ...], conversations: tuple[str, ...],
                   where: str | None, since: str | None, failed_only: bool, times: int, variants: int,
                   rewrite_model: str | None, rewrite_base_url: str | None, parallel: int,
                   tools: Literal["live", "recorded"], unmatched: Literal["live", "fail"], labels: tuple[str, ...],
                   replay_id: str | None, endpoint: str | None, fail_on_failure: bool = False, engine: str = "local",
                   ray_address: str | None = None, workers: int | None = None) -> None:
    """Replay stored conversations against an agent, N times, each run labelled in its spans.

    The user's turns are read from the stored spans; every run carries scenario_id (the source's,
    else the source conversation), replay_index, variant_id, run_id, replay_id, source_trace_id and
    source_conversation_id, so `tracedag determinism`, `tracedag regress` (the replays pair with the
    traffic they replay) and `tracedag validate check` read replays like any traffic. Nothing stored is changed. Exit code 0
    when every run ran to its end (an agent that failed again is a result, listed); 1 when a run
    could not run (the agent raised or was unreachable), when the collector did not take the spans,
    or, with --fail-on-failure, when an agent failed; 130 when interrupted.
    """
    from tracedag.pipeline.demo.replay_example import example_target
    from tracedag.pipeline.replay import ReplayConfig, Selection, load_target, parse_opts, parse_since
    from tracedag.pipeline.replay import replay as run_replay
    from tracedag.pipeline.replay.recording import with_tool_calls
    from tracedag.pipeline.replay.source import select_conversations
    from tracedag.pipeline.replay.variants import ModelRewriter

    selection = Selection(conversations, where, parse_since(since) if since else None, failed_only)
    sources = select_conversations(data, selection)
    if tools == "recorded":
        sources = with_tool_calls(data, sources)
    target = load_target(agent, parse_opts(agent_opts), {"example": example_target})
    with _sink(data, endpoint) as url, engine_for(engine, ray_address, workers) as running, _progress() as advance:
        config = ReplayConfig(endpoint=url, times=times, parallel=parallel, labels=_labels(labels),
                              replay_id=replay_id, tools=tools, unmatched=unmatched, variants=variants,
                              rewriter=ModelRewriter(rewrite_model, rewrite_base_url) if rewrite_model else None,
                              engine=running)
        result = run_replay(sources, target, config, advance)
    _report(result, endpoint or f"{data}", tools)  # an object store's URL, not its work directory
    if running is not None:
        click.echo(f"engine: ray ({running.tasks} tasks, one per run)")
    raise SystemExit(exit_code(result, fail_on_failure))


def exit_code(result: ReplayResult, fail_on_failure: bool) -> int:
    """130 interrupted; 1 when spans were lost, a run could not run, or (asked for) an agent failed; else 0."""
    if result.interrupted:
        return 130
    if result.spans_lost or result.stopped or (fail_on_failure and result.failed):
        return 1
    return 0


def _labels(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip().replace("_", "").replace(".", "").isalnum():
            raise click.BadParameter(f"{pair!r}: expected key=value", param_hint="--label")
        out[key.strip()] = value.strip()
    return out


@contextmanager
def _sink(data: Path, endpoint: str | None) -> Iterator[str]:
    """The OTLP endpoint to send to: the given one (which must answer), or an in-process collector
    storing into ``data``."""
    if endpoint:
        from tracedag.pipeline.replay.export import probe, unreachable_message

        if not probe(endpoint):
            raise click.ClickException(unreachable_message(endpoint))
        yield endpoint
        return
    from tracedag.pipeline.service import CollectorConfig, start_collector

    try:
        collector = start_collector(CollectorConfig(data=data, http_port=0, grpc_port=None))
    except Exception as e:
        raise click.ClickException(f"cannot store the replay into {data}: {e}; or send it to that collector with "
                                   "--endpoint http://HOST:PORT") from e
    try:
        yield f"http://127.0.0.1:{collector.http_port}"
        collector.flush()
    finally:
        collector.stop()


@contextmanager
def _progress() -> Iterator[Callable[[int, int], None]]:
    """``advance(done, total)`` on one ``replay`` bar on stderr, gone when the replay ends."""
    from rich.console import Console

    from tracedag.pipeline.progress import bars

    with bars(console=Console(stderr=True)) as advance:
        shown = [0]

        def step(done: int, total: int) -> None:
            advance("replay", done - shown[0], total)
            shown[0] = done

        yield step


def _report(result: ReplayResult, where: str, tools: str = "live") -> None:
    from tracedag.pipeline.commands._table import whole_console

    console = whole_console()
    console.print(_table(result))
    for r in (result.stopped + result.failed)[:_MAX_ERRORS]:
        what = "could not run" if r.outcome.stopped else "failed"
        console.print(f"{what} {r.run.run_id} (conversation {r.run.source.conversation_id}): {r.outcome.error}",
                      highlight=False, markup=False, soft_wrap=True)
    more = len(result.stopped) + len(result.failed) - _MAX_ERRORS
    if more > 0:
        console.print(f"... and {more} more runs that failed or could not run", highlight=False)
    if tools == "recorded":
        served, live, unmatched = result.tool_counts()
        console.print(f"tool calls: {served} served from the recording, {live} ran live, {unmatched} unmatched "
                      "(failed their run)", highlight=False, soft_wrap=True)
    state = "interrupted: " if result.interrupted else ""
    console.print(f"{state}{len(result.records)} of {result.planned} runs finished, {len(result.failed)} failed, "
                  f"{len(result.stopped)} could not run; spans sent to {where} (replay_id={result.replay_id})",
                  highlight=False, markup=False, soft_wrap=True)
    if result.spans_lost:
        console.print(lost_line(result.delivery, where), highlight=False, markup=False, soft_wrap=True)
        return
    console.print(next_line(where), highlight=False, markup=False, soft_wrap=True)


def _table(result: ReplayResult) -> Any:
    from collections import Counter

    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"replay {escape(result.replay_id)}")
    for col in ("conversation", "turns", "runs", "failed", "could not run", "first error"):
        table.add_column(col)
    runs: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    stopped: Counter[str] = Counter()
    first: dict[str, str] = {}
    turns: dict[str, int] = {}
    for r in result.records:
        cid = r.run.source.conversation_id
        runs[cid] += 1
        turns[cid] = len(r.run.source.turns)
        if r.outcome.error:
            (stopped if r.outcome.stopped else failed)[cid] += 1
            first.setdefault(cid, r.outcome.error)
    for cid in runs:
        table.add_row(escape(cid), str(turns[cid]), str(runs[cid]), str(failed[cid]), str(stopped[cid]),
                      escape(first.get(cid, "")))
    return table


def lost_line(delivery: Any, where: str) -> str:
    """What the collector did not take: nothing stored, or how many spans are missing."""
    if delivery is None or delivery.nothing_stored:
        return f"nothing was stored: the collector behind {where} did not take the spans (is it running?)"
    return (f"{delivery.lost} of {delivery.lost + delivery.sent} spans were not stored: the collector behind "
            f"{where} did not take them")


def next_line(where: str) -> str:
    """The commands that read what was just stored (``--idle 0``: the runs are over, build them now)."""
    if where.startswith(("http://", "https://")):
        return "next: build and score the collector's store, then tracedag determinism"
    quoted = shlex.quote(where)
    return f"next: tracedag build --data {quoted} --idle 0 && tracedag determinism --data {quoted}"


_MAX_ERRORS = 20

COMMANDS: list[click.Command] = [replay_command]
