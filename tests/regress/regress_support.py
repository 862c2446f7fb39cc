"""A small real store for the regression gate: spans written as Parquet, built and scored by the pipeline.

``gate_store(data, versions)`` writes, for each version and each scenario s1..s4 x replay 0..3, one
trace: an agent root, a ``plan`` node and a ``search`` tool call (failed, status ERROR, in the
traces the version's ``fails(scenario, replay)`` picks, and
its node with it), with tokens (and the version's ``model``, if any) on the root. Then the DAGs are
built and the steps scored by the rules, so every number the gate reads comes from the real queries.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.analysis.analysis_support import Store
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.score import score_store

SCENARIOS = ("s1", "s2", "s3", "s4")
REPLAYS = 4
Fails = Callable[[str, int], bool]


def never(scenario: str, replay: int) -> bool:
    return False


def half(scenario: str, replay: int) -> bool:
    """Half of the traces fail: replays 0 and 1 of every scenario."""
    return replay < 2


def write_version(store: Store, version: str, fails: Fails = never, tool_ms: int = 5, replay_labels: bool = True,
                  scenarios: tuple[str, ...] = SCENARIOS, tokens: int | None = 100,
                  model: str | None = None, agent: str = "bot") -> None:
    for scenario in scenarios:
        for replay in range(REPLAYS):
            labels = {"run_id": f"{version}/{scenario}/{replay}", "conversation_id": f"{version}-{scenario}-{replay}",
                      "scenario_id": scenario, "replay_index": replay if replay_labels else None,
                      "service_version": version}
            store.clock += 1_000_000
            start = store.clock
            trace_id = f"{abs(hash((version, scenario, replay))):032x}"[:32]
            root = store.span(trace_id, None, f"invoke_agent {agent}", "agent", agent_name=agent, start=start,
                              end=start + 50_000_000, input_tokens=tokens, output_tokens=tokens and tokens // 2,
                              model=model, **labels)
            failed = fails(scenario, replay)
            node = store.span(trace_id, root, "invoke_node plan", "chain", step_name="plan", start=start + 1000,
                              end=start + 40_000_000, attributes={"gen_ai.node.name": "plan"},
                              status_code=2 if failed else 1, **labels)
            store.span(trace_id, node, "execute_tool search", "tool", tool_name="search", step_name="search",
                       start=start + 2000, end=start + 2000 + tool_ms * 1_000_000,
                       status_code=2 if failed else 1, **labels)


def gate_store(data: Path, versions: dict[str, dict[str, object]], score: bool = True) -> Path:
    """Write every version's traces (``write_version`` keywords per version), build and score."""
    store = Store(data)
    for version, kw in versions.items():
        write_version(store, version, **kw)  # type: ignore[arg-type]
    store.write()
    build_store(data, idle_seconds=0)
    if score:
        score_store(data)
    return data
