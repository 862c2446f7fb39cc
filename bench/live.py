"""Benchmark of the live path: span acknowledged -> its trace's root cause queryable.

A real ``tracedag collect`` process (converters in child processes, continuous build and score)
receives generated agent traffic over OTLP/HTTP, paced at each ``--rates`` value (spans/s), for
``--seconds``. Every request holds whole traces only (``bench/gen.py``: agent loops with tool
errors and retries, so rules find failing steps), each sent with fresh trace ids. For every
trace that has a root cause (the traces ``root_causes`` returns once everything is built: a
tool error that a retry recovered is no root cause), the latency is the time from the
acknowledgement of the request that completed it to the first poll of the ``root_causes`` named
query (``--poll`` seconds apart, through the same DuckDB views a user queries) that returns it.
Polling goes on until nothing new appeared for ``--settle`` seconds after the load stopped.

With ``--timeline`` (collectors that have it: this tree's and later ones), where each trace's latency goes: the collector appends each
round's wall-clock times to a file (``TRACEDAG_LIVE_TIMELINE``), and after the run each traced trace's times from its
ack to its spans in a Parquet file (the converter), its grace expiring, the start of the round that built it, that
round holding the round lock, its build end, its score end and the first poll that saw it (``timeline``);
``LIVE_KEEP_TIMELINE=FILE`` keeps a copy of the last run's rounds and store passes (one JSON line each).

Each request sent is one of ``--spans`` generated ones with fresh trace and conversation ids (``--same-conversations``:
fresh trace ids only, so every reuse is one more turn of the same conversations, as before session 18).

Beside it, in the same run: the acknowledged-only latency of the same requests (p50/p99, the
floor every live figure includes) and the time one ``root_causes`` poll takes at the end (the
granularity of the measurement). And while the load runs, how many of the machine's cores are in use (``/proc/stat``)
and whose: the collector with its converters, the polls' process, the load's own clients, anything else. All of them
share the same cores, so when they are all in use, the cores are what sets the latency.

    python bench/live.py --rates 1000 10000 40000 --seconds 30
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import itertools
import multiprocessing as mp
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.cores import Cores, cores_cell, cpu_seconds
from bench.gen import whole_trace_requests
from bench.ingest import _unique, tid_offsets
from bench.live_timeline import FileWatch, q, rounds_table, steps_table, trace_steps

console = Console(width=160)


@dataclass
class Sent:
    """What one client sent: per acknowledged request, (ack time, salt, index, body number)."""

    acks: list[tuple[float, int, int, int]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    spans: int = 0
    errors: int = 0


def bodies_and_ids(n_spans: int, seed: int) -> tuple[list[bytes], list[list[bytes]], list[int]]:
    """Serialized requests of whole traces, the trace ids in each, and their span counts."""
    reqs = list(whole_trace_requests(n_spans, seed))
    bodies = [r.SerializeToString() for r in reqs]
    ids = [sorted({s.trace_id for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans}) for r in reqs]
    counts = [sum(len(ss.spans) for rs in r.resource_spans for ss in rs.scope_spans) for r in reqs]
    return bodies, ids, counts


def fresh_id(trace_id: bytes, salt: int, i: int) -> bytes:
    """The trace id a request ``i`` of client ``salt`` gets (6 bytes replaced, as ``bench.ingest._unique`` does)."""
    return trace_id[:10] + struct.pack(">HI", salt, i)


CONVERSATION = re.compile(rb"conv-([0-9a-f]{10})")  # bench.gen's conversation ids: 40 random bits as 10 hex digits


def conversation_offsets(body: bytes) -> list[tuple[int, int]]:
    """(offset, value) of the 10 hex digits of every conversation id in ``body``."""
    return [(m.start(1), int(m.group(1), 16)) for m in CONVERSATION.finditer(body)]


def fresh_conversations(body: bytes, found: list[tuple[int, int]], salt: int, i: int) -> bytes:
    """``body`` with every conversation id moved by a step of request ``i`` of client ``salt``: each request sent is
    a turn of conversations of its own, as ``bench.gen`` made them (one trace each), not one more turn of the
    conversations of every earlier request built from the same body (same times, ever longer conversations)."""
    if not found:
        return body
    step = ((salt << 24 | i) * 0x9E3779B1) & 0xFFFFFFFFFF
    out = bytearray(body)
    for pos, value in found:
        out[pos:pos + 10] = b"%010x" % ((value + step) & 0xFFFFFFFFFF)
    return bytes(out)


def client(port: int, bodies: list[bytes], ids: list[list[bytes]], counts: list[int], rate: float,
           seconds: float, salt: int, out: mp.Queue, same_conversations: bool = False) -> None:
    """Send paced requests for ``seconds``; put a ``Sent`` on ``out``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/x-protobuf"}
    offsets = [tid_offsets(b, t) for b, t in zip(bodies, ids, strict=True)]
    convs = [[] if same_conversations else conversation_offsets(b) for b in bodies]
    sent, start, i = Sent(), time.monotonic(), 0
    while time.monotonic() < start + seconds:
        k = i % len(bodies)
        t0 = time.monotonic()
        body = fresh_conversations(_unique(bodies[k], offsets[k], salt, i), convs[k], salt, i)
        conn.request("POST", "/v1/traces", body=body, headers=headers)
        r = conn.getresponse()
        r.read()
        t1 = time.monotonic()
        if r.status == 200:
            sent.acks.append((t1, salt, i, k))
            sent.latencies.append(t1 - t0)
            sent.spans += counts[k]
        else:
            sent.errors += 1
            time.sleep(min(2.0, float(r.getheader("Retry-After") or 0.05)))
        i += 1
        ahead = start + sent.spans / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    out.put(sent)


