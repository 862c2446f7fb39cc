"""Evidence for structural validation (``tracedag validate``) on the bundled court-booking agent.

Three stores, each made by the real agent code through the real path (collector over OTLP/HTTP,
Parquet, build, score), as ``tracedag demo`` makes its store:

- **train**: the demo simulation with seed 7 and ``--replays`` replays (both agent variants, every
  conversation path of the designed graph, exact replays and two rephrased variants);
- **test**: the same with seed 8 (other model draws, other calendar faults);
- **skip**: the booking scenarios run by ``SkipsAvailability``, the agent with one change: after
  the date and time it goes straight to proposing a slot it made up and books it, never searching
  the calendar. Nothing errors: the booking system accepts the slot and the agent says it booked.

One model per agent variant is learned from the passing runs of train (``--max-runs`` per
scenario), and every run of test and skip is checked. Ground truth, from the agent's own record of
each conversation (``ConversationResult``), not from the spans: a run is *correct* when it did
what the scenario's user asked: an info question answered without booking; a booking made, of a
slot the calendar returned (the calendar searched before the booking); a declined proposal with a
real slot proposed and nothing booked; and no unrecovered failure. Everything else is a mistake.

Detectors of mistakes, scored by precision, recall and F1 (positive = mistake):
- ``structural``: the run fails ``validate check``;
- ``self-report``: the agent does not claim success (its root span carries no final answer; the
  agent sets one only when it believes the conversation succeeded; the text of its last message
  is a goodbye that never admits a failure);
- ``errors``: the run has a failed trace (a root cause in ``root_causes``);
- ``structural or errors``.

Also: how many of the correct runs pass, split into those that took the scenario's designed path
and those that differ from it (rephrased wording with other optional states: re-asks, extra
visits), how the skipped-availability runs are explained, and, per (agent, scenario), how many
passing runs the model needs before its essential states stop changing (learned from the first
k passing runs of train, k = 2, 3, ...).

    python bench/validate.py [--replays 5] [--max-runs 10] [--keep DIR]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracedag import instrument as td
from tracedag.pipeline.demo import simulate as sim
from tracedag.pipeline.demo import stages
from tracedag.pipeline.demo.agent.booking_agent import BookingAgent, ConversationResult, State
from tracedag.pipeline.demo.config import DemoConfig
from tracedag.pipeline.demo.run import run_demo
from tracedag.pipeline.store.querying import run_sql
from tracedag.pipeline.validate import read_runs
from tracedag.pipeline.validate.checking import check_runs
from tracedag.pipeline.validate.learning import LearnOptions, learn_model
from tracedag.pipeline.validate.runs import RunSteps

AGENTS = ("court_booking.constrained", "court_booking.permissive")


class SkipsAvailability(BookingAgent):
    """The booking agent with one step skipped: it never searches the calendar and books a slot it made up."""

    def _route(self, state: State, node: str) -> str:
        nxt = super()._route(state, node)
        return "propose_slot" if nxt == "check_availability" else nxt

    def _run_node(self, name: str, state: State) -> str:
        if name == "propose_slot" and state.slots is None:  # no calendar search: make a slot up
            state.slots = [{"slot_id": f"court1-{state.date}-{state.time}", "court": 1, "date": state.date,
                            "time": state.time}]
        return super()._run_node(name, state)


class _Quiet:
    def add_task(self, description: str, *, total: float | None = None) -> int:
        return 0

    def update(self, task_id: Any, **kw: Any) -> None:
        return None


def demo_store(data: Path, seed: int, replays: int) -> tuple[Path, dict[str, tuple[tuple[str, ...], ConversationResult]]]:
    """The demo's store for ``seed``; run key -> (intended path, what the agent did)."""
    result = run_demo(DemoConfig(data=data, seed=seed, replays=replays), _Quiet())
    bad = {k: v for k, v in result.stages.items() if v != "ok"}
    if bad:
        raise SystemExit(f"demo stages failed: {bad}")
    s = result.simulation
    return data, {f"{s.simulation_id}/{run.conversation_id}": (run.scenario.intended_path, outcome)
                  for run, outcome in s.results}


