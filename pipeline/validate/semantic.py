"""Semantic merging of states (``--merge semantic``): after the normalized merge, an LLM is asked whether
two state names at the same position of the prefix tree denote the same step.

Candidates are *siblings*: children of one prefix-tree node (so the same previous states) with the
same visit number and different keys, such as ``check_availability`` in one run and
``availability_check`` in another. A pair is never asked when one run visits both names (that run
shows they are different steps). A pair merges only when the answer says *same* with a confidence
of at least ``min_confidence``; a failed or malformed answer merges nothing. Merging joins paths of
the tree, which can make new siblings, so the asking repeats until a round finds no new pair.

The merged names become the one with the most runs (ties: alphabetical first). Every merge is
recorded (``SemanticMerge``) in the model file so a person can review it; deleting the record
undoes it for ``check``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tracedag.pipeline.validate.runs import RunSteps, states_of

logger = logging.getLogger(__name__)

MAX_ROUNDS = 10
"""Rounds of asking at most (each round merges, which can bring new siblings together)."""


class Answer(Protocol):
    """What the asker returns for a pair."""

    @property
    def same(self) -> bool: ...

    @property
    def confidence(self) -> float: ...

    @property
    def reason(self) -> str: ...


class SameStepAsker(Protocol):
    """Answers whether two state names reached after ``after`` are one step (None: no answer)."""

    @property
    def model(self) -> str: ...

    def ask(self, a: str, b: str, after: str) -> Answer | None: ...


@dataclass
class SemanticResult:
    """The renames to apply (name -> merged name), the merges to record, and how the asking went."""

    renames: dict[str, str] = field(default_factory=dict)
    merges: list[dict[str, Any]] = field(default_factory=list)
    asked: int = 0
    not_same: int = 0
    not_confident: int = 0
    failed: int = 0


class _Groups:
    """Union-find over state keys."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        while self.parent.get(x, x) != x:
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        self.parent[self.find(a)] = self.find(b)

    def renames(self, support: Counter[str]) -> dict[str, str]:
        members: dict[str, list[str]] = {}
        for x in {*self.parent, *self.parent.values()}:
            members.setdefault(self.find(x), []).append(x)
        out: dict[str, str] = {}
        for group in members.values():
            into = min(group, key=lambda n: (-support[n], n))
            out.update({n: into for n in group if n != into})
        return out


def _keyed(run: RunSteps, state: str, base: Mapping[str, str], renames: Mapping[str, str]) -> list[tuple[str, int]]:
    """The run as (key, visit number), keys after ``base`` (normalizing) and ``renames``."""
    seen: Counter[str] = Counter()
    out: list[tuple[str, int]] = []
    for raw, _step in states_of(run, state):
        key = renames.get(base[raw], base[raw])
        seen[key] += 1
        out.append((key, seen[key]))
    return out


def _sibling_pairs(seqs: Sequence[Sequence[tuple[str, int]]]) -> list[tuple[str, str, str]]:
    """(a, b, previous state) for children of one prefix-tree node with one visit number and two keys."""
    children: dict[tuple[tuple[str, int], ...], set[tuple[str, int]]] = {}
    for seq in seqs:
        for i, item in enumerate(seq):
            children.setdefault(tuple(seq[:i]), set()).add(item)
    pairs: dict[tuple[str, str], str] = {}
    for prefix, kids in children.items():
        after = f"{prefix[-1][0]}" if prefix else "(start of the run)"
        ordered = sorted(kids)
        for i, (a, va) in enumerate(ordered):
            for b, vb in ordered[i + 1:]:
                if va == vb and a != b:
                    pairs.setdefault((a, b), after)
    return [(a, b, after) for (a, b), after in sorted(pairs.items())]


def semantic_merges(runs: Sequence[RunSteps], state: str, base: Mapping[str, str], asker: SameStepAsker,
                    min_confidence: float) -> SemanticResult:
    """Ask about sibling pairs of the runs' prefix tree until no new pair appears; merge the confident ones.

    ``base`` maps each raw state name to its key before semantic merging (the normalized name)."""
    keysets = [{base[raw] for raw, _ in states_of(r, state)} for r in runs]
    support: Counter[str] = Counter(k for ks in keysets for k in ks)
    groups = _Groups()
    result = SemanticResult()
    asked: set[tuple[str, str]] = set()
    for _ in range(MAX_ROUNDS):
        seqs = [_keyed(r, state, base, result.renames) for r in runs]
        fresh = [(a, b, after) for a, b, after in _sibling_pairs(seqs) if (a, b) not in asked]
        if not fresh:
            break
        for a, b, after in fresh:
            asked.add((a, b))
            if groups.find(a) == groups.find(b) or any(_members(a, groups) & ks and _members(b, groups) & ks for ks in keysets):
                continue  # merged already this round, or one run visits both: different steps
            answer = asker.ask(a, b, after)
            if _merge_ok(answer, min_confidence, result):
                assert answer is not None
                groups.union(a, b)
                result.merges.append({"names": [a, b], "confidence": round(answer.confidence, 4),
                                      "model": asker.model, "after": after, "reason": answer.reason})
        result.renames = groups.renames(support)
    for m in result.merges:
        m["into"] = result.renames.get(m["names"][0], m["names"][0])
    logger.info("semantic merge: %d pairs asked, %d merged, %d not the same, %d not confident, %d failed",
                result.asked, len(result.merges), result.not_same, result.not_confident, result.failed)
    return result


def _members(key: str, groups: _Groups) -> set[str]:
    root = groups.find(key)
    return {k for k in [*groups.parent, *groups.parent.values(), key] if groups.find(k) == root}


def _merge_ok(answer: Answer | None, min_confidence: float, result: SemanticResult) -> bool:
    result.asked += 1
    if answer is None:
        result.failed += 1
        return False
    if not answer.same:
        result.not_same += 1
        return False
    if answer.confidence < min_confidence:
        result.not_confident += 1
        logger.info("semantic merge: same with confidence %.2f < %.2f: not merged", answer.confidence,
                    min_confidence)
        return False
    return True

