"""Benchmark of ``tracedag simulate --agent example --graph``: simulated conversations/s, CCR and PCR.

Both variants of the bundled booking agent (constrained, permissive) against the designed graph
(its DFS paths, each node at most ``--max-visits`` times, are the intents), every persona of the
default file, ``--conversations`` per intent and persona, the offline scripted user, restarts up to
``--max-backtracks``; spans to the in-process collector into a fresh store (time to the last span
stored). Baseline, same run: the same intents held once each by the agent directly inside run
labels (what ``tracedag simulate`` without --agent does per conversation), no users, no
backtracking. Medians of ``--runs``.

Parallel: the constrained variant again with ``--parallel`` conversations at a time (same run).

An agent behind a URL (``--remote``): the tiny graph's wrong-branch agent
(``tests/replay/sim_agents.py``) served by ``tests/replay/remote_agent.py`` in a process of its own,
exporting (50 ms batch delay) to a ``tracedag collect`` process, its nodes read back from that
store by trace id; baseline, same run: the same agent logic as a ``module:function`` target in
process. Run from the repository root.

    python bench/usersim.py --conversations 3 --runs 3 --remote 10
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tracedag import instrument as td
from tracedag.pipeline.demo.agent.booking_agent import BookingAgent
from tracedag.pipeline.demo.agent.booking_graph import agent_graph
from tracedag.pipeline.demo.replay_example import example_target
from tracedag.pipeline.demo.simulate import Scenario
from tracedag.pipeline.replay import load_target
from tracedag.pipeline.replay.simulation import SimulationConfig, SimulationResult, rates, simulate_users
from tracedag.pipeline.replay.users import Intent, Persona, ScriptedUser, intents, load_personas
from tracedag.pipeline.service import CollectorConfig, start_collector
from tracedag.schemas.agent_graph import parse_graph

ROOT = Path(__file__).resolve().parent.parent


def _stored(work: object) -> tuple[float, object]:
    with tempfile.TemporaryDirectory() as tmp:
        collector = start_collector(CollectorConfig(data=Path(tmp) / "data", http_port=0, grpc_port=None))
        started = time.perf_counter()
        try:
            out = work(f"http://127.0.0.1:{collector.http_port}")  # type: ignore[operator]
            collector.flush()
        finally:
            collector.stop()
        return time.perf_counter() - started, out


def simulated(variant: str, conversations: int, backtracks: int, max_visits: int,
              parallel: int = 1) -> tuple[float, SimulationResult]:
    """Seconds and result of one simulation of ``variant``."""
    graph = parse_graph(agent_graph("constrained"))
    target = example_target({"variant": variant})
    found, personas = intents(graph, max_visits), load_personas()

    def work(endpoint: str) -> SimulationResult:
        config = SimulationConfig(endpoint, conversations, backtracks, f"bench-{variant}", set_global=False,
                                  parallel=parallel)
        return simulate_users(target, ScriptedUser(7, target.scripted_turns), found, personas, config)

    seconds, result = _stored(work)
    assert isinstance(result, SimulationResult)
    return seconds, result


def direct(n: int, max_visits: int) -> float:
    """Seconds for ``n`` conversations held by the agent directly (cycling over the intents)."""
    paths = [i.path for i in intents(parse_graph(agent_graph("constrained")), max_visits)]

    def work(endpoint: str) -> None:
        td.configure(endpoint, service_name="court-booking-agent", set_global=False)
        for k in range(n):
            path = paths[k % len(paths)]
            agent = BookingAgent.create("constrained", random.Random(k), random.Random(-k))
            with td.conversation(f"direct-{k}"), td.run_labels(run_id=f"direct-{k}", scenario_id=str(k % len(paths))):
                agent.run(Scenario("b", path).user_turns(0))
        td.force_flush()
        td.shutdown()

    return _stored(work)[0]


@contextmanager
def _collect_process(data: Path) -> Iterator[str]:
    """``tracedag collect`` as a process of its own (ports 0); yields its OTLP/HTTP URL."""
    proc = subprocess.Popen([sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "collect",
                             "--http-port", "0", "--grpc-port", "0", "--data", str(data)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        found = None
        while found is None:
            line = proc.stdout.readline()
            assert line, "the collector did not start"
            found = re.search(r"http_port=(\d+)", line)
        yield f"http://127.0.0.1:{found.group(1)}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


@contextmanager
def _remote_agent(otlp: str) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.replay.remote_agent", "--otlp", otlp],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        yield f"http://127.0.0.1:{int(proc.stdout.readline())}/v1"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)


def _tiny() -> tuple[list[Intent], list[Persona]]:
    sys.path.insert(0, str(ROOT))  # the tests' agents, as `tracedag simulate` finds modules of the working directory
    from tests.replay.sim_agents import TINY_GRAPH

    return intents(parse_graph(TINY_GRAPH), 1), [Persona("plain", "")]


def remote(conversations: int, parallel: int = 1) -> tuple[float, SimulationResult]:
    """Seconds and result of the wrong-branch agent behind a URL, nodes read from the store."""
    found, personas = _tiny()
    with tempfile.TemporaryDirectory() as tmp, _collect_process(Path(tmp) / "data") as otlp, _remote_agent(otlp) as url:
        target = load_target(url, {}, {})
        config = SimulationConfig(otlp, conversations, 2, "bench-remote", set_global=False,
                                  nodes_from=Path(tmp) / "data", settle=15, parallel=parallel)
        started = time.perf_counter()
        result = simulate_users(target, ScriptedUser(7), found, personas, config)
        return time.perf_counter() - started, result


def in_process(conversations: int) -> tuple[float, SimulationResult]:
    """Seconds and result of the same agent logic as a module:function target, into an in-process collector."""
    found, personas = _tiny()
    target = load_target("tests.replay.sim_agents:wrong_branch", {}, {})

    def work(endpoint: str) -> SimulationResult:
        config = SimulationConfig(endpoint, conversations, 2, "bench-local", set_global=False)
        return simulate_users(target, ScriptedUser(7), found, personas, config)

    seconds, result = _stored(work)
    assert isinstance(result, SimulationResult)
    return seconds, result


def _remote_rows(conversations: int, runs: int, parallel: int) -> None:
    local = [in_process(conversations) for _ in range(runs)]
    far = [remote(conversations) for _ in range(runs)]
    far_p = [remote(conversations, parallel) for _ in range(runs)]
    base = len(local[0][1].conversations) / statistics.median(s for s, _ in local)
    rate = len(far[0][1].conversations) / statistics.median(s for s, _ in far)
    rate_p = len(far_p[0][1].conversations) / statistics.median(s for s, _ in far_p)
    print(f"agent behind a URL, tiny graph, {len(far[0][1].conversations)} conversations, B=2, median of {runs}")
    for name, r, result in (("baseline: same agent logic in process (module:function)", base, local[0][1]),
                            ("agent behind a URL, nodes read from the store", rate, far[0][1]),
                            (f"agent behind a URL, --parallel {parallel}", rate_p, far_p[0][1])):
        ccr, pcr = rates(result.conversations)
        waited = (f"  {result.seconds / result.waits.traces:.2f} s a turn ({result.waits.traces} turns, "
                  f"{result.waits.timed_out} not in time)" if result.waits and result.waits.traces else "")
        print(f"  {name:<58} {r:8.1f} conversations/s   x{r / base:.3f}   CCR {100 * ccr:.1f}%  PCR {100 * pcr:.1f}%  "
              f"{result.runs} runs{waited}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=3)
    parser.add_argument("--max-backtracks", type=int, default=2)
    parser.add_argument("--max-visits", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--remote", type=int, default=0, help="conversations per intent for the URL agent (0: skip)")
    parser.add_argument("--only-remote", action="store_true", help="only the URL agent's figures")
    args = parser.parse_args()
    if args.only_remote:
        _remote_rows(args.remote or 5, args.runs, args.parallel)
        return
    n = 0
    rows: list[tuple[str, float, str]] = []
    for variant in ("constrained", "permissive"):
        results = [simulated(variant, args.conversations, args.max_backtracks, args.max_visits) for _ in range(args.runs)]
        seconds = statistics.median(s for s, _ in results)
        result = results[0][1]
        n = len(result.conversations)
        ccr, pcr = rates(result.conversations)
        rows.append((f"simulate --agent example --agent-opt variant={variant}", n / seconds,
                     f"CCR {100 * ccr:.1f}%  PCR {100 * pcr:.1f}%  {result.runs} runs"))
    par = [simulated("constrained", args.conversations, args.max_backtracks, args.max_visits, args.parallel)
           for _ in range(args.runs)]
    ccr, pcr = rates(par[0][1].conversations)
    rows.insert(1, (f"simulate --agent example (constrained) --parallel {args.parallel}",
                    len(par[0][1].conversations) / statistics.median(s for s, _ in par),
                    f"CCR {100 * ccr:.1f}%  PCR {100 * pcr:.1f}%  {par[0][1].runs} runs"))
    base = n / statistics.median(direct(n, args.max_visits) for _ in range(args.runs))
    print(f"simulated users, {n} conversations per variant (intents x 4 personas x {args.conversations}), "
          f"B={args.max_backtracks}, median of {args.runs}")
    print(f"  {'baseline: agent held directly, one run per conversation':<58} {base:8.1f} conversations/s   x1.00")
    for name, rate, figures in rows:
        print(f"  {name:<58} {rate:8.1f} conversations/s   x{rate / base:.2f}   {figures}")
    if args.remote:
        _remote_rows(args.remote, args.runs, args.parallel)


if __name__ == "__main__":
    main()
