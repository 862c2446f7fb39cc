"""Share of root causes confirmed by counterfactual replay (``tracedag confirm``), per root-cause strategy.

Two sets of failed conversations, each checked with the root causes of every strategy (greedy,
full_path_min, weighted, agenteval), ``--times`` runs each:

- **demo**: the store ``tracedag demo --seed S`` writes (the bundled court-booking agent), re-run with
  the example agent;
- **real instrumentation**: the parameter-generation scenarios of ``tests/rca_agents.py`` (the official
  ``openai`` client against a scripted local server, traced by ``opentelemetry-instrumentation-openai-v2``
  with and without message content and by ``openinference-instrumentation-openai``; the application's
  tool spans), recorded here so they can be re-run: the agent asks the recorded-tools mechanism before
  running a tool (``tracedag.instrument.recorded.serve``, as ``td.tool`` steps do), the scenarios of a
  dialect share one ``scenario_id`` and have one passing conversation (the weather of Paris asked and
  answered), so a made-up call's corrected call is that conversation's call. Each run replays its case's
  scripted model replies, then a final answer once the script is used up.

Per strategy and set it prints the root causes checked, confirmed / refuted / inconclusive, the share
confirmed (of all, and of the conclusive ones), and the conversations where this strategy's root cause
was refuted or inconclusive while another strategy's was confirmed. The runs of each check go to a
store of their own (the sources' store keeps only the verdicts).

    python bench/confirm.py [--seed 7] [--times 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.rca_agents, tests.realspans

from tests import rca_agents  # noqa: E402
from tests.realspans import environ, fake_openai_server  # noqa: E402
from tracedag import instrument as td  # noqa: E402
from tracedag.instrument import setup  # noqa: E402
from tracedag.instrument.labels import CONVERSATION_ID, current_labels  # noqa: E402
from tracedag.instrument.recorded import MISSING, serve  # noqa: E402

STRATEGIES = ("greedy", "full_path_min", "weighted", "agenteval")
_SOURCE = "tracedag.source_conversation_id"
QUESTION = "What's the weather?"


class ServedAgent(rca_agents.Agent):
    """``tests.rca_agents.Agent`` whose tools ask the run's recording first and whose first model call
    records the user's message (so a replay reads the turn in every dialect)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._told = False

    def _chat(self, messages: list[dict[str, Any]], tools: bool = True) -> Any:
        if not self._told:
            td.user_message(QUESTION)
            self._told = True
        kwargs: dict[str, Any] = {"tools": [rca_agents.WEATHER_TOOL]} if tools else {}
        return self.client.chat.completions.create(model="gpt-4o-mini", messages=messages, **kwargs)

    def _tool(self, call: Any) -> tuple[str, bool]:
        from opentelemetry.trace import Status, StatusCode

        with self.tracer.start_as_current_span(f"execute_tool {call.function.name}", attributes=self._tool_attrs(call),
                                               record_exception=False, set_status_on_exception=False) as span:
            try:
                served = serve(span, call.function.name, call.function.arguments)
                result = served if served is not MISSING else self.tools[call.function.name](
                    **json.loads(call.function.arguments))
            except Exception as e:
                span.record_exception(e)
                span.set_status(Status(StatusCode.ERROR, str(e)))
                return f"Error: {type(e).__name__}: {e}", False
            key = "output.value" if self.dialect == "openinference" else "gen_ai.tool.call.result"
            span.set_attribute(key, str(result))
            return str(result), True


# The scenarios of tests/rca_agents.py plus the scenario's passing run (a made-up call's corrected call is
# a passing call of the same scenario: real traffic has one); every script ends with the answer a model
# gives once it has the weather, for a run that goes on where its source gave up.
_PASSING = ("passing", [rca_agents._reply(None, [rca_agents._call("c1", "lookup_weather", {"city": "Paris"})]),
                        rca_agents._reply("It is 21C and sunny in Paris.")], {}, None)
_ANSWER = rca_agents._reply("It is 21C and sunny in Paris.")
CASES = {f"conv-{name}-{dialect}": (name, dialect, [*replies, _ANSWER], options)
         for dialect in rca_agents.DIALECTS for name, replies, options, _truth in [*rca_agents._PARAMGEN, _PASSING]}


@contextmanager
def _instrumented(dialect: str) -> Iterator[Any]:
    """The dialect's openai instrumentation on the provider ``td`` exports with."""
    if dialect == "openinference":
        from openinference.instrumentation.openai import OpenAIInstrumentor as Instrumentor
    else:
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor as Instrumentor
    content = "NO_CONTENT" if dialect.endswith("no-content") else "SPAN_ONLY"
    provider = setup._state.provider
    with environ(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=content,
                 OTEL_SEMCONV_STABILITY_OPT_IN="gen_ai_latest_experimental"):
        instrumentor = Instrumentor()
        instrumentor.instrument(tracer_provider=provider)
        try:
            yield provider
        finally:
            instrumentor.uninstrument()


