"""The agent graph by utility, as an SVG written directly (no plotting dependency).

Nodes are laid out in layers from the entry nodes (breadth-first distance, networkx), left to
right. Node area grows with the share of conversations that visit the node; edge width with the
share of transitions. Fill turns red with the node's failure rate. Observed transitions the agent
graph does not allow are red and dashed; graph edges never taken are thin, light and dotted;
graph nodes never visited are dashed outlines. A legend explains sizes, widths and colours.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import networkx as nx

from tracedag.schemas.agent_graph import AgentGraph

logger = logging.getLogger(__name__)

R_MIN, R_MAX = 12.0, 46.0
W_MIN, W_MAX = 1.5, 14.0
GAP_X, GAP_Y, MARGIN, TOP, LEGEND_W = 250.0, 150.0, 70.0, 110.0, 300.0
C_OK, C_BAD, C_UNUSED, C_FILL, C_FAIL = "#4a4a4a", "#d62728", "#b8b8b8", "#9ecae1", "#de2d26"


@dataclass
class NodeStat:
    """What the picture shows of one node."""

    name: str
    share: float = 0.0
    visits: int = 0
    failures: int = 0
    in_graph: bool = True


@dataclass
class EdgeStat:
    """What the picture shows of one edge."""

    source: str
    target: str
    transitions: int = 0
    share: float = 0.0
    allowed: bool | None = None
    in_graph: bool = False


@dataclass
class Picture:
    """Everything one agent's picture needs."""

    agent: str
    nodes: dict[str, NodeStat]
    edges: list[EdgeStat]
    start: list[str]
    subtitle: str
    flow: dict[str, float] = field(default_factory=dict)
    """Mean relative position of each node's first visit in the runs (orders the layout)."""


def _fmt_pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def build_picture(agent: str, node_rows: list[dict[str, Any]], edge_rows: list[dict[str, Any]],
                  summary: dict[str, Any], graph: AgentGraph | None,
                  flow: dict[str, float] | None = None) -> Picture:
    """Merge the utility rows of one agent with its graph (when given) into a ``Picture``."""
    nodes = {n: NodeStat(n) for n in (graph.node_names if graph else [])}
    for r in node_rows:
        st = nodes.setdefault(r["node"], NodeStat(r["node"], in_graph=graph is None))
        st.share, st.visits, st.failures = r["conversation_share"], r["visits"], r["failures"]
    edges = {(e.source, e.target): EdgeStat(e.source, e.target, in_graph=True) for e in graph.edges} if graph else {}
    for r in edge_rows:
        key = (r["source"], r["target"])
        st_e = edges.setdefault(key, EdgeStat(*key))
        st_e.transitions, st_e.share, st_e.allowed = r["transitions"], r["transition_share"], r["allowed"]
        if graph is None:
            st_e.in_graph = True
    start = list(graph.start) if graph else _observed_starts(nodes, list(edges.values()))
    return Picture(agent, nodes, list(edges.values()), start, _subtitle(summary), dict(flow or {}))


def first_visit_flow(paths: list[list[str]]) -> dict[str, float]:
    """Mean relative position (0 = first, 1 = last) of each node's first visit, over the node
    paths that visit it: the final node of every conversation sorts last, whatever the length."""
    sums: dict[str, list[float]] = {}
    for path in paths:
        seen: dict[str, int] = {}
        for i, node in enumerate(path):
            seen.setdefault(node, i)
        last = max(1, len(path) - 1)
        for node, i in seen.items():
            acc = sums.setdefault(node, [0.0, 0.0])
            acc[0] += i / last
            acc[1] += 1
    return {n: s / c for n, (s, c) in sums.items()}


def _observed_starts(nodes: dict[str, NodeStat], edges: list[EdgeStat]) -> list[str]:
    incoming = {e.target for e in edges if e.transitions and e.source != e.target}
    roots = [n for n in nodes if n not in incoming]
    return roots or sorted(nodes, key=lambda n: -nodes[n].visits)[:1]


def _subtitle(s: dict[str, Any]) -> str:
    parts = [f"{s.get('conversations', 0)} conversations", f"{s.get('turns', 0)} turns",
             f"{s.get('node_visits', 0)} node visits"]
    if s.get("transitions_per_turn") is not None:
        parts.append(f"{s['transitions_per_turn']:.2f} transitions/turn")
    if s.get("adherence") is not None:
        parts.append(f"adherence {_fmt_pct(s['adherence'])}")
    if s.get("failed_visits"):
        parts.append(f"{s['failed_visits']} failed visits")
    return " · ".join(parts)


