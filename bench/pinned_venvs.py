"""Benchmark of building the suite's pinned virtualenvs (tests/pinned_venv.py) into a fresh cache.

Every venv the suite uses (the framework captures, traceloop-sdk, the two OTel exporter clients) is built
one after the other into a new, empty cache directory (``XDG_CACHE_HOME`` of a temporary directory), by this
tree's ``tests/pinned_venv.py`` ("after") and by the one of ``--baseline`` (a git revision: "before"),
alternated round by round. Reported per venv and in total: wall seconds and CPU seconds (user + sys of every
process the build started), medians over the rounds, and the CPU ratio after/before. pip's own cache
(``~/.cache/pip``) is whatever the caller's environment says: run once more with ``PIP_NO_CACHE_DIR=1`` for a
fresh machine.

    python bench/pinned_venvs.py --rounds 2 [--only strands-venv otel-json-venv] [--baseline 4d5de3c]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BASELINE = "4d5de3c"  # the last commit before the background builds, --no-deps and the host's pip


def venvs() -> list[Any]:
    """Every PinnedVenv of the suite, in the order the suite's files declare them."""
    from tests.collector.test_collector_crash import PINNED_VENVS as crash
    from tests.normalize.frameworks.fw_capture import VENVS
    from tests.normalize.test_traceloop_sdk import PINNED_VENVS as traceloop

    return [*crash, *traceloop, *VENVS.values()]


def baseline_module(rev: str, tmp: Path) -> ModuleType:
    """``tests/pinned_venv.py`` as it was at ``rev``, imported under its own name."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:tests/pinned_venv.py"], check=True,
                            capture_output=True, text=True).stdout
    path = tmp / "pinned_venv_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("pinned_venv_baseline", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def cpu_of_children() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def build_all(kind: type, venvs_: list[Any], cache: Path) -> dict[str, tuple[float, float]]:
    """Build each venv with ``kind`` (a PinnedVenv class) into ``cache``: name -> (wall s, CPU s)."""
    os.environ["XDG_CACHE_HOME"] = str(cache)
    out: dict[str, tuple[float, float]] = {}
    for v in venvs_:
        venv = kind(v.name, v.lock, v.package, v.imports, v.pip_timeout)
        wall, cpu = time.monotonic(), cpu_of_children()
        try:
            venv.ensure()
        except BaseException as exc:  # pytest.fail's Failed: a timeout or pip's error, reported as nan
            if isinstance(exc, KeyboardInterrupt):
                raise
            print(f"  {v.name} failed: {str(exc).splitlines()[0]}", flush=True)
            out[v.name] = (math.nan, math.nan)
            continue
        out[v.name] = (time.monotonic() - wall, cpu_of_children() - cpu)
        print(f"  {kind.__module__:22} {v.name:20} {out[v.name][0]:7.1f} s wall {out[v.name][1]:7.1f} s CPU",
              flush=True)
    shutil.rmtree(cache, ignore_errors=True)
    return out


def table(names: list[str], runs: dict[str, list[dict[str, tuple[float, float]]]]) -> str:
    """Medians per venv and of the totals: before/after wall and CPU, CPU ratio."""
    def med(kind: str, name: str | None, i: int) -> float:
        return statistics.median(sum(r[n][i] for n in ([name] if name else names)) for r in runs[kind])

    lines = [f"{'venv':22} {'before wall':>11} {'CPU':>7} {'after wall':>11} {'CPU':>7} {'CPU after/before':>17}"]
    for name in [*names, None]:
        b_w, b_c, a_w, a_c = med("before", name, 0), med("before", name, 1), med("after", name, 0), med("after", name, 1)
        lines.append(f"{name or 'all':22} {b_w:10.1f}s {b_c:6.1f}s {a_w:10.1f}s {a_c:6.1f}s {a_c / b_c:16.2f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", nargs="*", help="venv names (default: all)")
    parser.add_argument("--baseline", default=BASELINE, help="git revision of the 'before' tests/pinned_venv.py")
    args = parser.parse_args()
    from tests import pinned_venv

    chosen = [v for v in venvs() if not args.only or v.name in args.only]
    runs: dict[str, list[dict[str, tuple[float, float]]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="pinned-venvs-") as tmp:
        old = baseline_module(args.baseline, Path(tmp))
        for i in range(args.rounds):
            order = [("before", old.PinnedVenv), ("after", pinned_venv.PinnedVenv)]
            for kind, cls in order if i % 2 == 0 else order[::-1]:
                print(f"round {i + 1}, {kind}:", flush=True)
                runs[kind].append(build_all(cls, chosen, Path(tmp) / f"cache-{kind}-{i}"))
    print(f"\nPIP_NO_CACHE_DIR={os.environ.get('PIP_NO_CACHE_DIR', '')!r}, {args.rounds} round(s), medians:")
    print(table([v.name for v in chosen], runs))


if __name__ == "__main__":
    main()
