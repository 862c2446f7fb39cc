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
      c.w = Math.max(...c.kids.map((k) => k.w));
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
    for (const c of t.cols) {
      let cy = boxTop + PAD;
      for (const k of c.kids) { place(k, cx + (c.w - k.w) / 2, cy, pos); cy += k.h + VGAP; }
      cx += c.w + HGAP;
    }
  }

  function layout(tree) {
    const pos = {};
    let x = 0;
    for (const t of tree.top) { measure(t); place(t, x, 0, pos); x += t.w + HGAP; }
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
      const kinds = el.data.kind.split(",");
      const c = [];
      if (hops.has(key)) c.push("chain");
      // a child -> parent dependency is drawn by the box; only a propagation hop draws it as an edge
      if (kinds.every((k) => k === "parent")) c.push(hops.has(key) ? "up" : "nested");
      if (hops.has(key) && kinds.every((k) => k === "parent")) {
        // straight up from the child to its box's top border
        const src = pos[el.data.source], dst = pos[el.data.target];
        el.data.tep = `${(src.x - dst.x).toFixed(1)}px ${(-(dst.h || LEAF_H) / 2).toFixed(1)}px`;
      }
      el.classes = c.join(" ");
      els.push(el);
    }
    return els;
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
                                 "target-arrow-shape": "triangle", "curve-style": "bezier", "arrow-scale": 0.8,
                                 "z-index": 999, "z-index-compare": "manual" } },
    { selector: "edge.nested", style: { display: "none" } },
    { selector: "node.failed", style: { "border-width": 3, "border-color": "#b3261e" } },
    { selector: "node.propagated", style: { "border-width": 3, "border-style": "dashed", "border-color": "#e8710a" } },
    { selector: "node.recovered", style: { "border-width": 2, "border-style": "dotted", "border-color": "#1a7f37" } },
    { selector: "node.final", style: { "border-width": 6, "border-style": "double", "border-color": "#111" } },
    { selector: "node.root", style: { "border-width": 5, "border-style": "solid", "border-color": "#6a00a8",
                                      "font-weight": "bold" } },
    { selector: "edge.chain", style: { width: 4, "line-color": "#6a00a8", "target-arrow-color": "#6a00a8",
                                       "arrow-scale": 1.1, "z-index": 1000 } },
    { selector: "edge.up", style: { "curve-style": "straight", "target-endpoint": "data(tep)" } },
    { selector: "node:selected", style: { "overlay-opacity": 0.2, "overlay-color": "#1d64d8", "overlay-padding": 3 } },
  ];

  // the default view: fitted, but never below MIN_ZOOM (then centred on the root cause) nor above MAX_ZOOM
  function initialView(cy, focus) {
    fitPane(cy);
    cy.fit(cy.elements(), 16);
    if (cy.zoom() < MIN_ZOOM || cy.zoom() > MAX_ZOOM) {
      cy.zoom(Math.min(MAX_ZOOM, Math.max(MIN_ZOOM, cy.zoom())));
      const f = focus && cy.getElementById(focus);
      if (f && f.length && cy.zoom() === MIN_ZOOM) {
        const bb = cy.elements().boundingBox();
        const p = f.position();
        // the focus at a third of the width, the top of the graph at the top
        cy.pan({ x: cy.width() / 3 - p.x * cy.zoom(), y: 16 - bb.y1 * cy.zoom() });
      } else {
        cy.center();
      }
    }
  }

  // a graph shorter than its pane at the default zoom gets a pane of its height (the timeline gets the rest)
  function fitPane(cy) {
    const el = cy.container();
    el.style.flex = "";
    cy.resize();
    const bb = cy.elements().boundingBox();
    const zoom = Math.min(MAX_ZOOM, Math.max(MIN_ZOOM, (cy.width() - 32) / Math.max(1, bb.w)));
    const want = Math.ceil(bb.h * zoom + 32);
    if (want < cy.height()) {
      el.style.flex = `0 0 ${Math.max(want, 180)}px`;
      cy.resize();
    }
  }

  // ---- timeline (waterfall): one row per step in call-tree order ---------------------------------
  function timeline(el, doc, tree, path) {
    const rows = [];
    const walk = (t) => { rows.push(t); t.kids.forEach(walk); };
    tree.top.forEach(walk);
    const t0 = Math.min(...doc.nodes.map(startOf));
    const span = Math.max(1, Math.max(...doc.nodes.map(endOf)) - t0);
    const fails = new Set((doc.failures || []).filter((f) => !f.recovered).map((f) => f.span_id));
    const onPath = new Set(path);
    el.innerHTML = rows.map((t) => {
      const n = t.n;
      const left = (100 * (startOf(n) - t0)) / span, width = (100 * (endOf(n) - startOf(n))) / span;
      const c = [fails.has(n.span_id) ? "failed" : "", onPath.has(n.span_id) ? "chain" : ""].join(" ");
      const ms = Number(n.duration_ms || 0);
      return `<div class="row" data-span="${esc(n.span_id)}"><span class="name" style="padding-left:${4 + 12 * t.depth}px" ` +
        `title="${esc(labelOf(n))}">${esc(labelOf(n))}</span><span class="lane"><span class="bar ${c}" ` +
        `style="left:${left.toFixed(3)}%;width:${width.toFixed(3)}%;background:${colour(n.score)}"></span>` +
        `<span class="ms${left + width > 85 ? " in" : ""}" style="left:calc(${(left + width > 85 ? left : left + width).toFixed(3)}% + 4px)">` +
        `${ms < 10 ? ms.toFixed(1) : Math.round(ms)} ms</span></span></div>`;
    }).join("");
  }

  // ---- draw: DAG + timeline, a selection in either selects in both ---------------------------------
  function draw(dagEl, timelineEl, doc, onSelect) {
    const path = doc.propagation_path || [];
    const tree = callTree(doc.nodes);
    const pos = layout(tree);
    const cy = cytoscape({ container: dagEl, elements: elements(doc, tree, pos, path), style: STYLE,
                           layout: { name: "preset" }, wheelSensitivity: 0.3, minZoom: 0.05, maxZoom: 4,
                           boxSelectionEnabled: false, autoungrabify: true });
    initialView(cy, doc.root_cause ? doc.root_cause.root_span_id : null);
    timeline(timelineEl, doc, tree, path);
    const select = (id, from) => {
      cy.nodes(":selected").unselect();
      const node = cy.getElementById(id);
      node.select();
      if (from === "timeline" && node.length) {
        const p = node.renderedPosition();
        if (p.x < 0 || p.y < 0 || p.x > cy.width() || p.y > cy.height()) cy.center(node);
      }
      timelineEl.querySelectorAll(".row.sel").forEach((r) => r.classList.remove("sel"));
      const row = timelineEl.querySelector(`.row[data-span="${CSS.escape(id)}"]`);
      if (row) {
        row.classList.add("sel");
        if (from !== "timeline") row.scrollIntoView({ block: "nearest" });
      }
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
