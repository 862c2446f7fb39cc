"""What ``tracedag demo`` runs (``DemoConfig``) and what it produced (``DemoResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

DEFAULT_DATA = Path("./tracedag-demo")
QUERIES = ("root_causes", "propagation", "amplification", "step_stats")


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs."""

    data: Path = DEFAULT_DATA
    seed: int = 7
    keep: bool = False
    replays: int = 3
    variants: int = 2
    fault_rate: float = 0.25
    latency_scale: float = 1.0
    max_visits: int = 2


@dataclass
class DemoResult:
    """Everything the demo produced, for printing and for tests."""

    data: Path
    stages: dict[str, str] = field(default_factory=dict)
    tables: dict[str, pa.Table] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    simulation: Any = None

    def ok(self, stage: str) -> bool:
        """True when ``stage`` ran to completion."""
        return self.stages.get(stage) == "ok"


class Progress(Protocol):
    """What the demo needs from a progress display (rich's, or a silent one)."""

    def add_task(self, description: str, *, total: float | None = ...) -> Any:
        """Start a bar; return its id."""

    def update(self, task_id: Any, *, completed: float | None = ..., total: float | None = ...,
               description: str | None = ...) -> None:
        """Move a bar."""