class Collector:
    """A ``tracedag collect`` process with continuous build and score."""

    def __init__(self, data: Path, interval: float, tree: str = "", extra: tuple[str, ...] = (),
                 timeline: Path | None = None) -> None:
        log = os.environ.get("LIVE_COLLECTOR_LOG")  # a file the collectors' logs (-v) are appended to (default: dropped)
        cmd = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", *(["-v"] if log else []),
               "collect", "--http-port", "0", "--grpc-port", "0", "--data", str(data), "--build", "--build-interval",
               str(interval), *extra]
        env = {**os.environ, "PYTHONPATH": tree} if tree else None  # tree: a directory holding another tracedag/
        if timeline is not None:
            env = {**(env or os.environ), "TRACEDAG_LIVE_TIMELINE": str(timeline)}
        err = open(log, "a") if log else subprocess.DEVNULL  # noqa: SIM115 (the process outlives this call)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        self.started = time.monotonic()
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            m = re.search(r"http_port=(\d+)", line)
            if m:
                self.port = int(m.group(1))
                return
        raise RuntimeError("collector did not start")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(60)


class Poller(threading.Thread):
    """Runs ``root_causes`` every ``every`` seconds; records when each trace id first appears.

    The polls run in a child process (``poll_child``) importing tracedag from ``tree`` when given, so a
    baseline collector is polled with its own queries and views (its store may lack later tables).
    """

    def __init__(self, data: Path, every: float, tree: str = "") -> None:
        super().__init__(daemon=True)
        self.data, self.every = data, every
        self.seen: dict[str, float] = {}
        self.query_seconds: list[float] = []
        self.started: list[float] = []  # when each poll began (monotonic)
        self.final: set[str] = set()
        self.built = 0  # traces scored (with step_scores rows), as of the last poll once counting (``count_from_now``)
        self.errors: list[str] = []  # polls that failed (their first line), after the first build
        self.final_query = float("nan")
        env = {**os.environ, "PYTHONPATH": tree} if tree else None
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--poll-child", str(data),
                                      str(every)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def run(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, t, secs, built, *ids = line.split()
            if kind == "error":
                self.errors.append(" ".join(ids))
                continue
            if kind == "final":
                self.final, self.final_query = set(ids), float(secs)
                continue
            self.query_seconds.append(float(secs))
            self.started.append(float(t) - float(secs))
            self.built = int(built)
            for trace in ids:
                self.seen.setdefault(trace, float(t))

    def count_from_now(self) -> None:
        """From the next poll on, also count the traces scored (``built``): what ``settle`` waits for once the load
        has ended. Not before: on the cores the collector uses, that count reads every trace's latest build and its
        scores, whatever the store's size (0.03-0.05 s of CPU on 9k traces, several times that on the 100k traces
        of a two-minute run at 10k spans/s), which no user's poll does."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("count\n")
        self.proc.stdin.flush()

    def finish(self) -> None:
        """Stop polling; run the final query (in the child); wait for its answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        self.proc.wait(600)
        self.join(60)


def poll_child(data: Path, every: float) -> None:
    """The polling loop (a child process): one line per poll, ``poll <t> <seconds> <traces scored> <trace ids
    new>`` (traces scored: -1 until a ``count`` line on stdin); on a ``stop`` line, one ``final <t> <seconds> 0
    <every trace id>`` line, then exit."""
    from tracedag.pipeline.store.querying import run_named, run_sql

    stop, counting, seen = threading.Event(), threading.Event(), set()

    def orders() -> None:
        for line in sys.stdin:
            (counting if line.strip() == "count" else stop).set()
            if stop.is_set():
                return
        stop.set()

    threading.Thread(target=orders, daemon=True).start()
    while not stop.wait(every):
        t0 = time.monotonic()
        try:
            rows = run_named(data, "root_causes").column("trace_id").to_pylist()
        except Exception as e:  # the views may not exist before the first build: poll again (said once built)
            if seen:
                print("error", t0, 0, 0, type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "", flush=True)
            continue
        t1 = time.monotonic()
        new = [t for t in rows if t not in seen]
        seen.update(new)
        built = -1
        try:
            # scored, not built: a round writes its builds before it scores them, and the root causes come
            # from the scores (counting builds ended runs while a large round was still scoring)
            if counting.is_set():
                built = run_sql(data, "select count(distinct trace_id) as n from step_scores").column("n")[0].as_py()
        except Exception:  # a file compacted away under the count: the next poll says
            pass
        print("poll", t1, t1 - t0, built, *new, flush=True)
    for attempt in range(5):  # a compaction may swap a file under the query: ask again
        t0 = time.monotonic()
        try:
            rows = run_named(data, "root_causes").column("trace_id").to_pylist()
            break
        except Exception:
            if attempt == 4:
                raise
    print("final", time.monotonic(), time.monotonic() - t0, 0, *rows, flush=True)


def settle(poller: Poller, quiet: float, traces: int, most: float) -> float:
    """Wait until every one of the ``traces`` sent is scored and then no new root cause appeared for ``quiet`` seconds
    AND two polls (at most ``most`` seconds); return the seconds waited. Without the first condition a collector far
    behind (a round longer than ``quiet``) ended the run early, and the figures counted the traces it had done; without
    the polls, a poll slower than ``quiet`` (10-20 s at load 30-50) ended it before any poll saw the last traces, which
    then counted as "missing" and left the latency figures (and the slowest traces) out."""
    start = last = time.monotonic()
    count, polls_then = -1, 0
    while time.monotonic() - start < most:
        time.sleep(poller.every)
        polls = len(poller.query_seconds)
        if len(poller.seen) != count:
            last, count, polls_then = time.monotonic(), len(poller.seen), polls
        if poller.built < traces:  # that poll's count: the next poll is the first to see them all
            polls_then = polls
        if time.monotonic() - last >= quiet and polls - polls_then >= 2:
            break
    return time.monotonic() - start


def run_rate(rate: float, args: argparse.Namespace, bodies, ids, counts, tree: str = "",
             label: str = "this tree") -> dict[str, float]:
    """One paced run at ``rate`` spans/s (the collector from ``tree`` when given); return the latency figures."""
    data = Path(tempfile.mkdtemp(prefix="bench-live-"))
    timeline = data.with_name(data.name + ".timeline") if args.timeline else None  # a tree without it writes none
    col = Collector(data, args.interval, tree, () if tree else tuple(args.collect_arg), timeline)
    steps: dict[str, list[float]] = {}
    cpu = float("nan")
    poller = Poller(data, args.poll, tree)
    files = FileWatch(data) if timeline is not None else None
    try:
        poller.start()
        if args.count_every_poll:  # the bench before session 21: the polls' process counted from the first poll
            poller.count_from_now()
        if files is not None:
            files.start()
        before = Cores.now(col.proc.pid, poller.proc.pid)
        sent = drive(col.port, bodies, ids, counts, rate, args)
        cores = Cores.now(col.proc.pid, poller.proc.pid).since(before)
        poller.count_from_now()
        waited = settle(poller, args.settle, len(ack_times(sent, ids)), args.most)
        poller.finish()
        acked = {t: a for t, a in ack_times(sent, ids).items() if t in poller.final}
        cpu = cpu_seconds(col.proc.pid)  # the collector and its converters, the whole run (the load and the settling)
        if timeline is not None:
            console.print(f"{label}: the collector and its converters used {cpu:.1f} s of CPU in "
                          f"{time.monotonic() - col.started:.1f} s; the polls {cpu_seconds(poller.proc.pid):.1f} s")
        col.stop()
        if files is not None:
            files.stop.set()
            files.join(60)
        if timeline is not None and files is not None and timeline.exists():
            steps = trace_steps(data, timeline, acked, poller.seen, files.seen, poller.started)
            console.print(rounds_table(timeline, f"{label} {rate:,.0f} spans/s"))
    finally:
        col.stop()
        if poller.proc.poll() is None:
            poller.proc.kill()
        shutil.rmtree(data, ignore_errors=True)
        if timeline is not None:
            if os.environ.get("LIVE_KEEP_TIMELINE") and timeline.exists():  # a copy to read round by round
                shutil.copy(timeline, os.environ["LIVE_KEEP_TIMELINE"])
            timeline.unlink(missing_ok=True)
    f = figures(rate, sent, acked, poller, poller.final_query, args)
    f["built"], f["sent"], f["settle"], f["cpu"] = poller.built, len(ack_times(sent, ids)), waited, cpu
    f["first_poll_error"] = poller.errors[0] if poller.errors else ""
    f.update(cores)
    if steps:
        console.print(steps_table(steps, f"{label} {rate:,.0f} spans/s"))
        gaps = sorted(b - a for a, b in itertools.pairwise(poller.started))
        console.print(f"{label}: {len(gaps) + 1} polls, begun every {q(gaps, 0.5):.2f} s (median; p90 "
                      f"{q(gaps, 0.9):.2f}, max {max(gaps, default=0):.2f}), each {q(sorted(poller.query_seconds), 0.5):.2f} s "
                      f"(p90 {q(sorted(poller.query_seconds), 0.9):.2f})")
    return f


def drive(port: int, bodies, ids, counts, rate: float, args: argparse.Namespace) -> list[Sent]:
    ctx = mp.get_context("fork")
    q: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=client, args=(port, bodies, ids, counts, rate / args.clients, args.seconds, j, q,
                                              args.same_conversations))
             for j in range(args.clients)]
    for p in procs:
        p.start()
    sent = [q.get() for _ in procs]
    for p in procs:
        p.join()
    return sent


