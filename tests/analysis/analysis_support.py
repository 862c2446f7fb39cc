"""Builders of normalized spans (SPANS_V1 rows) written as real Parquet into a data directory."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest

from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.schemas.layout import table_dir
from tracedag.schemas.spans import SPANS_V1

_ids = itertools.count(1)


def _hex(n: int, width: int) -> str:
    return f"{n:0{width}x}"


@dataclass
class Store:
    """Collects span rows; ``write()`` puts them in ``<data>/tables/spans``."""

    data: Path
    rows: list[dict] = field(default_factory=list)
    clock: int = 1_000_000_000

    def span(self, trace_id, parent, name, step_type=None, start=None, end=None, **cols):
        span_id = _hex(next(_ids), 16)
        self.clock += 10
        start = self.clock if start is None else start
        attrs = cols.pop("attributes", {})
        row = {
            "trace_id": trace_id, "span_id": span_id, "parent_span_id": parent, "name": name,
            "service_name": cols.pop("service_name", "svc"), "status_code": cols.pop("status_code", 1),
            "start_time_unix_nano": start, "end_time_unix_nano": end or start + 5,
            "received_unix_nano": start, "attributes": list(attrs.items()), "resource_attributes": [],
            "step_type": step_type, "step_name": cols.pop("step_name", name), **cols,
        }
        self.rows.append(row)
        return span_id

    def turn(self, labels, steps, response=None, agent="agentA", intended=None, status=None):
        """One trace: a root agent span, then per step (node, [(tool, args), ...], failed?).

        A failed step fails its tools (status ERROR), or the node span itself when it has none.
        """
        trace_id = _hex(next(_ids), 32)
        root_attrs = {"tracedag.intended_path": json.dumps(intended)} if intended else {}
        root = self.span(trace_id, None, f"invoke_agent {agent}", "agent", agent_name=agent,
                         output_text=response, attributes=root_attrs, **labels)
        for step in steps:
            name, tools = step[0], step[1]
            failed = len(step) > 2 and step[2]
            node = self.span(trace_id, root, f"invoke_node {name}", "chain", step_name=name,
                             status_code=2 if failed and not tools else 1,
                             attributes={"gen_ai.node.name": name}, **labels)
            for tool, args in tools:
                self.span(trace_id, node, f"execute_tool {tool}", "tool", tool_name=tool,
                          status_code=2 if failed else 1,
                          attributes={"gen_ai.tool.call.arguments": args} if args is not None else {},
                          **labels)
        self.clock += 1000
        return trace_id

    def run(self, run_id, scenario, turns, replay=None, variant=None, responses=(), **kw):
        """A conversation of several turns sharing one run id."""
        labels = {"run_id": run_id, "conversation_id": f"c-{run_id}", "scenario_id": scenario,
                  "replay_index": replay, "variant_id": variant}
        responses = list(responses) + [None] * (len(turns) - len(responses))
        return [self.turn(labels, steps, resp, **kw) for steps, resp in zip(turns, responses, strict=True)]

    def write(self):
        table = pa.Table.from_pylist(self.rows, schema=SPANS_V1)
        write_parquet_atomic(table, table_dir(self.data, "spans"))
        return self.data


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "data")
