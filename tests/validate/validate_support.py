"""Hand-made runs for the structural-validation tests (no store needed)."""

from __future__ import annotations

import itertools

from tracedag.pipeline.validate.runs import RunSteps, Step

_n = itertools.count()


def run(*states: str, scenario: str = "s", agent: str = "ag", passed: bool = True, ms: float = 1.0) -> RunSteps:
    """A run whose steps are nodes named ``states`` ("tool:x" makes a tool step), each ``ms`` long."""
    i = next(_n)
    r = RunSteps(f"r{i:04d}", agent, "1.0", scenario, start_ns=i, trace_ids=[f"t{i}"], passed=passed)
    t = 0
    for s in states:
        kind, _, name = s.rpartition(":")
        kind = kind or "node"
        r.steps.append(Step(kind, name, "tool" if kind == "tool" else "chain", f"{agent}/{name}", t,
                            t + int(ms * 1e6)))
        t += int(ms * 1e6) + 1
    return r