def ack_times(sent: list[Sent], ids: list[list[bytes]]) -> dict[str, float]:
    """Fresh trace id (hex) of every trace sent -> when its request was acknowledged."""
    return {fresh_id(trace, salt, i).hex(): t for s in sent for t, salt, i, k in s.acks for trace in ids[k]}


def figures(rate: float, sent: list[Sent], acked: dict[str, float], poller: Poller, final_query: float,
            args: argparse.Namespace) -> dict[str, float]:
    lat = sorted(poller.seen[t] - a for t, a in acked.items() if t in poller.seen)
    acks = sorted(x for s in sent for x in s.latencies)
    return {
        "rate": rate, "offered": sum(s.spans for s in sent) / args.seconds,
        "traces": len(acked), "missing": len(acked) - len(lat),  # in the final result, never seen by a poll
        "p50": q(lat, 0.5), "p99": q(lat, 0.99), "ack_p50": q(acks, 0.5) * 1e3, "ack_p99": q(acks, 0.99) * 1e3,
        "poll": statistics.median(poller.query_seconds) if poller.query_seconds else float("nan"),
        # the polls begun before the last ack: the median above is mostly the fast polls after the load, with every
        # trace stored; a poll computes the traces not stored yet from their SQL (1-3 s each at 10k spans/s)
        "poll_loaded": _loaded_poll(poller, max((a for s in sent for a, *_ in s.acks), default=0.0)),
        "final_query": final_query, "errors": sum(s.errors for s in sent), "poll_errors": len(poller.errors),
    }


