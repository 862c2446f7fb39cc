"""The fixed cost of a CLI command: what a user pays for each command typed on a small store (#31, #33).

On the demo's store (~1,200 spans, made with ``tracedag demo``) the work of a command is a few ms: what it
costs is start-up (imports, the DuckDB connection, its views and macros) and printing. That cost is also
paid by every CLI call of the test suite. This script times the commands below as CLI processes, for this
checkout and (``--before``) for an older one, the two taking turns in each run so that both see the same
machine, each on a copy of its own of the store (warmed once: a first ``build``/``score`` may have work).
Figures are medians of the runs' wall seconds and of the child's CPU seconds (user + sys), with now ÷ before.

    git worktree add /tmp/h-cli/before 4d5de3c
    nice -n 5 python bench/cli_overhead.py --before /tmp/h-cli/before --runs 7
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stages_before_after import _env, _origin, _shim_dir, _timed
from trace_by_id import _shim

CLI = "from tracedag.pipeline.cli import cli; cli()"
COMMANDS: dict[str, list[str]] = {
    "--help": ["--help"],
    "sql 'select 1'": ["sql", "{data}", "select 1"],
    "query failures": ["query", "failures", "{data}"],
    "query root_causes": ["query", "root_causes", "{data}"],
    "build (nothing new)": ["build", "{data}"],
    "score (nothing new)": ["score", "{data}"],
    "show TRACE": ["show", "{trace}", "{data}"],
}
Timing = tuple[float, float]  # wall s, CPU s


def _args(template: list[str], data: Path, trace: str) -> list[str]:
    out: list[str] = []
    for a in template:
        out += ["--data", str(data)] if a == "{data}" else [trace if a == "{trace}" else a]
    return out


def _make_store(where: Path, console: Console) -> tuple[Path, str]:
    """The demo's store under ``where`` (made once, by this checkout) and the trace its output says to show."""
    data, trace_file = where / "tracedag-demo", where / "trace.txt"
    if not (data / "tables").is_dir() or not trace_file.is_file():
        shutil.rmtree(data, ignore_errors=True)
        where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, "-c", CLI, "demo"], cwd=where, capture_output=True, text=True,
                              env=_env(None), check=True)
        found = re.search(r"tracedag show ([0-9a-f]+)", done.stdout)
        if found is None:
            raise SystemExit(f"tracedag demo printed no trace to show:\n{done.stdout}")
        trace_file.write_text(found.group(1))
        console.print(f"{data}: made by tracedag demo")
    return data, trace_file.read_text().strip()


def _ratio(now: float, before: float) -> str:
    return f"×{now / before:.2f}" if before > 0 else "-"


def _table(results: dict[str, dict[str, list[Timing]]], runs: int) -> Table:
    labels = list(results)
    t = Table(title=f"medians of {runs} runs: wall s / CPU s" + (" (now ÷ before)" if len(labels) > 1 else ""))
    t.add_column("command")
    for label in labels:
        t.add_column(label, justify="right")
    if len(labels) > 1:
        t.add_column("wall ratio", justify="right")
        t.add_column("CPU ratio", justify="right")
    for name in COMMANDS:
        med = {label: tuple(statistics.median(r[i] for r in results[label][name]) for i in (0, 1)) for label in labels}
        cells = [f"{med[label][0]:.2f} / {med[label][1]:.2f}" for label in labels]
        if len(labels) > 1:
            b, n = med["before"], med["now"]
            cells += [_ratio(n[0], b[0]), _ratio(n[1], b[1])]
        t.add_row(name, *cells)
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--before", type=Path, help="a checkout of the code to compare with (e.g. a worktree of 4d5de3c)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/tracedag-bench-cli"))
    args = ap.parse_args(argv)
    console = Console()
    base, trace = _make_store(args.dir / "store", console)
    envs = {"now": _env(None)}
    if args.before is not None:
        envs = {"before": _env(_shim(args.before, _shim_dir(args.dir, args.before))), **envs}
    stores = {}
    for label, env in envs.items():
        console.print(f"{label}: tracedag from {_origin(env)}")
        stores[label] = args.dir / f"work-{label}"
        shutil.rmtree(stores[label], ignore_errors=True)
        shutil.copytree(base, stores[label])
        for template in COMMANDS.values():  # warm-up: a first build or score of this checkout may have work
            _timed(_args(template, stores[label], trace), env)
    results: dict[str, dict[str, list[Timing]]] = {label: {name: [] for name in COMMANDS} for label in envs}
    for run in range(args.runs):
        order = list(envs) if run % 2 == 0 else list(envs)[::-1]
        for name, template in COMMANDS.items():
            for label in order:
                results[label][name].append(_timed(_args(template, stores[label], trace), envs[label]))
        console.print(f"run {run + 1}/{args.runs} done, load {os.getloadavg()[0]:.1f}")
    console.print(_table(results, args.runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
