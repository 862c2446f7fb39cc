"""Learn a scenario's skeleton from its passing runs: prefix tree, conservative merging, dominators.

For one scenario, each passing run is a sequence of states (``runs.states_of``). The
steps (DESIGN.md §10):

1. **Prefix-tree acceptor** (PTA): one tree node per distinct prefix of the sequences; the node of
   every complete sequence accepts.
2. **Conservative merging**: two tree nodes merge only when they stand for the same visit of the
   same state: the same *merge key* (the state name, exactly, or after ``normalize`` replaced
   ids, numbers and dates in it) and the same visit number (the k-th time the run reaches that
   key; a loop's second pass is not its first, as the DAG's loop unrolling counts iterations).
   All accepting nodes merge into one accepting state. With ``merge="semantic"``, names an LLM
   confidently calls the same step are renamed to one first (``semantic``).
3. **Dominators** (``networkx.immediate_dominators``) of the merged graph from its start: the
   states that dominate acceptance lie on every path of every run to the end, so they are the
   *essential* states; everything else is optional. The dominators of one node form a chain, so
   the essential states have one order, the order each run visits them in.

Merging generalizes: a state that runs visit in different orders relative to another becomes
skippable in the merged graph and stops being essential. The model therefore errs towards fewer
essential states (fewer false alarms), never towards essential states a passing run lacks.
"""

from __future__ import annotations

import logging
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from tracedag.pipeline.validate.model import Model, ScenarioModel, StateSpec
from tracedag.pipeline.validate.runs import DEFAULT_STATE, RunSteps, Step, agents_of, states_of
from tracedag.pipeline.validate.semantic import SameStepAsker, SemanticResult, semantic_merges
from tracedag.schemas.errors import TracedagError

logger = logging.getLogger(__name__)

MERGES = ("normalized", "exact", "semantic")
"""Merge keys: ``normalized`` (ids, numbers and dates in names replaced), ``exact`` names, or ``semantic``
(normalized, then names an LLM confidently calls the same step merged: ``semantic``)."""
START = "(start)"
ACCEPT = "(accept)"

