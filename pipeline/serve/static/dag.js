// tracedag web UI: one trace's execution DAG and its timeline (waterfall), selection shared.
//
// Layout (computed here, cytoscape draws it with the preset layout; no graph layout library runs):
// a step with nested steps is a box holding them; inside a box the steps run left to right in
// execution order, one column per group of steps that overlap in time (parallel calls stack
// vertically). Each leaf is as wide as its label, so labels never overlap; the default zoom keeps
// labels at 11 px or more on screen (the view then starts at the root cause).
(function () {
  "use strict";
  const FONT = 13, FAMILY = "Helvetica, Arial, sans-serif", LEAF_H = 28, PAD = 10, LABEL_H = 22;
  const HGAP = 30, VGAP = 10, MIN_SCREEN_FONT = 11.5, MAX_ZOOM = 1.6;
  const MIN_ZOOM = MIN_SCREEN_FONT / FONT;
  const measureCtx = document.createElement("canvas").getContext("2d");
  measureCtx.font = `${FONT}px ${FAMILY}`;
  const textWidth = (s) => measureCtx.measureText(s).width;
  const esc = (v) => String(v == null ? "" : v).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));

  function colour(score) {
    if (score == null) return "#b8bec8";
    const t = Math.max(0, Math.min(1, (score - 1) / 4));
    const stops = [[215, 48, 39], [253, 174, 97], [26, 152, 80]];
    const [a, b, u] = t < 0.5 ? [stops[0], stops[1], t * 2] : [stops[1], stops[2], (t - 0.5) * 2];
    return "rgb(" + a.map((x, i) => Math.round(x + (b[i] - x) * u)).join(",") + ")";
  }

  const labelOf = (n) => n.step_name || n.step_type || n.span_id;
  const startOf = (n) => Number(n.start_time_unix_nano || 0);
  const endOf = (n) => startOf(n) + Number(n.duration_ms || 0) * 1e6;

  // ---- the call tree (nearest ancestor that is a DAG node) --------------------------------------
  function callTree(nodes) {
    const byId = new Map(nodes.map((n) => [n.span_id, { n, kids: [], depth: 0 }]));
    const top = [];
    for (const n of nodes) {
      const parent = n.parent_span_id ? byId.get(n.parent_span_id) : null;
      (parent && parent.n !== n ? parent.kids : top).push(byId.get(n.span_id));
    }
    const order = (a, b) => startOf(a.n) - startOf(b.n) || (a.n.topo_index || 0) - (b.n.topo_index || 0);
    const stack = top.slice();
    while (stack.length) {
      const t = stack.pop();
      t.kids.sort(order);
      for (const k of t.kids) { k.depth = t.depth + 1; stack.push(k); }
    }
    top.sort(order);
    return { top, byId };
  }

  // steps that start before the previous ones ended share a column (they ran in parallel)
  function columns(kids) {
    const cols = [];
    let end = -Infinity;
    for (const k of kids) {
      if (!cols.length || startOf(k.n) >= end - 1e5) { cols.push({ kids: [k] }); end = endOf(k.n); }
      else { cols[cols.length - 1].kids.push(k); end = Math.max(end, endOf(k.n)); }
    }
    return cols;
  }

  // sizes bottom-up: a leaf is its label's width; a box holds its columns and a label strip above it
  function measure(t) {
    t.lw = textWidth(labelOf(t.n));
    if (!t.kids.length) { t.w = Math.max(t.lw + 20, 44); t.h = LEAF_H; return; }
    t.kids.forEach(measure);
    t.cols = columns(t.kids);
    let w = 0, h = 0;
    for (const c of t.cols) {
      c.w = c.kids.reduce((m, k) => Math.max(m, k.w), 0);
      c.h = c.kids.reduce((s, k) => s + k.h, 0) + VGAP * (c.kids.length - 1);
      w += c.w; h = Math.max(h, c.h);
    }
    t.innerW = w + HGAP * (t.cols.length - 1);
    t.w = Math.max(t.innerW + 2 * PAD, t.lw + 8);
    t.h = LABEL_H + h + 2 * PAD;
  }

  // positions top-down; (x, y) is the top-left corner of t's footprint
  function place(t, x, y, pos) {
    if (!t.kids.length) { pos[t.n.span_id] = { x: x + t.w / 2, y: y + t.h / 2 }; return; }
    const boxTop = y + LABEL_H;
    pos[t.n.span_id] = { x: x + t.w / 2, y: boxTop + (t.h - LABEL_H) / 2, w: t.innerW + 2 * PAD, h: t.h - LABEL_H };
    let cx = x + (t.w - t.innerW) / 2;
    for (const [i, c] of t.cols.entries()) {
      let cy = boxTop + PAD;
      for (const k of c.kids) { k.col = i; k.parent = t; place(k, cx + (c.w - k.w) / 2, cy, pos); cy += k.h + VGAP; }
      cx += c.w + HGAP;
    }
  }

  function layout(tree) {
    const pos = {};
    let x = 0, h = 0;
    for (const t of tree.top) { measure(t); place(t, x, 0, pos); x += t.w + HGAP; h = Math.max(h, t.h); }
    pos.__bounds = { x1: 0, y1: 0, x2: Math.max(1, x - HGAP), y2: Math.max(1, h), w: Math.max(1, x - HGAP), h: Math.max(1, h) };
    return pos;
  }

  // ---- classes: failed / propagated / recovered / root cause / final failure / on the path ---------
  function classify(doc, path) {
    const fails = new Map((doc.failures || []).map((f) => [f.span_id, f]));
    const root = doc.root_cause ? doc.root_cause.root_span_id : null;
    const final = doc.root_cause ? doc.root_cause.failed_span_id : null;
    const onPath = new Set(path);
    return (id) => {
      const f = fails.get(id);
      const c = [];
      if (f) c.push(f.recovered ? "recovered" : f.kind === "propagated" ? "propagated" : "failed");
      if (id === root) c.push("root");
      if (id === final && final !== root) c.push("final");
      if (onPath.has(id)) c.push("chain");
      return c;
    };
  }

  function elements(doc, tree, pos, path) {
    const cls = classify(doc, path);
    const els = [];
    for (const n of doc.nodes) {
      const t = tree.byId.get(n.span_id);
      const p = pos[n.span_id];
      const group = t.kids.length > 0;
      els.push({ group: "nodes", position: { x: p.x, y: p.y },
                 data: { id: n.span_id, label: labelOf(n), colour: colour(n.score), w: group ? p.w : t.w,
                         h: group ? p.h : LEAF_H, z: t.depth * 2 + (group ? 0 : 1) },
                 classes: (group ? ["box"] : ["step"]).concat(cls(n.span_id)).join(" ") });
    }
    const seen = new Map();
    for (const e of doc.edges) {
      if (!tree.byId.has(e.source) || !tree.byId.has(e.target)) continue;
      const key = e.source + ">" + e.target;
      if (seen.has(key)) { seen.get(key).data.kind += "," + e.edge_kind; continue; }
      const el = { group: "edges", data: { id: "e" + seen.size, source: e.source, target: e.target, kind: e.edge_kind } };
      seen.set(key, el);
    }
    const hops = new Set();
    for (let i = 0; i + 1 < path.length; i++) hops.add(path[i] + ">" + path[i + 1]);
    for (const [key, el] of seen) {
      const parentOnly = el.data.kind.split(",").every((k) => k === "parent");
      if (parentOnly && !hops.has(key)) continue; // a child -> parent dependency is drawn by the box
      el.classes = edgeClasses(el, hops.has(key), parentOnly, tree, pos).join(" ");
      els.push(el);
    }
    return els;
  }

  // chain: on the propagation path; up: a path hop from a step to the box holding it (straight up
  // from the step's top right corner, clear of both labels); arc: an edge skipping a column of its box
  // bends over the steps in between instead of crossing them
  function edgeClasses(el, onPath, parentOnly, tree, pos) {
    const c = onPath ? ["chain"] : [];
    if (el.data.kind.split(",").includes("data")) c.push("data"); // value provenance: drawn dashed
    const a = tree.byId.get(el.data.source), b = tree.byId.get(el.data.target);
    const src = pos[el.data.source], dst = pos[el.data.target];
    if (parentOnly) {
      c.push("up");
      const sw = (src.w || a.w) / 2 - 8, sh = (src.h || LEAF_H) / 2;
      el.data.sep = `${sw.toFixed(1)}px ${(-sh).toFixed(1)}px`;
      el.data.tep = `${(src.x + sw - dst.x).toFixed(1)}px ${(-(dst.h || LEAF_H) / 2).toFixed(1)}px`;
    } else if (a.parent && a.parent === b.parent && Math.abs(b.col - a.col) > 1) {
      c.push("arc");
      el.data.cpd = -2 * (Math.abs(src.y - dst.y) / 2 + LEAF_H);
    }
    return c;
  }

  const STYLE = [
    { selector: "node", style: { shape: "round-rectangle", label: "data(label)", "font-size": FONT, "font-family": FAMILY,
                                 color: "#1d2330", width: "data(w)", height: "data(h)", "z-index": "data(z)",
                                 "text-valign": "center", "text-halign": "center", "z-index-compare": "manual" } },
    { selector: "node.step", style: { "background-color": "data(colour)", "background-opacity": 0.45,
                                      "border-width": 1, "border-color": "#8a93a3" } },
    { selector: "node.box", style: { "background-color": "#f4f6f9", "background-opacity": 1, "border-width": 1,
                                     "border-color": "data(colour)", "text-valign": "top", "text-margin-y": -3,
                                     "font-weight": "bold" } },
    { selector: "edge", style: { width: 1.2, "line-color": "#a9b0bb", "target-arrow-color": "#a9b0bb",
                                 "target-arrow-shape": "triangle", "curve-style": "straight", "arrow-scale": 0.8,
                                 "z-index": 999, "z-index-compare": "manual" } },
    { selector: "node.failed", style: { "border-width": 3, "border-color": "#b3261e" } },
    { selector: "node.propagated", style: { "border-width": 3, "border-style": "dashed", "border-color": "#e8710a" } },
    { selector: "node.recovered", style: { "border-width": 2, "border-style": "dotted", "border-color": "#1a7f37" } },
    { selector: "node.final", style: { "border-width": 6, "border-style": "double", "border-color": "#111" } },
    { selector: "node.root", style: { "border-width": 5, "border-style": "solid", "border-color": "#6a00a8",
                                      "font-weight": "bold" } },
    { selector: "edge.data", style: { width: 2, "line-style": "dashed", "line-color": "#c2185b",
                                      "target-arrow-color": "#c2185b", "curve-style": "unbundled-bezier",
                                      "control-point-distances": -40, "control-point-weights": 0.5 } },
    { selector: "edge.chain", style: { width: 4, "line-color": "#6a00a8", "target-arrow-color": "#6a00a8",
                                       "arrow-scale": 1.1, "z-index": 1000 } },
    { selector: "edge.arc", style: { "curve-style": "unbundled-bezier", "control-point-distances": "data(cpd)",
                                     "control-point-weights": 0.5 } },
    { selector: "edge.up", style: { "curve-style": "straight", "source-endpoint": "data(sep)", "target-endpoint": "data(tep)" } },
    { selector: "node:selected", style: { "overlay-opacity": 0.2, "overlay-color": "#1d64d8", "overlay-padding": 3 } },
  ];

  // The default view, from the layout's own bounds: fitted, but never below MIN_ZOOM (then the root
  // cause at a third of the width) nor above MAX_ZOOM. A drawing shorter than its pane at that zoom
  // gets a pane of its height (the timeline gets the rest).
  function initialView(dagEl, bb, focus) {
    dagEl.style.flex = "";
    const W = dagEl.clientWidth;
    let zoom = Math.min(MAX_ZOOM, Math.max(MIN_ZOOM, (W - 32) / bb.w));
    if (bb.h * zoom + 32 < dagEl.clientHeight) dagEl.style.flex = `0 0 ${Math.max(Math.ceil(bb.h * zoom + 32), 160)}px`;
    const H = dagEl.clientHeight;
    const fit = Math.min((W - 32) / bb.w, (H - 32) / bb.h);
    zoom = Math.min(MAX_ZOOM, Math.max(MIN_ZOOM, fit));
    const centre = { x: W / 2 - ((bb.x1 + bb.x2) / 2) * zoom, y: H / 2 - ((bb.y1 + bb.y2) / 2) * zoom };
    if (zoom <= fit || !focus) return { zoom, pan: centre, W, H };
    const pan = { x: bb.w * zoom + 32 <= W ? centre.x : W / 3 - focus.x * zoom,
                  y: bb.h * zoom + 32 <= H ? centre.y : 16 - bb.y1 * zoom };
    if (focus.y * zoom + pan.y > H - 40) pan.y = H / 2 - focus.y * zoom;
    return { zoom, pan, W, H };
  }

  // the elements inside the first view (half a pane around it) and the rest
  function firstBatch(els, view) {
    const m = { x: view.W / 2 / view.zoom, y: view.H / 2 / view.zoom };
    const x1 = -view.pan.x / view.zoom - m.x, x2 = (view.W - view.pan.x) / view.zoom + m.x;
    const y1 = -view.pan.y / view.zoom - m.y, y2 = (view.H - view.pan.y) / view.zoom + m.y;
    const near = new Set();
    const first = [], rest = [];
    for (const e of els) {
      if (e.group !== "nodes") continue;
      const p = e.position, hw = e.data.w / 2, hh = e.data.h / 2;
      const inside = p.x + hw >= x1 && p.x - hw <= x2 && p.y + hh >= y1 && p.y - hh <= y2;
      if (inside) near.add(e.data.id);
      (inside ? first : rest).push(e);
    }
    for (const e of els) if (e.group === "edges") (near.has(e.data.source) && near.has(e.data.target) ? first : rest).push(e);
    return { first, rest };
  }

  // ---- timeline (waterfall): one row per step in call-tree order ---------------------------------
  // Only the rows in view (and a few around them) are in the document: a 2,000-step trace keeps ~50.
  const ROW_H = 20;

  function timeline(el, doc, tree, path) {
    const rows = [];
    const walk = (t) => { rows.push(t); t.kids.forEach(walk); };
    tree.top.forEach(walk);
    const index = new Map(rows.map((t, i) => [t.n.span_id, i]));
    // reduce, not Math.min(...list): a spread of 100,000+ values overflows the call stack
    const t0 = doc.nodes.reduce((m, n) => Math.min(m, startOf(n)), Infinity);
    const span = Math.max(1, doc.nodes.reduce((m, n) => Math.max(m, endOf(n)), -Infinity) - t0);
    const fails = new Set((doc.failures || []).filter((f) => !f.recovered).map((f) => f.span_id));
    const onPath = new Set(path);
    const state = { selected: null };
    const rowHtml = (t, i) => {
      const n = t.n;
      const left = (100 * (startOf(n) - t0)) / span, width = (100 * (endOf(n) - startOf(n))) / span;
      const c = [fails.has(n.span_id) ? "failed" : "", onPath.has(n.span_id) ? "chain" : ""].join(" ");
      const ms = Number(n.duration_ms || 0);
      const inside = left + width > 85;
      return `<div class="row${n.span_id === state.selected ? " sel" : ""}" style="top:${i * ROW_H}px" data-span="${esc(n.span_id)}">` +
        `<span class="name" style="padding-left:${4 + 12 * t.depth}px" title="${esc(labelOf(n))}">${esc(labelOf(n))}</span>` +
        `<span class="lane"><span class="bar ${c}" style="left:${left.toFixed(3)}%;width:${width.toFixed(3)}%;background:${colour(n.score)}"></span>` +
        `<span class="ms${inside ? " in" : ""}" style="left:calc(${(inside ? left : left + width).toFixed(3)}% + 4px)">` +
        `${ms < 10 ? ms.toFixed(1) : Math.round(ms)} ms</span></span></div>`;
    };
    el.innerHTML = `<div class="space" style="height:${rows.length * ROW_H}px"></div>`;
    el.scrollTop = 0;
    const space = el.firstChild;
    const render = () => {
      const from = Math.max(0, Math.floor(el.scrollTop / ROW_H) - 10);
      const to = Math.min(rows.length, Math.ceil((el.scrollTop + el.clientHeight) / ROW_H) + 10);
      space.innerHTML = rows.slice(from, to).map((t, i) => rowHtml(t, from + i)).join("");
    };
    el.onscroll = render;
    render();
    el.dataset.rows = String(rows.length);
    return {
      select(id, scroll) {
        state.selected = id;
        const i = index.get(id);
        if (scroll && i != null && (i * ROW_H < el.scrollTop || (i + 1) * ROW_H > el.scrollTop + el.clientHeight)) {
          el.scrollTop = Math.max(0, i * ROW_H - el.clientHeight / 2);
        }
        render();
      },
    };
  }

  // ---- draw: DAG + timeline, a selection in either selects in both ---------------------------------
  function draw(dagEl, timelineEl, doc, onSelect, onComplete) {
    const path = doc.propagation_path || [];
    const tree = callTree(doc.nodes);
    const pos = layout(tree);
    const els = elements(doc, tree, pos, path);
    const root = doc.root_cause ? pos[doc.root_cause.root_span_id] : null;
    const view = initialView(dagEl, pos.__bounds, root);
    // what the first view shows is drawn at once; the rest is added after the first paint, in slices
    const batch = firstBatch(els, view);
    const cy = cytoscape({ container: dagEl, elements: batch.first, style: STYLE, layout: { name: "preset", fit: false },
                           zoom: view.zoom, pan: view.pan, minZoom: 0.05, maxZoom: 4,
                           boxSelectionEnabled: false, autoungrabify: true });
    const addRest = (from) => {
      if (cy.destroyed()) return;
      if (from >= batch.rest.length) { onComplete(cy); return; }
      const slice = batch.rest.slice(from, from + 400);
      cy.add(slice.filter((e) => e.group === "nodes"));
      cy.add(slice.filter((e) => e.group === "edges"));
      setTimeout(() => addRest(from + 400), 0);
    };
    if (batch.rest.length) requestAnimationFrame(() => requestAnimationFrame(() => addRest(0)));
    else onComplete(cy);
    const waterfall = timeline(timelineEl, doc, tree, path);
    const select = (id, from) => {
      cy.nodes(":selected").unselect();
      const node = cy.getElementById(id);
      node.select();
      if (from === "timeline" && node.length) {
        const p = node.renderedPosition();
        if (p.x < 0 || p.y < 0 || p.x > cy.width() || p.y > cy.height()) cy.center(node);
      }
      waterfall.select(id, from !== "timeline");
      timelineEl.dataset.selected = id;
      onSelect(id);
    };
    cy.on("tap", "node", (ev) => select(ev.target.id(), "dag"));
    timelineEl.onclick = (ev) => {
      const row = ev.target.closest(".row[data-span]");
      if (row) select(row.dataset.span, "timeline");
    };
    return { cy, select };
  }

  window.tracedagDag = { draw, colour, MIN_ZOOM, FONT };
})();
