"""``tracedag demo``: the whole product end to end on the embedded default, in about a minute.

Stages (each with a progress bar): start the collector on free loopback ports; simulate the
example booking agent (both variants, every conversation path of its graph, exact replays and
variants) over OTLP/HTTP; flush the collector into Parquet; build the DAGs; score the steps; run
the named queries and the determinism analysis; write the picture of the agent graph. A stage
that fails is reported with its error; the stages after it that need its output are reported as
skipped. Nothing is faked.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracedag.pipeline.demo import stages
from tracedag.pipeline.demo.agent import booking_graph
from tracedag.pipeline.demo.config import DemoConfig, DemoResult, Progress
from tracedag.schemas.errors import TracedagError
from tracedag.schemas.layout import TOP_LEVEL, graphs_dir

logger = logging.getLogger(__name__)

MARKER = ".tracedag-demo"
_STORE_DIRS = {*TOP_LEVEL, MARKER}
class DataDirNotEmpty(TracedagError):  # type: ignore[misc,unused-ignore]
    """The data directory holds files the demo did not write; it is never wiped."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"{path} is not empty and is not a tracedag data directory; use another --data or --keep")
        self.path = path


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
    out = graphs_dir(data)
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
        except Exception as e:  # a demo reports a broken stage and goes on with the others
            logger.debug("demo stage %s failed", name, exc_info=True)
            self.result.stages[name] = f"failed: {type(e).__name__}: {e}"
            self.progress.update(task, description=f"{label} [failed]")
            return
        self.result.stages[name] = "ok"
        self.progress.update(task, completed=total)


def run_demo(config: DemoConfig, progress: Progress) -> DemoResult:
    """Run every stage; return what was produced (stages that could not run say why)."""
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
                result.counts["live_root_causes"] = stages.live_root_causes(config.data)
        with runner.stage("flush", "flush spans into Parquet", ("simulate",)) as task:
            if task is not None:
                stages.flush(collector)
    finally:
        stages.stop(collector)
    _analysis_stages(runner, config)
    return result


def _analysis_stages(runner: _Runner, config: DemoConfig) -> None:
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
    with runner.stage("validate", "structural validation", ("score",)) as task:
        if task is not None:
            result.tables["validations"], result.files["validation model"] = stages.validation(config.data)
    with runner.stage("determinism", "determinism, utility, picture", ("build",)) as task:
        if task is not None:
            tables, files = stages.determinism(config.data)
            result.tables.update(tables)
            result.files.update(files)
    with runner.stage("regress", "regression gate: permissive vs constrained", ("score",)) as task:
        if task is not None:
            result.tables["regress"] = stages.regress_variants(config.data)
    with runner.stage("replay", "replay failed conversations", ("flush",)) as task:
        if task is not None:
            from tracedag.pipeline.demo.replay_example import demo_replay

            result.counts.update(demo_replay(config.data))
    with runner.stage("usersim", "simulated users: CCR and PCR", ("flush",)) as task:
        if task is not None:
            from tracedag.pipeline.demo.usersim_example import demo_usersim

            result.counts.update(demo_usersim(config.data))
    with runner.stage("objstore", "object store: two writers, a build, a reader", ("score",)) as task:
        if task is not None:
            from tracedag.pipeline.demo.objstore_example import demo_objstore

            result.counts.update(demo_objstore(config.data))
    # last: its verdicts fill root_causes.confirmed, which the object-store copy (spans only) cannot have
    with runner.stage("confirm", "confirm root causes by counterfactual replay", ("score",)) as task:
        if task is not None:
            from tracedag.pipeline.demo.confirm_example import demo_confirm

            result.counts.update(demo_confirm(config.data))


def _advance(progress: Progress, task: Any) -> Callable[[int, int], None]:
    def advance(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return advance
