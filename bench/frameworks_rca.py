"""Root-cause accuracy per agent framework x failure class, before (a git revision) and after (this checkout).

The conversations of ``tests/normalize/frameworks/fw_scenarios.py`` are captured once per framework from REAL
runs (the framework and its own OpenTelemetry instrumentation in a pinned venv, a scripted
OpenAI-compatible model on 127.0.0.1, the OTel SDK's OTLP/HTTP exporter, a real ``tracedag
collect``: ``tests/normalize/frameworks/fw_capture.py``). The same spans are then normalized again, built,
scored and queried (``root_causes per=conversation``, every strategy) in a fresh store by each code version, in a child
process: ``before`` is ``--before`` (default: the commit before issue #30's work) exported with
``git archive``, ``after`` is this checkout. Prints, per framework and class, the conversations and
how many each version names right, per strategy; then, for the README's root-cause accuracy section, a
Markdown table per framework x class (greedy, right before -> after / conversations, the other strategies
in brackets where they differ) and each strategy's total with the best one named.

    python bench/frameworks_rca.py [--before REV]
        [--frameworks smolagents,pydantic-ai,llama-index,strands,openai-agents,google-adk]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STRATEGIES = ["greedy", "full_path_min", "weighted", "agenteval"]
FRAMEWORKS = "smolagents,pydantic-ai,llama-index,strands,openai-agents,google-adk"
Tally = dict[str, dict[str, list[int]]]  # strategy -> class -> [right, conversations]
LINKS = {"collector": "collector", "pipeline": "pipeline", "instrument": "pipeline/instrument",
         "schemas": "schemas", "queries": "queries"}

_CHILD = """
import json, sys, tempfile
from pathlib import Path
import pyarrow.parquet as pq
from tests.normalize.frameworks import fw_capture as fc
from tests.normalize.frameworks.fw_scenarios import BY_FRAMEWORK
from tests.queries.rca_measure import build_and_score
scenarios = BY_FRAMEWORK[sys.argv[2]]()
from tracedag.pipeline.normalize.spans import normalize
from tracedag.schemas.spans import BASE_SCHEMA
data = Path(tempfile.mkdtemp()) / "data"
# normalized again by this version: the captured spans' agent columns are the capturing version's
build_and_score(data, normalize(pq.read_table(sys.argv[1]).select(BASE_SCHEMA.names).cast(BASE_SCHEMA)))
truth = fc.truth_span_ids(data, scenarios)
print(json.dumps({s: fc.tally(scenarios, truth, fc.answers(data, s)) for s in sys.argv[3:]}))
"""


def export(rev: str, tmp: Path) -> Path:
    """``git archive`` the package folders of ``rev``; return a directory that imports as ``tracedag``."""
    src, site = tmp / "src", tmp / "site" / "tracedag"
    src.mkdir()
    site.mkdir(parents=True)
    folders = sorted(set(LINKS.values()) - {"pipeline/instrument"})
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *folders], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    (site / "__init__.py").write_text("")
    for name, folder in LINKS.items():
        (site / name).symlink_to(src / folder)
    return site.parent


def capture_spans(framework: str, out: Path) -> int:
    """Capture ``framework``'s conversations and write their spans to ``out`` (Parquet); return the count."""
    import pyarrow.parquet as pq

    from tests.normalize.frameworks.fw_capture import capture
    from tests.normalize.frameworks.fw_scenarios import BY_FRAMEWORK
    from tracedag.pipeline.store.views import connect

    scenarios = BY_FRAMEWORK[framework]()
    with tempfile.TemporaryDirectory() as tmp:
        cap = capture(framework, scenarios, Path(tmp) / "data")
        spans = connect(cap.data).sql("select * from spans").to_arrow_table()
    pq.write_table(spans, out)
    return len(scenarios)