def _ranks(g: nx.DiGraph, p: Picture) -> dict[str, float]:
    """Flow rank in [0, 1]: the mean relative first-visit position; unvisited nodes use their BFS
    distance from the entry nodes, scaled to [0, 1]."""
    dist: dict[str, int] = {}
    roots = list(p.start)
    while True:
        for s in roots:
            for n, d in nx.single_source_shortest_path_length(g, s).items():
                dist[n] = min(d, dist.get(n, d))
        rest = [n for n in p.nodes if n not in dist]
        if not rest:
            break
        free = [n for n in rest if not any(m in rest for m in g.predecessors(n))]
        roots = free or sorted(rest, key=lambda n: (-p.nodes[n].visits, n))[:1]
    far = max(1, max(dist.values(), default=1))
    return {n: p.flow.get(n, dist[n] / far) for n in p.nodes}


def _layers(g: nx.DiGraph, p: Picture) -> dict[str, int]:
    """Longest-path layering over the edges that go forward in the flow (a DAG by construction)."""
    rank = _ranks(g, p)
    order = sorted(p.nodes, key=lambda n: (rank[n], n))
    index = {n: i for i, n in enumerate(order)}
    layer: dict[str, int] = {}
    for n in order:
        preds = [m for m in g.predecessors(n) if index[m] < index[n]]
        layer[n] = max((layer[m] + 1 for m in preds), default=0)
    return layer


def layout(p: Picture) -> dict[str, tuple[float, float]]:
    """Layered positions: x by flow layer, y ordered by the predecessors' positions."""
    g = nx.DiGraph()
    g.add_nodes_from(p.nodes)
    g.add_edges_from((e.source, e.target) for e in p.edges if e.in_graph or e.transitions)
    layer_of = _layers(g, p)
    layers: dict[int, list[str]] = {}
    for n in p.nodes:
        layers.setdefault(layer_of[n], []).append(n)
    pos: dict[str, tuple[float, float]] = {}
    for x in sorted(layers):
        order = sorted(layers[x], key=lambda n: (_bary(g, n, pos), -p.nodes[n].visits, n))
        for i, n in enumerate(order):
            pos[n] = (MARGIN + R_MAX + x * GAP_X, TOP + R_MAX + (i - (len(order) - 1) / 2) * GAP_Y)
    _clear_long_edges(g, layer_of, pos)
    return _shift_down(pos)


def _clear_long_edges(g: nx.DiGraph, layer_of: dict[str, int], pos: dict[str, tuple[float, float]]) -> None:
    """Move a node off a longer edge that would cross it: odd layers up, even layers down."""
    moved: set[str] = set()
    for u, v in g.edges:
        if layer_of[v] - layer_of[u] < 2:
            continue
        (x1, y1), (x2, y2) = pos[u], pos[v]
        for w, (xw, yw) in list(pos.items()):
            if w in moved or w in (u, v) or not x1 < xw < x2:
                continue
            y_line = y1 + (y2 - y1) * (xw - x1) / (x2 - x1)
            if abs(yw - y_line) < R_MAX + 12:
                shift = 0.55 * GAP_Y * (-1 if layer_of[w] % 2 else 1)
                pos[w] = (xw, yw + shift)
                moved.add(w)


def _bary(g: nx.DiGraph, n: str, pos: dict[str, tuple[float, float]]) -> float:
    ys = [pos[m][1] for m in g.predecessors(n) if m in pos]
    return sum(ys) / len(ys) if ys else 0.0