_L, _R = r"(?<![0-9A-Za-z])", r"(?![0-9A-Za-z])"  # word edges where "_" and "-" separate
_NORMALIZE = (
    (re.compile(_L + r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}" + _R, re.I), "<id>"),
    (re.compile(_L + r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?" + _R),
     "<date>"),
    (re.compile(_L + r"(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}" + _R, re.I), "<id>"),
    (re.compile(r"\d+(?:\.\d+)?"), "<n>"),
)


def normalize(name: str) -> str:
    """``name`` with UUIDs and hex ids -> ``<id>``, ISO dates -> ``<date>``, other numbers -> ``<n>``."""
    for pattern, repl in _NORMALIZE:
        name = pattern.sub(repl, name)
    return name


def visit_name(key: str, visit: int) -> str:
    """How a state is written: its key, with ``#k`` from its second visit on (``ask_details#2``)."""
    return key if visit == 1 else f"{key}#{visit}"


@dataclass(frozen=True)
class Visit:
    """One state of a run: its visit name (key and visit number), the raw name and the step."""

    name: str
    raw: str
    step: Step


def merge_key(raw: str, merge: str) -> str:
    """The key a state name merges by before any semantic renames: normalized unless ``merge`` is exact."""
    return raw if merge == "exact" else normalize(raw)


def visits(run: RunSteps, state: str, merge: str, renames: Mapping[str, str] | None = None) -> list[Visit]:
    """The run as merged states: each step's merge key (then ``renames``, the semantic merges), numbered
    by visit (``visit_name``)."""
    seen: Counter[str] = Counter()
    out: list[Visit] = []
    renames = renames or {}
    for raw, step in states_of(run, state):
        key = merge_key(raw, merge)
        key = renames.get(key, key)
        seen[key] += 1
        out.append(Visit(visit_name(key, seen[key]), raw, step))
    return out


@dataclass
class Skeleton:
    """What one scenario's passing runs taught: the merged graph and its essential states."""

    states: list[str]
    """Every merged state, in the order runs visit them (mean relative position)."""
    essential: list[str]
    """The dominators of acceptance, in visiting order."""
    edges: Counter[tuple[str, str]]
    support: dict[str, int]
    """Runs that visit each state."""
    pta_states: int
    max_duration_ns: dict[str, int] = field(default_factory=dict)
    raw_names: dict[str, list[str]] = field(default_factory=dict)
    """The state names each merged state stands for (more than one when normalizing merged them)."""


def prefix_tree(sequences: Sequence[Sequence[str]]) -> tuple[nx.DiGraph, set[int]]:
    """The prefix-tree acceptor: node 0 is the empty prefix; node attribute ``state`` is the last
    state of the prefix; returns the tree and its accepting nodes."""
    tree = nx.DiGraph()
    tree.add_node(0, state=START)
    child: dict[tuple[int, str], int] = {}
    accepting: set[int] = set()
    for seq in sequences:
        node = 0
        for state in seq:
            nxt = child.get((node, state))
            if nxt is None:
                nxt = child[(node, state)] = tree.number_of_nodes()
                tree.add_node(nxt, state=state)
                tree.add_edge(node, nxt)
            node = nxt
        accepting.add(node)
    return tree, accepting


def merge_tree(tree: nx.DiGraph, accepting: set[int]) -> nx.DiGraph:
    """The quotient of the prefix tree: nodes with the same state merge, accepting ones into ACCEPT."""
    merged = nx.DiGraph()
    merged.add_node(START)
    merged.add_node(ACCEPT)
    for u, v in tree.edges:
        merged.add_edge(tree.nodes[u]["state"], tree.nodes[v]["state"])
    for node in accepting:
        merged.add_edge(tree.nodes[node]["state"], ACCEPT)
    return merged


def dominators_of_accept(graph: nx.DiGraph) -> list[str]:
    """The states that dominate ACCEPT from START, nearest START first (START and ACCEPT excluded)."""
    idom = nx.immediate_dominators(graph, START)
    chain: list[str] = []
    node = idom.get(ACCEPT)
    while node is not None and node != START:
        chain.append(node)
        node = idom[node]
    return chain[::-1]


def learn_skeleton(runs: Sequence[RunSteps], state: str, merge: str,
                   renames: Mapping[str, str] | None = None) -> Skeleton:
    """The skeleton of one scenario from its passing ``runs`` (at least one)."""
    seqs = [visits(r, state, merge, renames) for r in runs]
    names = [[v.name for v in seq] for seq in seqs]
    tree, accepting = prefix_tree(names)
    graph = merge_tree(tree, accepting)
    essential = dominators_of_accept(graph)
    edges: Counter[tuple[str, str]] = Counter()
    support: Counter[str] = Counter()
    durations: dict[str, int] = defaultdict(int)
    raw: dict[str, set[str]] = defaultdict(set)
    for seq in seqs:
        path = [START, *(v.name for v in seq), ACCEPT]
        edges.update(zip(path, path[1:], strict=False))
        support.update({v.name for v in seq})
        for v in seq:
            durations[v.name] = max(durations[v.name], v.step.duration_ns)
            raw[v.name].add(v.raw)
    order = _visiting_order(names)
    logger.info("skeleton: %d runs, %d prefix-tree states -> %d merged, %d essential",
                len(runs), tree.number_of_nodes(), len(order), len(essential))
    return Skeleton(order, essential, edges, dict(support), tree.number_of_nodes(), dict(durations),
                    {k: sorted(v) for k, v in raw.items()})


def _visiting_order(names: Sequence[Sequence[str]]) -> list[str]:
    """States by mean relative position in the runs that visit them (ties: name)."""
    where: dict[str, list[float]] = defaultdict(list)
    for seq in names:
        for i, name in enumerate(seq):
            where[name].append(i / max(1, len(seq) - 1))
    return sorted(where, key=lambda n: (sum(where[n]) / len(where[n]), n))


class TooFewRuns(TracedagError):  # type: ignore[misc,unused-ignore]
    """A scenario has fewer passing runs than learning needs; names each such scenario."""

    def __init__(self, needed: int, short: list[tuple[str, int, int]]) -> None:
        parts = "; ".join(f"scenario {s}: {p} passing of {n} run(s)" for s, p, n in short)
        super().__init__(f"too few passing runs to learn from (need {needed} per scenario): {parts}; "
                         "narrow --runs, pick other scenarios, or lower --min-runs")
        self.needed = needed
        self.short = short


class AgentUnclear(TracedagError):  # type: ignore[misc,unused-ignore]
    """The runs belong to several agents (or not to the one asked for)."""

    def __init__(self, asked: str | None, found: list[str]) -> None:
        listed = ", ".join(found) or "none"
        if asked is None:
            msg = f"the runs belong to {len(found)} agents ({listed}): choose one with --agent"
        else:
            msg = f"no run of agent {asked!r} selected (agents found: {listed})"
        super().__init__(msg)
        self.asked = asked
        self.found = found


@dataclass(frozen=True)
class LearnOptions:
    """How to learn: the state abstraction, the merge key, how many passing runs per scenario."""

    state: str = DEFAULT_STATE
    merge: str = "normalized"
    min_runs: int = 2
    max_runs: int | None = None
    agent: str | None = None
    duration_slack: float = 2.0
    keep_outliers: bool = False
    skip_thin: bool = False
    """Leave out the scenarios with too few passing runs (listed in the model) instead of failing."""
    min_confidence: float = 0.9
    """``merge="semantic"``: merge two names only when the LLM calls them the same with this confidence."""
    include_replays: bool = False
    """Learn from ``tracedag replay`` runs too (by default only from the traffic they replay)."""


def pick_agent(runs: Sequence[RunSteps], agent: str | None) -> tuple[str, list[RunSteps]]:
    """The one agent whose runs are learned from, and those runs."""
    found = agents_of(runs)
    if agent is None:
        if len(found) != 1:
            raise AgentUnclear(None, found)
        agent = found[0]
    mine = [r for r in runs if r.agent == agent]
    if not mine:
        raise AgentUnclear(agent, found)
    return agent, mine


class AskerMissing(TracedagError):  # type: ignore[misc,unused-ignore]
    """``merge="semantic"`` without an LLM to ask."""


def learn_model(runs: Sequence[RunSteps], options: LearnOptions, learned_from: dict[str, Any],
                previous: Model | None = None, asker: SameStepAsker | None = None) -> Model:
    """One skeleton per scenario of the agent's runs; a person's edits in ``previous`` are kept;
    ``asker`` answers whether two names are the same step (needed by ``merge="semantic"``)."""
    if options.merge == "semantic" and asker is None:
        raise AskerMissing("--merge semantic needs an LLM to ask (set TRACEDAG_JUDGE_MODEL and its endpoint)")
    asked: list[SemanticResult] = []
    agent, mine = pick_agent(runs, options.agent)
    by_scenario: dict[str, list[RunSteps]] = defaultdict(list)
    for r in mine:
        by_scenario[r.scenario].append(r)
    short: list[tuple[str, int, int]] = []
    scenarios: dict[str, ScenarioModel] = {}
    for name in sorted(by_scenario):
        group = by_scenario[name]
        passing = [r for r in group if r.passed][: options.max_runs]
        if len(passing) < options.min_runs:
            short.append((name, len(passing), len(group)))
            continue
        failing = [r for r in group if not r.passed]
        sem = _semantic(passing, options, asker)
        asked.append(sem)
        kept, dropped = (passing, []) if options.keep_outliers else drop_outliers(passing, options, sem.renames)
        scenarios[name] = scenario_model(kept, failing, options, sem.renames)
        scenarios[name].excluded_runs = dropped
        scenarios[name].semantic_merges = sem.merges
        if previous is not None and name in previous.scenarios:
            keep_edits(previous.scenarios[name], scenarios[name])
    if short and not (options.skip_thin and scenarios):
        raise TooFewRuns(options.min_runs, short)
    versions = sorted({r.agent_version for r in mine if r.agent_version})
    origin = {**learned_from, "skipped_scenarios": [{"scenario": s, "passing_runs": p, "runs": n} for s, p, n in short]}
    if asker is not None and options.merge == "semantic":
        origin["semantic_merge"] = _semantic_summary(asked, asker.model, options.min_confidence)
    return Model(agent, options.state, options.merge, scenarios, versions, options.duration_slack, origin)


def _semantic(passing: Sequence[RunSteps], options: LearnOptions, asker: SameStepAsker | None) -> SemanticResult:
    """The semantic merges of one scenario's passing runs (none unless ``merge="semantic"``)."""
    if options.merge != "semantic" or asker is None:
        return SemanticResult()
    base = {raw: merge_key(raw, options.merge) for r in passing for raw, _ in states_of(r, options.state)}
    return semantic_merges(passing, options.state, base, asker, options.min_confidence)


def _semantic_summary(asked: Sequence[SemanticResult], model: str, min_confidence: float) -> dict[str, Any]:
    """How the semantic merging went, over all scenarios (kept in ``learned_from``)."""
    return {"model": model, "min_confidence": min_confidence, "pairs_asked": sum(a.asked for a in asked),
            "merged": sum(len(a.merges) for a in asked), "not_same": sum(a.not_same for a in asked),
            "not_confident": sum(a.not_confident for a in asked), "failed": sum(a.failed for a in asked)}


def scenario_model(passing: Sequence[RunSteps], failing: Sequence[RunSteps], options: LearnOptions,
                   renames: Mapping[str, str] | None = None) -> ScenarioModel:
    """The model of one scenario: its skeleton, plus the transitions only its failed runs took."""
    sk = learn_skeleton(passing, options.state, options.merge, renames)
    essential = set(sk.essential)
    states = [
        StateSpec(name=n, essential=n in essential, learned="essential" if n in essential else "optional",
                  runs=sk.support.get(n, 0), max_duration_ms=round(sk.max_duration_ns.get(n, 0) / 1e6, 3),
                  names=sk.raw_names.get(n, []))
        for n in sk.states
    ]
    transitions = [{"from": a, "to": b, "runs": c} for (a, b), c in sorted(sk.edges.items())]
    return ScenarioModel([r.run_key for r in passing], states, sk.pta_states, transitions,
                         failure_transitions(failing, sk.edges, options, renames))


def failure_transitions(failing: Sequence[RunSteps], passing_edges: Counter[tuple[str, str]],
                        options: LearnOptions, renames: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Transitions that failed runs took and no passing run did, with how many failed runs took each."""
    seen: Counter[tuple[str, str]] = Counter()
    for r in failing:
        path = [START, *(v.name for v in visits(r, options.state, options.merge, renames)), ACCEPT]
        seen.update(set(zip(path, path[1:], strict=False)) - set(passing_edges))
    return [{"from": a, "to": b, "failed_runs": c} for (a, b), c in sorted(seen.items())]


def keep_edits(old: ScenarioModel, new: ScenarioModel) -> None:
    """Carry a person's choice (``essential`` differing from ``learned``) over to the re-learned states."""
    for st in old.states:
        edited = st.essential != (st.learned == "essential")
        target = new.state(st.name)
        if edited and target is not None:
            target.essential = st.essential


OUTLIER_QUORUM = 3
"""A passing run is an outlier when it lacks a state that every other passing run reaches, and there are
at least this many others."""


def drop_outliers(passing: Sequence[RunSteps], options: LearnOptions,
                  renames: Mapping[str, str] | None = None) -> tuple[list[RunSteps], list[dict[str, str]]]:
    """Split off the lone deviants: passing runs that lack states all the others (at least
    ``OUTLIER_QUORUM``) reach, such as a run the model routed to the wrong branch without an error.
    Never leaves fewer than ``options.min_runs`` runs."""
    if len(passing) <= OUTLIER_QUORUM:
        return list(passing), []
    names = [{v.name for v in visits(r, options.state, options.merge, renames)} for r in passing]
    kept: list[RunSteps] = []
    dropped: list[dict[str, str]] = []
    for i, run in enumerate(passing):
        others = [n for j, n in enumerate(names) if j != i]
        lacks = sorted(set.intersection(*others) - names[i])
        if lacks and len(passing) - len(dropped) - 1 >= options.min_runs:
            listed = ", ".join(repr(s) for s in lacks[:4]) + (f" and {len(lacks) - 4} more" if len(lacks) > 4 else "")
            dropped.append({"run": run.run_key,
                            "reason": f"lacks {listed}, which the {len(others)} other passing runs reach"})
        else:
            kept.append(run)
    return kept, dropped