def measure(spans: Path, framework: str, pythonpath: str) -> Tally:
    """Strategy -> class -> [right, conversations], with the tracedag found on ``pythonpath`` first."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, str(ROOT)) if p)}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(spans), framework, *STRATEGIES], env=env,
                          capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"measuring {framework} failed:\n{done.stderr[-3000:]}")
    result: Tally = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def table(framework: str, before: Tally, after: Tally) -> None:
    """Print one framework's rows: class, conversations, right before / after per strategy."""
    head = " ".join(f"{s:>19}" for s in STRATEGIES)
    print(f"\n{framework}\n{'class':<22} {'n':>3} {head}   (right before -> after)")
    for klass, (_, n) in after["greedy"].items():
        cells = " ".join(f"{before[s][klass][0]:>8} -> {after[s][klass][0]:<8}" for s in STRATEGIES)
        print(f"{klass:<22} {n:>3} {cells}")
    tot = {v: {s: sum(r for r, _ in d[s].values()) for s in STRATEGIES} for v, d in (("b", before), ("a", after))}
    n_all = sum(n for _, n in after["greedy"].values())
    cells = " ".join(f"{tot['b'][s]:>8} -> {tot['a'][s]:<8}" for s in STRATEGIES)
    print(f"{'all':<22} {n_all:>3} {cells}")


def total(t: Tally, strategy: str) -> int:
    """The conversations ``strategy`` names right, over every class."""
    return sum(r for r, _ in t[strategy].values())


def cell(before: Tally, after: Tally, klass: str) -> str:
    """One class's Markdown cell: greedy right before -> after / n, other strategies in brackets where they differ."""
    right, n = after["greedy"][klass]
    others = [f"{s} {after[s][klass][0]}" for s in STRATEGIES[1:] if after[s][klass][0] != right]
    return f"{before['greedy'][klass][0]}→{right} /{n}" + (f" ({', '.join(others)})" if others else "")


def merged(t: Tally) -> Tally:
    """``t`` with the variants of a class summed under its name before the comma ("tool fails, apology")."""
    out: Tally = {}
    for strategy, classes in t.items():
        for klass, (right, n) in classes.items():
            cell_ = out.setdefault(strategy, {}).setdefault(klass.split(",")[0], [0, 0])
            cell_[0], cell_[1] = cell_[0] + right, cell_[1] + n
    return out


def markdown(results: dict[str, tuple[Tally, Tally]]) -> None:
    """The README table: framework x class (greedy before -> after), then every strategy's total and the best."""
    results = {fw: (merged(before), merged(after)) for fw, (before, after) in results.items()}
    classes = list(dict.fromkeys(k for _, after in results.values() for k in after["greedy"]))
    print("\n| framework | " + " | ".join(classes) + " | all before | all after |")
    print("|---" * (len(classes) + 3) + "|")
    for fw, (before, after) in results.items():
        cells = [cell(before, after, k) if k in after["greedy"] else "" for k in classes]
        n = sum(n for _, n in after["greedy"].values())
        print(f"| {fw} | " + " | ".join(cells) + f" | {total(before, 'greedy')}/{n} | {total(after, 'greedy')}/{n} |")
    n_all = sum(n for _, after in results.values() for _, n in after["greedy"].values())
    sums = {s: (sum(total(b, s) for b, _ in results.values()), sum(total(a, s) for _, a in results.values()))
            for s in STRATEGIES}
    b, a = sums["greedy"]
    print("| all |" + " |" * len(classes) + f" {b}/{n_all} ({100 * b / n_all:.0f} %) | {a}/{n_all} ({100 * a / n_all:.0f} %) |")
    for s, (b, a) in sums.items():
        print(f"{s:<14} before {b}/{n_all} ({100 * b / n_all:.0f} %)  after {a}/{n_all} ({100 * a / n_all:.0f} %)")
    best = max(sums.values(), key=lambda ba: ba[1])[1]
    print("best after: " + ", ".join(s for s, (_, a) in sums.items() if a == best))


def main() -> None:
    """Capture, measure both versions, print the tables."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="bed8f32", help="git revision measured as 'before'")
    ap.add_argument("--frameworks", default=FRAMEWORKS)
    args = ap.parse_args()
    results: dict[str, tuple[Tally, Tally]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        old = export(args.before, Path(tmp))
        for fw in args.frameworks.split(","):
            spans = Path(tmp) / f"{fw}.parquet"
            capture_spans(fw, spans)
            results[fw] = (measure(spans, fw, str(old)), measure(spans, fw, ""))
            table(fw, *results[fw])
    markdown(results)


if __name__ == "__main__":
    main()