def _shift_down(pos: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    top = min((y for _, y in pos.values()), default=TOP + R_MAX)
    dy = TOP + R_MAX - top
    return {n: (x, y + dy) for n, (x, y) in pos.items()}


def _radius(st: NodeStat) -> float:
    return R_MIN + (R_MAX - R_MIN) * math.sqrt(max(0.0, min(1.0, st.share)))


def _width(share: float, top: float) -> float:
    return W_MIN + (W_MAX - W_MIN) * (share / top if top > 0 else 0.0)


def _mix(a: str, b: str, t: float) -> str:
    ca = [int(a[i:i + 2], 16) for i in (1, 3, 5)]
    cb = [int(b[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(ca, cb, strict=True))


def _edge_color(e: EdgeStat) -> tuple[str, str]:
    """Stroke colour and dash pattern of an edge."""
    if not e.transitions:
        return C_UNUSED, "2 5"
    if e.allowed is False:
        return C_BAD, "8 5"
    return C_OK, ""


def _edge_svg(
    e: EdgeStat, pos: dict[str, tuple[float, float]], p: Picture, top: float, with_label: bool = True
) -> str:
    color, dash = _edge_color(e)
    width = _width(e.share, top) if e.transitions else 1.2
    head = 9.0 + 1.1 * width
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    (x1, y1), (x2, y2) = pos[e.source], pos[e.target]
    r1, r2 = _radius(p.nodes[e.source]), _radius(p.nodes[e.target])
    if e.source == e.target:
        (sx, sy, c1x, c1y, c2x, c2y, ex, ey), lx, ly = _loop_path(x1, y1, r1)
    else:
        (sx, sy, c1x, c1y, ex, ey), lx, ly = _curve_path(x1, y1, r1, x2, y2, r2 + 2)
        c2x, c2y = c1x, c1y
    # end the line where the arrowhead starts, so a wide line does not poke through its tip
    bx, by = _toward(ex, ey, c2x, c2y, head * 0.8)
    d = f"M{sx:.1f},{sy:.1f} C{c1x:.1f},{c1y:.1f} {c2x:.1f},{c2y:.1f} {bx:.1f},{by:.1f}"
    label = ""
    if e.transitions and with_label:
        text = f"{e.transitions} ({_fmt_pct(e.share)})"
        label = f'<text x="{lx:.1f}" y="{ly:.1f}" class="el" fill="{color}">{escape(text)}</text>'
    title = f"{e.source} → {e.target}: {e.transitions} transitions ({_fmt_pct(e.share)})"
    return (f'<g opacity="0.85"><title>{escape(title)}</title>'
            f'<path d="{d}" fill="none" stroke="{color}" stroke-width="{width:.2f}"{dash_attr} '
            f'stroke-linecap="round"/>{_arrowhead(ex, ey, c2x, c2y, head, color)}</g>{label}')


def _arrowhead(x: float, y: float, fx: float, fy: float, size: float, color: str) -> str:
    """A filled triangle with its tip at (x, y), pointing away from (fx, fy)."""
    d = math.hypot(x - fx, y - fy) or 1.0
    ux, uy = (x - fx) / d, (y - fy) / d
    bx, by = x - ux * size, y - uy * size
    half = size * 0.55
    pts = [(x, y), (bx - uy * half, by + ux * half), (bx + uy * half, by - ux * half)]
    return f'<polygon points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in pts)}" fill="{color}"/>'


def _curve_path(
    x1: float, y1: float, r1: float, x2: float, y2: float, r2: float
) -> tuple[tuple[float, ...], float, float]:
    """A curve bent to the right of its direction (A->B and B->A do not overlap); label point."""
    dx, dy = x2 - x1, y2 - y1
    dist = math.hypot(dx, dy) or 1.0
    ux, uy = dx / dist, dy / dist
    bend = min(0.15 * dist, 150.0) if x2 > x1 + 1 else min(0.3 * dist + 40, 230.0)
    cx, cy = (x1 + x2) / 2 - uy * bend, (y1 + y2) / 2 + ux * bend
    sx, sy = _toward(x1, y1, cx, cy, r1)
    ex, ey = _toward(x2, y2, cx, cy, r2)
    mx, my = 0.25 * sx + 0.5 * cx + 0.25 * ex, 0.25 * sy + 0.5 * cy + 0.25 * ey
    return (sx, sy, cx, cy, ex, ey), mx, my - 6


def _toward(x: float, y: float, tx: float, ty: float, r: float) -> tuple[float, float]:
    d = math.hypot(tx - x, ty - y) or 1.0
    return x + (tx - x) / d * r, y + (ty - y) / d * r


def _loop_path(x: float, y: float, r: float) -> tuple[tuple[float, ...], float, float]:
    """A loop above the node: start, two control points, end; label point above it."""
    sx, sy = x - r * 0.5, y - r * 0.87
    ex, ey = x + r * 0.5, y - r * 0.87
    h = r + 48
    return (sx, sy, x - r - 10, y - h, x + r + 10, y - h, ex, ey), x, y - h + 20


def _node_svg(st: NodeStat, x: float, y: float, is_start: bool) -> str:
    r = _radius(st)
    rate = st.failures / st.visits if st.visits else 0.0
    fill = _mix(C_FILL, C_FAIL, min(1.0, rate * 2)) if st.visits else "#ffffff"
    stroke = C_FAIL if st.failures else ("#08519c" if st.visits else "#999999")
    dash = "" if st.visits else ' stroke-dasharray="4 3"'
    lines = [f"{_fmt_pct(st.share)} of conv." if st.visits else "never visited"]
    if st.visits:
        lines[0] += f" · {st.visits} visits"
    if st.failures:
        lines.append(f"✗ {st.failures} failed")
    if not st.in_graph:
        lines.append("not in graph")
    name = ("▶ " if is_start else "") + st.name
    texts = [f'<text x="{x:.1f}" y="{y + r + 17:.1f}" class="nl">{escape(name)}</text>']
    texts += [f'<text x="{x:.1f}" y="{y + r + 32 + 13 * i:.1f}" class="ns">{escape(t)}</text>'
              for i, t in enumerate(lines)]
    title = f"{st.name}: {st.visits} visits, {_fmt_pct(st.share)} of conversations, {st.failures} failed"
    return (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{fill}" stroke="{stroke}" '
            f'stroke-width="2.5"{dash}><title>{escape(title)}</title></circle>' + "".join(texts))


_STYLE = """<style>
text { font-family: Helvetica, Arial, sans-serif; }
.title { font-size: 20px; font-weight: bold; fill: #222; }
.sub { font-size: 13px; fill: #555; }
.nl { font-size: 13px; font-weight: bold; text-anchor: middle; fill: #111; paint-order: stroke;
      stroke: #ffffff; stroke-width: 4px; stroke-opacity: 0.9; }
.ns { font-size: 11px; text-anchor: middle; fill: #444; paint-order: stroke; stroke: #ffffff;
      stroke-width: 3px; stroke-opacity: 0.9; }
.el { font-size: 11px; text-anchor: middle; font-weight: bold; paint-order: stroke; stroke: #ffffff;
      stroke-width: 4px; }
.lg { font-size: 12px; fill: #333; }
.lh { font-size: 13px; font-weight: bold; fill: #222; }
</style>"""


def _legend(x: float, y: float, top_share: float) -> str:
    out = [f'<rect x="{x:.1f}" y="{y:.1f}" width="{LEGEND_W - 20:.0f}" height="360" rx="8" fill="#fafafa" '
           f'stroke="#dddddd"/>', f'<text x="{x + 14:.1f}" y="{y + 24:.1f}" class="lh">Node size: share of '
           "conversations</text>"]
    cx_i = x + 14.0
    for share in (0.1, 0.5, 1.0):
        r = _radius(NodeStat("", share=share))
        cy = y + 82
        cx_i += r + 8
        out.append(f'<circle cx="{cx_i:.1f}" cy="{cy:.1f}" r="{r:.1f}" fill="{C_FILL}" stroke="#08519c" '
                   f'stroke-width="2"/><text x="{cx_i:.1f}" y="{y + 146:.1f}" class="ns">{_fmt_pct(share)}</text>')
        cx_i += r
    out.append(f'<text x="{x + 14:.1f}" y="{y + 182:.1f}" class="lh">Edge width: share of transitions</text>')
    for i, frac in enumerate((0.1, 0.5, 1.0)):
        ly = y + 200 + i * 20
        w = _width(frac * top_share, top_share)
        out.append(f'<line x1="{x + 16:.1f}" y1="{ly:.1f}" x2="{x + 86:.1f}" y2="{ly:.1f}" stroke="{C_OK}" '
                   f'stroke-width="{w:.1f}"/><text x="{x + 96:.1f}" y="{ly + 4:.1f}" class="lg">'
                   f"{_fmt_pct(frac * top_share)} of transitions</text>")
    rows = [(C_OK, "", "observed, allowed"), (C_BAD, "8 5", "observed, not in the graph"),
            (C_UNUSED, "2 5", "in the graph, never taken")]
    for i, (color, dash, text) in enumerate(rows):
        ly = y + 270 + i * 20
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<line x1="{x + 16:.1f}" y1="{ly:.1f}" x2="{x + 86:.1f}" y2="{ly:.1f}" stroke="{color}" '
                   f'stroke-width="3"{dash_attr}/><text x="{x + 96:.1f}" y="{ly + 4:.1f}" class="lg">{text}</text>')
    out.append(f'<circle cx="{x + 28:.1f}" cy="{y + 335:.1f}" r="9" fill="{_mix(C_FILL, C_FAIL, 1.0)}" '
               f'stroke="{C_FAIL}" stroke-width="2"/><text x="{x + 46:.1f}" y="{y + 339:.1f}" class="lg">'
               "red fill: failed visits (✗ count)</text>")
    return "".join(out)


def _vertical_extent(p: Picture, pos: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """Lowest and highest y that nodes, their labels and the edge curves reach."""
    ys = [y - R_MAX for _, y in pos.values()] + [y + R_MAX + 60 for _, y in pos.values()]
    for e in p.edges:
        (x1, y1), (x2, y2) = pos[e.source], pos[e.target]
        if e.source == e.target:
            ys.append(y1 - _radius(p.nodes[e.source]) - 48)
            continue
        (sy, cy, ey) = _curve_path(x1, y1, 0.0, x2, y2, 0.0)[0][1::2]
        ys.append(0.25 * sy + 0.5 * cy + 0.25 * ey - 14)
    return min(ys, default=TOP), max(ys, default=TOP)


def _labelled(p: Picture, most: int = 18) -> set[tuple[str, str]]:
    """The edges that get a count label: all of them in a small graph, else the most used."""
    used = sorted((e for e in p.edges if e.transitions), key=lambda e: -e.transitions)
    return {(e.source, e.target) for e in used[:most]}


def render_svg(p: Picture) -> str:
    """The SVG document of one agent's picture."""
    pos = layout(p)
    low, high = _vertical_extent(p, pos)
    dy = max(0.0, TOP - low)
    pos = {n: (x, y + dy) for n, (x, y) in pos.items()}
    top_share = max((e.share for e in p.edges), default=0.0)
    width = max((x for x, _ in pos.values()), default=0.0) + R_MAX + MARGIN + 40
    graph_w = max(width, 520.0)
    height = max(high + dy + 30, TOP + 370)
    labelled = _labelled(p)
    edges = "".join(_edge_svg(e, pos, p, top_share, (e.source, e.target) in labelled)
                    for e in sorted(p.edges, key=lambda e: e.share))
    nodes = "".join(_node_svg(st, *pos[n], n in p.start) for n, st in p.nodes.items())
    title = f"{p.agent} — agent graph by utility"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{graph_w + LEGEND_W:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {graph_w + LEGEND_W:.0f} {height:.0f}">{_STYLE}'
        f'<rect width="100%" height="100%" fill="#ffffff"/>'
        f'<text x="{MARGIN - 40}" y="36" class="title">{escape(title)}</text>'
        f'<text x="{MARGIN - 40}" y="58" class="sub">{escape(p.subtitle)}</text>'
        f"<g>{edges}</g><g>{nodes}</g>{_legend(graph_w, TOP - 20, top_share or 1.0)}</svg>\n"
    )


def _rows_for(table: Any, agent: str, version: str | None) -> list[dict[str, Any]]:
    return [r for r in table.to_pylist() if r["agent"] == agent and r["agent_version"] == version]


def _file_name(agent: str, version: str | None) -> str:
    label = agent + (f"-{version}" if version else "")
    return "agent_graph-" + re.sub(r"[^A-Za-z0-9._-]+", "_", label) + ".svg"


def write_pictures(result: Any, directory: Path) -> dict[str, Path]:
    """Write one SVG per agent of ``result`` (an ``AnalysisResult``) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for summary in result.tables["agent_utility"].to_pylist():
        agent, version = summary["agent"], summary["agent_version"]
        pic = build_picture(
            agent + (f" {version}" if version else ""),
            _rows_for(result.tables["node_utility"], agent, version),
            _rows_for(result.tables["edge_utility"], agent, version), summary, result.graph_of(agent),
            first_visit_flow([r.nodes for r in result.runs if r.agent == agent and r.agent_version == version]),
        )
        path = directory / _file_name(agent, version)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(render_svg(pic), encoding="utf-8")
        tmp.replace(path)
        written[pic.agent] = path
        logger.info("picture of %s: %s", pic.agent, path)
    return written
