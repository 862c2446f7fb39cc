"""``Graph``: the per-row arrays and edge lists of one reconstruction, shared by its output stages."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tracedag.pipeline.dag.explicit import Resolved
from tracedag.pipeline.dag.tree import BoolArray, IntArray


@dataclass
class Graph:
    """Per-row results (row = prep idx) and edge lists of one reconstruction."""

    trace: IntArray
    parent: IntArray
    depth: IntArray
    left: IntArray
    right: IntArray
    topo: IntArray
    branch: IntArray
    key: IntArray
    key_texts: list[str]
    iteration: IntArray
    retry: BoolArray
    orphan: BoolArray
    attached: BoolArray
    skew: BoolArray
    true_root: BoolArray
    eff_s: IntArray
    eff_e: IntArray
    seq_src: IntArray
    seq_dst: IntArray
    step_mode: BoolArray
    agent_group: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # nearest agent (toolcalls)
    tc_src: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # tool_call edges: LLM row
    tc_dst: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # tool_call edges: tool row
    x_src: list[int] = field(default_factory=list)
    x_dst: list[int] = field(default_factory=list)
    flat: dict[int, str] = field(default_factory=dict)  # trace_no -> fallback reason

    def record_explicit(self, trace_no: int, rows: list[int], res: Resolved) -> None:
        """Store the outcome of one trace resolved with explicit edges."""
        if res.fallback_reason is not None:
            self.flat[trace_no] = res.fallback_reason
            self.branch[rows] = 0
            return
        self.x_src += [a for a, _ in res.explicit]
        self.x_dst += [b for _, b in res.explicit]
        self.topo[res.topo] = np.arange(len(res.topo), dtype=np.int64)