def skip_store(data: Path, seed: int, replays: int) -> dict[str, tuple[tuple[str, ...], ConversationResult]]:
    """The booking scenarios run by ``SkipsAvailability`` into a fresh store, built and scored."""
    collector = stages.start(data)
    truth: dict[str, tuple[tuple[str, ...], ConversationResult]] = {}
    try:
        config = sim.SimulationConfig(endpoint=f"http://127.0.0.1:{collector.http_port}", seed=seed, replays=replays,
                                      simulation_id=f"skip-seed{seed}")
        booking = [sc for sc in sim.scenarios(stages.conversation_paths(2)) if "book_court" in sc.intended_path]
        td.configure(config.endpoint, service_name=config.service_name, service_version="1.0", set_global=False)
        try:
            for run in sim.plan(config, booking):
                truth[f"{config.simulation_id}/{run.conversation_id}"] = (run.scenario.intended_path,
                                                                          _skip_one(config, run))
            td.force_flush(30_000)
        finally:
            td.shutdown()
        collector.flush()
    finally:
        stages.stop(collector)
    stages.build(data)
    stages.score(data)
    return truth


def _skip_one(config: sim.SimulationConfig, run: sim.Run) -> ConversationResult:
    key = f"{config.seed}:{run.scenario.scenario_id}:{run.variant_index}:{run.replay_index}"
    agent = SkipsAvailability.create(run.agent_variant, random.Random(f"llm:{run.agent_variant}:{key}"),
                                     random.Random(f"fault:{key}"), fault_rate=config.fault_rate, noise=config.noise)
    labels = td.run_labels(run_id=f"{config.simulation_id}/{run.conversation_id}", simulation_id=config.simulation_id,
                           scenario_id=run.scenario.scenario_id, replay_index=run.replay_index,
                           variant_id=run.variant_id, intended_path=run.scenario.intended_path)
    with td.conversation(run.conversation_id), labels:
        return agent.run(run.scenario.user_turns(run.variant_index))


def correct(intended: Sequence[str], r: ConversationResult) -> bool:
    """Did the agent do what the scenario's user asked (see the module docstring)?"""
    if r.failed:  # an unrecovered failure; a failed visit a later one made good does not count
        return False
    path = list(r.path)
    if "club_info" in intended:
        return "club_info" in path and r.booking_id is None
    searched = "check_availability" in path
    if "book_court" in intended:
        return r.booking_id is not None and searched and path.index("check_availability") < path.index("book_court")
    return r.booking_id is None and searched and "propose_slot" in path


def claims(data: Path) -> dict[str, bool]:
    """Run key -> the agent claimed success (its root span carries a final answer)."""
    rows = run_sql(data, "select run_id, bool_and(output_text is not null) as ok from spans "
                         "where parent_span_id is null group by run_id").to_pylist()
    return {r["run_id"]: bool(r["ok"]) for r in rows}


def prf(flags: list[tuple[bool, bool]]) -> tuple[float, float, float]:
    """Precision, recall, F1 of (predicted mistake, actual mistake) pairs."""
    tp = sum(1 for p, a in flags if p and a)
    fp = sum(1 for p, a in flags if p and not a)
    fn = sum(1 for p, a in flags if not p and a)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def learn_models(train: list[RunSteps], max_runs: int | None) -> dict[str, Any]:
    return {a: learn_model(train, LearnOptions(agent=a, max_runs=max_runs), {}) for a in AGENTS}