def weather_turn(history: list[dict[str, Any]]) -> str:
    """One conversation of a case (the source's in a check, the current one when recording)."""
    labels = current_labels()
    conversation = str(labels.get(CONVERSATION_ID))
    name, dialect, replies, options = CASES[str(labels.get(_SOURCE, conversation))]
    with fake_openai_server(replies) as srv, _instrumented(dialect) as provider:
        agent = ServedAgent(dialect, srv.base_url, provider.get_tracer("weather-app"), None,
                            {"lookup_weather": rca_agents.lookup_weather}, **options)
        try:
            agent.run(QUESTION, conversation)
        except RuntimeError:  # the agent that gives up
            return "gave up"
    return "done"


def record_weather(data: Path) -> None:
    """Hold every case once into ``data`` (one scenario per dialect), then build and score."""
    from tracedag.pipeline.replay.confirm_scores import score_runs
    from tracedag.pipeline.service import CollectorConfig, start_collector

    collector = start_collector(CollectorConfig(data=data, http_port=0, grpc_port=None))
    try:
        td.configure(f"http://127.0.0.1:{collector.http_port}", service_name="weather-agent", set_global=False,
                     schedule_delay_millis=50)
        for cid, (_name, dialect, _replies, _options) in CASES.items():
            with td.conversation(cid), td.run_labels(scenario_id=f"weather-{dialect}"):
                weather_turn([{"role": "user", "content": QUESTION}])
        td.force_flush(30_000)
        td.shutdown()
        collector.flush()
    finally:
        collector.stop()
    score_runs(data)


def check(data: Path, target: Any, strategy: str, times: int, runs: Path) -> dict[str, str]:
    """Check every failed conversation's root cause by ``strategy``; conversation -> verdict."""
    from tracedag.pipeline.replay.confirm import plan_checks, select_checks
    from tracedag.pipeline.replay.confirm_run import judge, run_checks, write_checks
    from tracedag.pipeline.replay.confirm_scores import score_runs
    from tracedag.pipeline.replay.source import Selection
    from tracedag.pipeline.service import CollectorConfig, start_collector

    sources, causes = select_checks(data, Selection(failed_only=True), strategy)
    checks = plan_checks(data, sources, causes)
    collector = start_collector(CollectorConfig(data=runs, http_port=0, grpc_port=None))
    try:
        result = run_checks(checks, target, f"http://127.0.0.1:{collector.http_port}", times,
                            f"bench-{strategy}", set_global=False)
        collector.flush()
    finally:
        collector.stop()
    if result is not None:
        score_runs(runs)
    rows = judge(data, checks, result, target.name, f"bench-{strategy}", runs_data=runs)
    write_checks(data, rows)
    return {str(r["conversation_id"]): str(r["verdict"]) for r in rows}


def figures(label: str, data: Path, target: Any, times: int, work: Path) -> None:
    """Check with every strategy; print one row per strategy."""
    verdicts: dict[str, dict[str, str]] = {}
    for strategy in STRATEGIES:
        started = time.perf_counter()
        verdicts[strategy] = check(data, target, strategy, times, work / f"runs-{data.name}-{strategy}")
        print(f"  ({label} {strategy}: {time.perf_counter() - started:.1f} s)", file=sys.stderr)
    print(f"\n{label}: {times} runs per check")
    print("| strategy | checked | confirmed | refuted | inconclusive | confirmed share | of conclusive | "
          "not confirmed where another strategy's root was |")
    print("|---|---|---|---|---|---|---|---|")
    for strategy, mine in verdicts.items():
        counts = {v: sum(1 for x in mine.values() if x == v) for v in ("confirmed", "refuted", "inconclusive")}
        conclusive = counts["confirmed"] + counts["refuted"]
        others = {c for s, v in verdicts.items() if s != strategy for c, x in v.items() if x == "confirmed"}
        missed = sorted(c for c, x in mine.items() if x != "confirmed" and c in others)
        print(f"| {strategy} | {len(mine)} | {counts['confirmed']} | {counts['refuted']} | {counts['inconclusive']} | "
              f"{_share(counts['confirmed'], len(mine))} | {_share(counts['confirmed'], conclusive)} | "
              f"{len(missed)}{' (' + ', '.join(missed[:4]) + ')' if missed else ''} |")


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f} %" if whole else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seed", type=int, default=7, help="tracedag demo --seed")
    parser.add_argument("--times", type=int, default=3, help="runs per check")
    parser.add_argument("--set", dest="sets", action="append", choices=("demo", "real"),
                        help="only these sets (repeatable; default both)")
    args = parser.parse_args()
    sets = args.sets or ["demo", "real"]
    from tracedag.pipeline.demo.replay_example import example_target
    from tracedag.pipeline.replay.targets import TurnTarget

    with tempfile.TemporaryDirectory(prefix="bench-confirm-") as tmp:
        work = Path(tmp)
        if "demo" in sets:
            demo = work / "demo"
            subprocess.run([sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "demo", "--data",
                            str(demo), "--seed", str(args.seed)], check=True, stdout=subprocess.DEVNULL)
            figures(f"demo (seed {args.seed})", demo, example_target({"latency_scale": "0"}), args.times, work)
        if "real" not in sets:
            return
        weather = work / "weather"
        record_weather(weather)
        figures("real instrumentation (tests/rca_agents.py parameter-generation scenarios, 3 dialects)", weather,
                TurnTarget("weather", weather_turn, service_name="weather-agent"), args.times, work)


if __name__ == "__main__":
    main()
