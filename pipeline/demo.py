"""``tracedag demo``: the whole product end to end on the embedded default, in about a minute.

Stages (each with a progress bar): start the collector on free loopback ports; simulate the
example booking agent (both variants, every conversation path of its graph, exact replays and
variants) over OTLP/HTTP; flush the collector into Parquet; build the DAGs; score the steps; run
the named queries and the determinism analysis; write the picture of the agent graph. A stage
whose library is missing is reported as unavailable (with the missing name); the stages after it
that need its output are reported as skipped. Nothing is faked.
"""

from __future__ import annotations

import importlib
import json
import logging
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from tracedag.pipeline.errors import TracedagError
from tracedag.pipeline.examples import booking_graph

logger = logging.getLogger(__name__)

DEFAULT_DATA = Path("./tracedag-demo")
MARKER = ".tracedag-demo"
_STORE_DIRS = {"spool", "tables", "state", "quarantine", "pictures", "graphs", MARKER}
# Upstream entry points, tried in order: (module, attribute).
UPSTREAM: dict[str, list[tuple[str, str]]] = {
    "start_collector": [("tracedag.collector.server", "start_collector")],
    "CollectorConfig": [("tracedag.collector.server", "CollectorConfig")],
    "build_store": [("tracedag.pipeline.dag", "build_store"), ("tracedag.pipeline.dag.build", "build_store")],
    "score_store": [("tracedag.pipeline.score", "score_store"), ("tracedag.pipeline.score.runner", "score_store")],
    "run_named": [("tracedag.pipeline.querying", "run_named")],
    "analyze": [("tracedag.pipeline.analysis.determinism", "analyze")],
    "write_outputs": [("tracedag.pipeline.analysis.determinism", "write_outputs")],
    "parse_graph": [("tracedag.pipeline.analysis.graph_dsl", "parse_graph")],
    "enumerate_paths": [("tracedag.pipeline.analysis.paths", "enumerate_paths")],
}
QUERIES = ("root_causes", "propagation", "amplification", "step_stats")


class StageUnavailable(TracedagError):  # type: ignore[misc,unused-ignore]
    """A stage cannot run because the library it needs is not there (yet)."""

    def __init__(self, stage: str, missing: str) -> None:
        super().__init__(f"{stage}: unavailable ({missing} not found)")
        self.stage = stage
        self.missing = missing


class DataDirNotEmpty(TracedagError):  # type: ignore[misc,unused-ignore]
    """The data directory holds files the demo did not write; it is never wiped."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"{path} is not empty and is not a tracedag data directory; use another --data or --keep")
        self.path = path


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


def resolve(name: str) -> Any:
    """Return the upstream callable ``name`` or raise ``StageUnavailable`` naming what is missing."""
    tried = []
    for module_name, attr in UPSTREAM[name]:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            logger.debug("cannot import %s: %s", module_name, e)
            tried.append(f"{module_name}.{attr}")
            continue
        if hasattr(module, attr):
            return getattr(module, attr)
        tried.append(f"{module_name}.{attr}")
    raise StageUnavailable(name, " or ".join(tried))


def prepare_data_dir(data: Path, keep: bool) -> None:
    """Create the data directory; wipe it first unless ``keep`` (only if the demo or tracedag made it)."""
    if data.exists() and not keep and any(data.iterdir()):
        names = {p.name for p in data.iterdir()}
        if not (data / MARKER).exists() and not names <= _STORE_DIRS:
            raise DataDirNotEmpty(data)
        shutil.rmtree(data)
    data.mkdir(parents=True, exist_ok=True)
    (data / MARKER).write_text("written by `tracedag demo`; the demo wipes this directory\n", encoding="utf-8")


def write_graphs(data: Path) -> dict[str, Path]:
    """Write the example agent's graphs (agent-graph DSL JSON) under ``<data>/graphs/``."""
    out = data / "graphs"
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for variant in booking_graph.VARIANTS:
        path = out / f"court_booking.{variant}.json"
        path.write_text(json.dumps(booking_graph.agent_graph(variant), indent=2) + "\n", encoding="utf-8")
        written[f"graph {variant}"] = path
    return written


@dataclass
class _Runner:
    """Runs the stages in order, recording each outcome; a stage needing a failed one is skipped."""

    result: DemoResult
    progress: Progress

    @contextmanager
    def stage(self, name: str, label: str, needs: tuple[str, ...] = (), total: float = 1) -> Iterator[Any]:
        """Run the block as stage ``name``; yields its progress task, or None when it must be skipped."""
        task = self.progress.add_task(label, total=total)
        missing = [n for n in needs if not self.result.ok(n)]
        if missing:
            self.result.stages[name] = f"skipped (needs {', '.join(missing)})"
            self.progress.update(task, description=f"{label} [skipped]")
            yield None
            return
        try:
            yield task
        except StageUnavailable as e:
            self.result.stages[name] = f"unavailable ({e.missing} not found)"
            self.progress.update(task, description=f"{label} [unavailable]")
            return
        except Exception as e:  # a demo reports a broken stage and goes on with the others
            logger.debug("demo stage %s failed", name, exc_info=True)
            self.result.stages[name] = f"failed: {type(e).__name__}: {e}"
            self.progress.update(task, description=f"{label} [failed]")
            return
        self.result.stages[name] = "ok"
        self.progress.update(task, completed=total)


def run_demo(config: DemoConfig, progress: Progress) -> DemoResult:
    """Run every stage; return what was produced (stages that could not run say why)."""
    from tracedag.pipeline import demo_stages as stages

    prepare_data_dir(config.data, config.keep)
    result = DemoResult(config.data)
    result.files.update(write_graphs(config.data))
    runner = _Runner(result, progress)
    collector = None
    try:
        with runner.stage("collector", "start the collector") as task:
            if task is not None:
                collector = stages.start(config.data)
        with runner.stage("simulate", "simulate conversations", ("collector",), total=stages.planned_runs(config)) as task:
            if task is not None:
                result.simulation = stages.simulate(config, collector, _advance(progress, task))
        with runner.stage("flush", "flush spans into Parquet", ("simulate",)) as task:
            if task is not None:
                stages.flush(collector)
    finally:
        stages.stop(collector)
    _analysis_stages(runner, config, stages)
    return result


def _analysis_stages(runner: _Runner, config: DemoConfig, stages: Any) -> None:
    result = runner.result
    with runner.stage("build", "build execution DAGs", ("flush",)) as task:
        if task is not None:
            stages.build(config.data)
    with runner.stage("score", "score steps", ("build",)) as task:
        if task is not None:
            stages.score(config.data)
    with runner.stage("queries", "root causes, propagation, step stats", ("score",)) as task:
        if task is not None:
            result.tables.update(stages.named_queries(config.data))
            result.counts.update(stages.store_counts(config.data))
    with runner.stage("determinism", "determinism, utility, picture", ("build",)) as task:
        if task is not None:
            tables, files = stages.determinism(config.data)
            result.tables.update(tables)
            result.files.update(files)


def _advance(progress: Progress, task: Any) -> Callable[[int, int], None]:
    def advance(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return advance
