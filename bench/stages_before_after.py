"""Build and score of this checkout beside an older checkout's, alternated on copies of one store.

#31 gave ``tracedag score`` more to do (it stores the named queries' results, so reads need not compute
them) and changed how a build writes its files (sorted by trace id, smaller row groups). "Nothing else
gets slower" is shown here, on the commands users run, each as a CLI process of its checkout:

- ``tracedag build --data D --full --idle 0``: every trace reconstructed;
- ``tracedag score --data D``: every step scored (and, now, the named queries' results stored);
- ``tracedag score --data D`` again with nothing new: what a live round pays when it has nothing to do.

Each run copies the same spans store (``bench/gen.py``) once per checkout and runs the three commands on
the copy; the checkouts take turns (the order flips every run) so that both see the same machine.
Figures are the medians of the runs' wall seconds and of the child's CPU seconds, with now ÷ before.
The ingest path is compared by content: when ``collector/`` is the same in both checkouts, acknowledged
and queryable ingest run the same code and the script says so instead of timing it.

    git worktree add /tmp/before fe3a5b8
    git worktree add /tmp/after HEAD   # or leave --after out: this checkout's working tree
    python bench/stages_before_after.py --before /tmp/before --after /tmp/after --spans 200000 --runs 3
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen
from trace_by_id import _shim

STEPS = {
    "build": ["build", "--full", "--idle", "0"],
    "score": ["score"],
    "score, nothing new": ["score"],
}
CLI = "from tracedag.pipeline.cli import cli; cli()"


def _digest(tree: Path) -> str:
    """A digest of the Python files under ``tree`` (names and contents)."""
    h = hashlib.sha256()
    for p in sorted(tree.rglob("*.py")):
        h.update(str(p.relative_to(tree)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _shim_dir(root: Path, checkout: Path) -> Path:
    """A shim directory of ``checkout``'s own (a shim's links are made once: one per checkout path)."""
    return root / f"shim-{hashlib.sha256(str(checkout.resolve()).encode()).hexdigest()[:12]}"


def _env(pythonpath: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


def _origin(env: dict[str, str]) -> str:
    """Where a child with ``env`` imports tracedag's CLI from (printed, so a wrong checkout shows)."""
    code = "import pathlib, tracedag.pipeline.cli as c; print(pathlib.Path(c.__file__).resolve())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def _timed(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run the CLI with ``args``; its (wall, CPU) seconds. A failure stops the benchmark with its output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CLI, *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"tracedag {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _one_run(base: Path, work: Path, env: dict[str, str]) -> dict[str, tuple[float, float]]:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work)
    try:
        return {step: _timed([*args, "--data", str(work)], env) for step, args in STEPS.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _ratio(now: float, before: float) -> str:
    return f"×{now / before:.2f}" if before > 0 else "-"


def _table(results: dict[str, list[dict[str, tuple[float, float]]]], runs: int) -> Table:
    t = Table(title=f"medians of {runs} runs: wall s / CPU s (now ÷ before)")
    for col in ("step", "before", "now", "wall ratio", "CPU ratio"):
        t.add_column(col, justify="left" if col == "step" else "right")
    for step in STEPS:
        med = {label: tuple(statistics.median(r[step][i] for r in results[label]) for i in (0, 1))
               for label in results}
        b, n = med["before"], med["now"]
        t.add_row(step, f"{b[0]:.2f} / {b[1]:.2f}", f"{n[0]:.2f} / {n[1]:.2f}", _ratio(n[0], b[0]), _ratio(n[1], b[1]))
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--before", type=Path, required=True, help="a checkout of the code to compare with")
    ap.add_argument("--after", type=Path, help="the checkout to measure (default: this one, its working tree)")
    ap.add_argument("--spans", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/tracedag-bench-stages"))
    args = ap.parse_args(argv)
    console = Console()
    here = Path(__file__).resolve().parents[1]
    base = args.dir / f"spans-{args.spans}"
    if not (base / "tables").is_dir():
        shutil.rmtree(base, ignore_errors=True)
        console.print(f"{base}: {gen.make_store(base, args.spans)} spans generated")
    after = None if args.after is None else _shim(args.after, _shim_dir(args.dir, args.after))
    envs = {"before": _env(_shim(args.before, _shim_dir(args.dir, args.before))), "now": _env(after)}
    for label, env in envs.items():
        console.print(f"{label}: tracedag from {_origin(env)}")
    same = _digest((args.after or here) / "collector") == _digest(args.before / "collector")
    console.print("collector/ is the same in both checkouts: acknowledged and queryable ingest run the same code"
                  if same else "collector/ differs: time ingest with bench/ingest.py in each checkout")
    results: dict[str, list[dict[str, tuple[float, float]]]] = {"before": [], "now": []}
    for run in range(args.runs):
        order = ["before", "now"] if run % 2 == 0 else ["now", "before"]
        for label in order:
            results[label].append(_one_run(base, args.dir / f"work-{label}", envs[label]))
        console.print(f"run {run + 1}/{args.runs} done, load {os.getloadavg()[0]:.1f}")
    console.print(_table(results, args.runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