def _loaded_poll(poller: Poller, last_ack: float) -> float:
    """The median time of the polls begun before ``last_ack`` (nan: none)."""
    during = [d for s, d in zip(poller.started, poller.query_seconds, strict=True) if s <= last_ack]
    return statistics.median(during) if during else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rates", type=float, nargs="+", default=[1000, 10000, 40000])
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each paced run")
    ap.add_argument("--spans", type=int, default=51_200, help="generated spans (requests are reused with fresh ids)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--same-conversations", action="store_true",
                    help="keep the conversation ids of the reused requests (before session 18: every reuse of a request "
                         "was one more turn, at the same times, of the same conversations)")
    ap.add_argument("--interval", type=float, default=1.0, help="the collector's --build-interval")
    ap.add_argument("--poll", type=float, default=0.5, help="seconds between root_causes polls")
    ap.add_argument("--settle", type=float, default=15.0,
                    help="after the load, stop once no new root cause appeared for this many seconds")
    ap.add_argument("--most", type=float, default=300.0,
                    help="after the load, wait at most this long for every trace sent to be scored and seen")
    ap.add_argument("--baseline-tree", action="append", default=[], metavar="[LABEL=]DIR",
                    help="a directory holding another tracedag/ package (e.g. an older checkout): each rate is "
                         "also run with the collector (and the polls) from it, alternating, as a baseline of the "
                         "same run; repeat for several baselines")
    ap.add_argument("--collect-arg", action="append", default=[], metavar="ARG",
                    help="an argument added to this tree's tracedag collect (not a baseline's), e.g. "
                         "--collect-arg=--materialize-interval --collect-arg=5; repeat for several")
    ap.add_argument("--count-every-poll", action="store_true",
                    help="count the traces scored after every poll from the start, as the bench did before session "
                         "21, not only once the load has ended (the count reads the whole store on the same cores)")
    ap.add_argument("--timeline", action="store_true",
                    help="print where each trace's latency goes (this tree's collector; see the module's docstring)")
    ap.add_argument("--no-this-tree", action="store_true", help="run the baseline trees only")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each rate and tree (alternating); medians")
    ap.add_argument("--poll-child", nargs=2, metavar=("DATA", "EVERY"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.poll_child:
        poll_child(Path(args.poll_child[0]), float(args.poll_child[1]))
        return 0
    bodies, ids, counts = bodies_and_ids(args.spans, 0)
    console.print(f"{len(bodies)} requests of whole traces, {sum(counts)} spans; {os.cpu_count()} CPUs; "
                  f"load average {os.getloadavg()[0]:.1f}")
    trees = [_tree(t) for t in args.baseline_tree] + ([] if args.no_this_tree else [("this tree", "")])
    table = _table("span ack -> root cause queryable (tracedag collect with continuous build and score), each run")
    results: dict[tuple[float, str], list[dict[str, float]]] = {}
    for rate in args.rates:
        for r in range(args.repeat):
            for label, tree in trees if r % 2 == 0 else trees[::-1]:  # alternate which goes first
                f = run_rate(rate, args, bodies, ids, counts, tree, label)
                f["load"] = os.getloadavg()[0]
                results.setdefault((rate, label), []).append(f)
                table.add_row(label, *_cells(f))
                console.print(f"{label} {rate:,.0f}: scored {f['built']:.0f}/{f['sent']:.0f} p50 {f['p50']:.2f} "
                              f"p99 {f['p99']:.2f} poll {f['poll']:.2f} (under load {f['poll_loaded']:.2f}) "
                              f"load {f['load']:.1f} failed polls {f['poll_errors']:.0f}; cores busy under load "
                              f"{cores_cell(f)} (collector + polls + clients + other)"
                              f"{' (first: ' + escape(str(f['first_poll_error'])) + ')' if f['poll_errors'] else ''}")
    console.print(table)
    if args.repeat > 1 or len(trees) > 1:
        console.print(_summary(results, [label for label, _ in trees]))
    console.print("latency = first root_causes poll that returns the trace - ack of the request that completed it; "
                  "it includes up to one poll interval and one poll's duration ('poll s', median).")
    return 0


def _tree(spec: str) -> tuple[str, str]:
    """(label, a directory to put first on PYTHONPATH). A checkout (``pipeline/`` and ``collector/`` at its top, no
    ``tracedag/``) gets a shim of its own in the temp directory: with its path alone on PYTHONPATH, ``import
    tracedag`` would find this tree's editable install, and the baseline would silently run this tree."""
    label, _, path = spec.rpartition("=")
    root = Path(path)
    if not (root / "tracedag").is_dir():
        # imported here: the polls' processes import this module with the tree's own tracedag
        from bench.trace_by_id import _shim

        if not (root / "pipeline").is_dir():
            raise SystemExit(f"--baseline-tree {spec}: neither a tracedag/ package nor a checkout")
        digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]
        path = str(_shim(root, Path(tempfile.gettempdir()) / f"tracedag-live-shim-{digest}"))
    return (label or root.name, path)


def _table(title: str) -> Table:
    table = Table(title=title)
    for col in ("code", "offered spans/s", "paced at", "traces scored/sent", "drained after s",
                "traces with a root cause", "missing", "p50 s", "p99 s", "ack p50 ms", "ack p99 ms", "poll s",
                "failed polls", "errors", "collector CPU s", "cores busy under load = collector + polls + clients + other", "load"):
        table.add_column(col, justify="right")
    return table


def _cells(f: dict[str, float]) -> list[str]:
    return [f"{f['offered']:,.0f}", f"{f['rate']:,.0f}", f"{f['built']:.0f}/{f['sent']:.0f}", f"{f['settle']:.0f}",
            str(f["traces"]), str(f["missing"]), f"{f['p50']:.2f}",
            f"{f['p99']:.2f}", f"{f['ack_p50']:.1f}", f"{f['ack_p99']:.1f}", f"{f['poll']:.2f}", str(f["poll_errors"]), str(f["errors"]),
            f"{f['cpu']:.1f}", cores_cell(f), f"{f['load']:.1f}"]


def _summary(results: dict[tuple[float, str], list[dict[str, float]]], labels: list[str]) -> Table:
    """Medians per rate and tree, and each tree's p50/p99 as a ratio of the first tree's (the first baseline)."""
    table = Table(title=f"medians per rate and tree; ratio = p99 / {labels[0]}'s p99, same run")
    for col in ("rate", "code", "runs", "offered spans/s", "p50 s", "p99 s", "p99 ratio", "poll s", "under load",
                "ack p99 ms", "collector CPU s", "cores in use under load", "load"):
        table.add_column(col, justify="right")
    for (rate, label), runs in results.items():
        busy = statistics.median(f.get("busy_share", float("nan")) for f in runs)
        med = {k: statistics.median(f[k] for f in runs)
               for k in ("offered", "p50", "p99", "poll", "poll_loaded", "ack_p99", "cpu", "load")}
        base = statistics.median(f["p99"] for f in results[(rate, labels[0])])
        table.add_row(f"{rate:,.0f}", label, str(len(runs)), f"{med['offered']:,.0f}", f"{med['p50']:.2f}",
                      f"{med['p99']:.2f}", f"{med['p99'] / base:.2f}", f"{med['poll']:.2f}",
                      f"{med['poll_loaded']:.2f}", f"{med['ack_p99']:.1f}", f"{med['cpu']:.1f}",
                      f"{busy:.0%} busy", f"{min(f['load'] for f in runs):.1f}-{max(f['load'] for f in runs):.1f}")
    return table


if __name__ == "__main__":
    raise SystemExit(main())