def evaluate(models: dict[str, Any], runs: list[RunSteps], truth: dict[str, Any],
             claimed: dict[str, bool]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for agent, model in models.items():
        for row in check_runs([r for r in runs if r.agent == agent], model, agent).to_pylist():
            intended, outcome = truth[row["run_key"]]
            out.append({**row, "correct": correct(intended, outcome), "claimed": claimed[row["run_key"]],
                        "designed_path": tuple(outcome.path) == tuple(intended)})
    return out


def report(rows: list[dict[str, Any]], label: str) -> None:
    judged = [r for r in rows if r["passed"] is not None]
    mistake = [not r["correct"] for r in judged]
    detectors = {
        "structural": [not r["passed"] for r in judged],
        "self-report": [not r["claimed"] for r in judged],
        "errors": [bool(r["run_failed"]) for r in judged],
        "structural or errors": [(not r["passed"]) or bool(r["run_failed"]) for r in judged],
    }
    print(f"\n{label}: {len(judged)} runs checked, {sum(mistake)} mistakes by ground truth")
    print(f"  {'detector':<22} {'precision':>9} {'recall':>7} {'F1':>6}   F1 constrained / permissive")
    for name, flags in detectors.items():
        p, r, f = prf(list(zip(flags, mistake, strict=True)))
        per = [prf([(fl, m) for fl, m, row in zip(flags, mistake, judged, strict=True) if row["agent"] == a])[2]
               for a in AGENTS]
        print(f"  {name:<22} {p:9.2f} {r:7.2f} {f:6.2f}   {per[0]:.2f} / {per[1]:.2f}")
    silent = [r for r in judged if not r["correct"] and r["claimed"] and not r["run_failed"]]
    print(f"  silent mistakes (agent claims success, no failed trace): {len(silent)}, "
          f"structural flags {sum(1 for r in silent if not r['passed'])}")


def wording_and_skips(rows: list[dict[str, Any]]) -> None:
    ok = [r for r in rows if r["correct"] and r["passed"] is not None]
    same = [r for r in ok if r["designed_path"]]
    other = [r for r in ok if not r["designed_path"]]
    rephrased = [r for r in ok if "-base-" not in r["run_key"]]
    print(f"\ncorrect runs: {sum(r['passed'] for r in ok)} of {len(ok)} pass "
          f"({sum(r['passed'] for r in rephrased)} of {len(rephrased)} rephrased; "
          f"on the designed path {sum(r['passed'] for r in same)} of {len(same)}, "
          f"with other optional states {sum(r['passed'] for r in other)} of {len(other)})")
    for r in ok:
        if not r["passed"]:
            print(f"  correct but failed: {r['run_key']}: {r['explanation']}")
    skips = [r for r in rows if r["run_key"].startswith("skip-")]
    if skips:
        named = sum(1 for r in skips if "check_availability" in (r["missing"] or []))
        print(f"skipped availability: {sum(not r['passed'] for r in skips)} of {len(skips)} fail, {named} name "
              f"check_availability; {sum(r['claimed'] for r in skips)} claimed success, "
              f"{sum(bool(r['run_failed']) for r in skips)} have a failed trace")
        reasons = Counter(r["explanation"] for r in skips if not r["passed"])
        for text, n in reasons.most_common(2):
            print(f"  {n} x {text}")


def convergence(train: list[RunSteps]) -> None:
    """Per (agent, scenario): passing runs needed before the essential states stop changing."""
    needed: list[int] = []
    by: dict[tuple[str, str], list[RunSteps]] = defaultdict(list)
    for r in train:
        if r.passed:
            by[(r.agent, r.scenario)].append(r)
    print("\npassing runs until the model stops changing (first k passing runs of train, k = 2..n):")
    for (agent, scenario), runs in sorted(by.items()):
        seq = [learn_model(runs, LearnOptions(agent=agent, max_runs=k), {}).scenarios[scenario].essential
               for k in range(2, len(runs) + 1)]
        stable = next(k for k in range(2, len(runs) + 1) if all(e == seq[k - 2] for e in seq[k - 2:]))
        needed.append(stable)
        print(f"  {agent.rsplit('.', 1)[-1]:<12} {scenario}: {stable} of {len(runs)} ({len(seq[-1])} essential)")
    print(f"  median {statistics.median(needed)}, max {max(needed)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replays", type=int, default=5, help="exact replays per scenario and variant (train)")
    parser.add_argument("--max-runs", type=int, default=10, help="passing runs per scenario to learn from")
    parser.add_argument("--keep", type=Path, default=None, help="keep the three stores under this directory")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="tracedag-validate-"))
    train, _ = demo_store(root / "train", 7, args.replays)
    test, truth = demo_store(root / "test", 8, 3)
    truth.update(skip_store(root / "skip", 8, 3))
    train_runs = read_runs(train)
    test_runs = read_runs(test) + read_runs(root / "skip")
    claimed = {**claims(test), **claims(root / "skip")}
    for max_runs in (3, args.max_runs):
        rows = evaluate(learn_models(train_runs, max_runs), test_runs, truth, claimed)
        report(rows, f"learned from up to {max_runs} passing runs per scenario (train seed 7); "
                     "checked: test seed 8 + skipped availability")
        if max_runs == args.max_runs:
            wording_and_skips(rows)
    convergence(train_runs)
    print(f"\nstores under {root}")


if __name__ == "__main__":
    main()
