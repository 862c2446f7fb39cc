// tracedag web UI: trace list, one trace's DAG (cytoscape + dagre), span panel, agent graph, determinism,
// saved regression reports.
// Served by `tracedag serve` (data from /api) or inlined by `tracedag report` (window.TRACEDAG_DATA).
(function () {
  "use strict";
  const INLINE = window.TRACEDAG_DATA || null;
  const token = (location.hash.match(/token=([^&]+)/) || [])[1];
  const headers = token ? { Authorization: "Bearer " + decodeURIComponent(token) } : {};
  if (window.cytoscapeDagre) cytoscape.use(window.cytoscapeDagre);

  const $ = (sel) => document.querySelector(sel);
  const esc = (v) => String(v == null ? "" : v).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  const num = (v, d) => (v == null ? "" : Number(v).toFixed(d));

  async function getJSON(path) {
    const r = await fetch(path, { headers });
    const body = await r.json();
    if (!r.ok) throw new Error(body.error || r.statusText);
    return body;
  }

  // ---- trace list -------------------------------------------------------
  function filterInline(f) {
    let rows = INLINE.traces;
    if (f.status === "passed") rows = rows.filter((t) => t.passed === true);
    if (f.status === "failed") rows = rows.filter((t) => t.passed === false);
    if (f.status === "error") rows = rows.filter((t) => t.error_count > 0);
    if (f.agent) rows = rows.filter((t) => t.service_name === f.agent);
    if (f.conversation) rows = rows.filter((t) => t.conversation_id === f.conversation);
    return { total: rows.length, traces: rows };
  }

  async function loadTraces() {
    const form = new FormData($("#filters"));
    const f = {};
    for (const [k, v] of form.entries()) if (v) f[k] = v;
    let page;
    try {
      page = INLINE ? filterInline(f) : await getJSON("api/traces?" + new URLSearchParams({ ...f, limit: 500 }));
    } catch (e) {
      $("#count").textContent = "error: " + e.message;
      return;
    }
    $("#count").textContent = page.total + " traces" + (page.total > page.traces.length ? " (newest " + page.traces.length + " shown)" : "");
    const body = $("#traces tbody");
    body.innerHTML = page.traces.map((t) =>
      `<tr data-trace-id="${esc(t.trace_id)}" class="${t.passed === false ? "failed" : ""}">` +
      `<td>${esc((t.start_time || "").replace("T", " ").slice(0, 19))}</td><td>${esc(t.service_name)}</td>` +
      `<td>${esc(t.steps)}</td><td>${esc(t.failed_steps)}</td><td class="score">${num(t.workflow_score, 2)}</td>` +
      `<td>${esc(t.root_cause_step || "")}</td></tr>`).join("");
    body.dataset.loaded = String(page.traces.length);
  }

  // ---- one trace --------------------------------------------------------
  function colour(score) {
    if (score == null) return "#b8bec8";
    const t = Math.max(0, Math.min(1, (score - 1) / 4));
    const stops = [[215, 48, 39], [253, 174, 97], [26, 152, 80]];
    const [a, b, u] = t < 0.5 ? [stops[0], stops[1], t * 2] : [stops[1], stops[2], (t - 0.5) * 2];
    return "rgb(" + a.map((x, i) => Math.round(x + (b[i] - x) * u)).join(",") + ")";
  }

  let current = null;

  async function openTrace(id) {
    document.querySelectorAll("#traces tr.selected").forEach((r) => r.classList.remove("selected"));
    const row = document.querySelector(`#traces tr[data-trace-id="${CSS.escape(id)}"]`);
    if (row) row.classList.add("selected");
    let doc;
    try {
      doc = INLINE ? INLINE.details[id] : await getJSON("api/traces/" + encodeURIComponent(id));
    } catch (e) {
      $("#title").textContent = "error: " + e.message;
      return;
    }
    if (!doc) {
      $("#title").textContent = "This trace's DAG is not in the report (tracedag report --traces N inlines more).";
      return;
    }
    current = doc;
    drawDag(doc);
  }

  function drawDag(doc) {
    const t = doc.trace;
    const chain = doc.propagation_chain || [];
    const root = doc.root_cause ? doc.root_cause.root_span_id : null;
    $("#title").textContent = `${t.service_name} · ${t.trace_id} · ${doc.nodes.length} steps · workflow score ${num(t.workflow_score, 2)}` +
      (doc.root_cause ? ` · root cause ${doc.root_cause.root_step_name} (${doc.root_cause.root_taxonomy_l1 || "unclassified"})` : "");
    const ids = new Set(doc.nodes.map((n) => n.span_id));
    const onChain = new Set();
    for (let i = 0; i + 1 < chain.length; i++) onChain.add(chain[i] + ">" + chain[i + 1]);
    const elements = doc.nodes.map((n) => ({
      data: { id: n.span_id, label: n.step_name || n.step_type, colour: colour(n.score), score: n.score },
      classes: [n.span_id === root ? "root" : "", chain.includes(n.span_id) ? "chain" : ""].join(" "),
    }));
    doc.edges.forEach((e, i) => {
      if (!ids.has(e.source) || !ids.has(e.target)) return;
      elements.push({ data: { id: "e" + i, source: e.source, target: e.target, kind: e.edge_kind },
                      classes: onChain.has(e.source + ">" + e.target) ? "chain" : "" });
    });
    const cy = cytoscape({
      container: $("#dag"),
      elements,
      wheelSensitivity: 0.3,
      style: [
        { selector: "node", style: { "background-color": "data(colour)", label: "data(label)", "font-size": 9,
                                     "text-valign": "bottom", "text-margin-y": 3, width: 18, height: 18 } },
        { selector: "edge", style: { width: 1, "line-color": "#c3c8d0", "target-arrow-color": "#c3c8d0",
                                     "target-arrow-shape": "triangle", "curve-style": "bezier", "arrow-scale": 0.6 } },
        { selector: "edge.chain", style: { width: 4, "line-color": "#6a00a8", "target-arrow-color": "#6a00a8" } },
        { selector: "node.chain", style: { "border-width": 3, "border-color": "#6a00a8" } },
        { selector: "node.root", style: { "border-width": 6, "border-color": "#6a00a8", width: 28, height: 28,
                                          "font-weight": "bold" } },
        { selector: "node:selected", style: { "overlay-opacity": 0.25, "overlay-color": "#1d2330" } },
      ],
      layout: { name: window.cytoscapeDagre ? "dagre" : "breadthfirst", rankDir: "TB", nodeSep: 12, rankSep: 40,
                directed: true },
    });
    cy.on("tap", "node", (ev) => showSpan(ev.target.id()));
    window.tracedagCy = cy;
    $("#dag").dataset.nodes = String(cy.nodes().length);
    $("#dag").dataset.root = root || "";
    $("#dag").dataset.trace = t.trace_id;
  }

  function showSpan(id) {
    const doc = current;
    const span = doc.spans.find((s) => s.span_id === id) || {};
    const node = doc.nodes.find((n) => n.span_id === id) || {};
    const scores = doc.scores.filter((s) => s.span_id === id);
    let attrs = span.attributes;
    try { attrs = JSON.stringify(JSON.parse(attrs), null, 1); } catch (e) { /* keep the text */ }
    const isRoot = doc.root_cause && doc.root_cause.root_span_id === id;
    $("#panel").innerHTML =
      `<h3>${esc(span.name || node.step_name)}</h3>` + (isRoot ? `<p><b>root cause</b> (${esc(doc.root_cause.root_taxonomy_l1)} / ${esc(doc.root_cause.root_taxonomy_l2)} / ${esc(doc.root_cause.root_taxonomy_l3)})</p>` : "") +
      `<p>${esc(node.step_type)} · ${num(node.duration_ms, 1)} ms · status ${esc(span.status_code)} · score ${num(node.score, 2)}</p>` +
      (scores.length ? "<table><tr><th>metric</th><th>score</th><th>source</th><th>category</th></tr>" + scores.map((s) =>
        `<tr><td>${esc(s.metric)}</td><td>${num(s.score, 2)}</td><td>${esc(s.source)}</td><td>${esc(s.taxonomy_l3 || s.taxonomy_l1 || "")}</td></tr>`).join("") + "</table>" : "") +
      `<h3>input</h3><pre>${esc(span.input_text)}</pre><h3>output</h3><pre>${esc(span.output_text)}</pre>` +
      `<h3>attributes</h3><pre>${esc(attrs)}</pre>`;
    $("#panel").dataset.span = id;
  }

  // ---- determinism ------------------------------------------------------
  async function loadDeterminism() {
    let rows;
    try {
      rows = INLINE ? INLINE.determinism || [] : await getJSON("api/queries/determinism");
    } catch (e) {
      rows = [];
    }
    const cols = rows.length ? Object.keys(rows[0]).filter((k) => !Array.isArray(rows[0][k])) : [];
    $("#det thead").innerHTML = "<tr>" + cols.map((c) => `<th>${esc(c)}</th>`).join("") + "</tr>";
    $("#det tbody").innerHTML = rows.length ? rows.map((r) => "<tr>" + cols.map((c) =>
      `<td>${esc(typeof r[c] === "number" ? Number(r[c].toFixed(3)) : r[c])}</td>`).join("") + "</tr>").join("")
      : "<tr><td>No scenario has several runs yet (tracedag determinism needs runs labelled with a scenario).</td></tr>";
  }

  // ---- regression reports (tracedag regress saves one per run in <data>/reports/) ----
  const STATUS_ORDER = { fail: 0, warn: 1, absent: 2, insufficient: 3, improved: 4, ok: 5 };
  const sig = (v) => (v == null ? "-" : Number(Number(v).toPrecision(3)));
  const signed = (v) => (v == null ? "-" : (v > 0 ? "+" : "") + sig(v));

  async function loadRegressions() {
    let rows;
    try {
      rows = INLINE ? (INLINE.regressions || []).map((r) => r.summary) : await getJSON("api/regressions");
    } catch (e) {
      $("#reg-detail").textContent = "error: " + e.message;
      return;
    }
    const body = $("#reg-list tbody");
    body.innerHTML = rows.map((r) =>
      `<tr data-name="${esc(r.name)}"><td>${esc((r.time || "").replace("T", " ").replace("Z", ""))}</td>` +
      `<td>${esc(r.baseline)}</td><td>${esc(r.candidate)}</td>` +
      `<td class="${r.exit_code ? "verdict-fail" : "verdict-pass"}">${r.exit_code ? "FAIL" : "PASS"}</td>` +
      `<td>${esc(r.fail)}</td><td>${esc(r.warn)}</td></tr>`).join("");
    body.dataset.loaded = String(rows.length);
    if (!rows.length) {
      $("#reg-detail").innerHTML = "<p>No regression report yet. <code>tracedag regress --data DIR --baseline SEL " +
        "--candidate SEL</code> saves one in <code>DIR/reports/</code> on every run.</p>";
      return;
    }
    openRegression(rows[0].name);
  }

  async function openRegression(name) {
    document.querySelectorAll("#reg-list tr.selected").forEach((r) => r.classList.remove("selected"));
    const row = document.querySelector(`#reg-list tr[data-name="${CSS.escape(name)}"]`);
    if (row) row.classList.add("selected");
    let doc;
    try {
      doc = INLINE ? (INLINE.regressions.find((r) => r.summary.name === name) || {}).doc
        : await getJSON("api/regressions/" + encodeURIComponent(name));
    } catch (e) {
      $("#reg-detail").textContent = "error: " + e.message;
      return;
    }
    const metrics = (doc.metrics || []).slice().sort((a, b) => (STATUS_ORDER[a.status] ?? 9) - (STATUS_ORDER[b.status] ?? 9));
    $("#reg-detail").innerHTML =
      `<h3 class="${doc.exit_code ? "verdict-fail" : "verdict-pass"}">${esc(doc.verdict)}</h3>` +
      `<p class="muted">baseline ${esc(doc.baseline.selector)}: ${esc(doc.baseline.traces)} traces in ${esc(doc.baseline.cases)} cases · ` +
      `candidate ${esc(doc.candidate.selector)}: ${esc(doc.candidate.traces)} traces in ${esc(doc.candidate.cases)} cases · ` +
      `${esc(doc.paired_cases)} paired cases · ${esc(doc.resamples)} resamples, ${Math.round(100 * doc.confidence)}% CI, seed ${esc(doc.seed)}</p>` +
      "<table id=\"reg-metrics\"><thead><tr><th>metric</th><th>status</th><th>baseline</th><th>candidate</th><th>delta</th>" +
      "<th>CI</th><th>warn / fail at</th><th>p adj.</th><th>pairs</th><th>note</th></tr></thead><tbody>" +
      metrics.map((m) => `<tr data-metric="${esc(m.metric)}" data-status="${esc(m.status)}"><td>${esc(m.metric)}</td>` +
        `<td class="status">${esc(m.status)}</td><td>${sig(m.baseline_mean)}</td><td>${sig(m.candidate_mean)}</td>` +
        `<td>${signed(m.delta)}</td><td>${m.ci_low == null ? "-" : "[" + signed(m.ci_low) + ", " + signed(m.ci_high) + "]"}</td>` +
        `<td>${sig(m.warn_at)} / ${sig(m.fail_at)}</td><td>${m.p_adjusted == null ? "-" : sig(m.p_adjusted)}</td>` +
        `<td>${esc(m.pairs)}</td><td>${esc(m.note)}</td></tr>`).join("") + "</tbody></table>";
    $("#reg-detail").dataset.name = name;
  }

  // ---- agent graph: node and edge utility ---------------------------------
  let utility = null;

  async function loadAgents() {
    if (!utility) {
      try {
        utility = INLINE ? { nodes: INLINE.node_utility || [], edges: INLINE.edge_utility || [] }
          : { nodes: await getJSON("api/queries/node_utility"), edges: await getJSON("api/queries/edge_utility") };
      } catch (e) {
        utility = { nodes: [], edges: [], error: e.message };
      }
    }
    const agents = [...new Set(utility.nodes.map((n) => n.agent + " " + n.agent_version))].sort();
    const pick = $("#agent-pick");
    if (!pick.options.length) {
      pick.innerHTML = agents.map((a) => `<option>${esc(a)}</option>`).join("");
      pick.addEventListener("change", drawAgent);
    }
    if (!agents.length) {
      $("#agraph").textContent = "No agent graph yet: run `tracedag determinism --data DIR` (it writes node_visits and run_paths)." +
        (utility.error ? " (" + utility.error + ")" : "");
      return;
    }
    drawAgent();
  }

  function drawAgent() {
    const key = $("#agent-pick").value;
    const mine = (r) => r.agent + " " + r.agent_version === key;
    const nodes = utility.nodes.filter(mine);
    const ids = new Set(nodes.map((n) => n.node));
    const edges = utility.edges.filter((e) => mine(e) && ids.has(e.source) && ids.has(e.target));
    const elements = nodes.map((n) => ({ data: { id: n.node, label: `${n.node} (${Math.round(100 * n.conversation_share)}%)`,
      size: 16 + 44 * (n.conversation_share || 0), colour: n.failures ? "#d73027" : "#4575b4" } }))
      .concat(edges.map((e, i) => ({ data: { id: "u" + i, source: e.source, target: e.target,
        width: 1 + 11 * (e.conversation_share || 0), colour: e.failures ? "#f4a582" : "#92c5de" } })));
    const cy = cytoscape({
      container: $("#agraph"), elements,
      style: [
        { selector: "node", style: { width: "data(size)", height: "data(size)", "background-color": "data(colour)",
                                     label: "data(label)", "font-size": 10, "text-valign": "bottom" } },
        { selector: "edge", style: { width: "data(width)", "line-color": "data(colour)", "target-arrow-color": "data(colour)",
                                     "target-arrow-shape": "triangle", "curve-style": "bezier" } },
      ],
      layout: { name: window.cytoscapeDagre ? "dagre" : "breadthfirst", rankDir: "LR", nodeSep: 30, rankSep: 80 },
    });
    window.tracedagAgentCy = cy;
    $("#agraph").dataset.agent = key;
  }

  function show(view) {
    document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("on", a.dataset.view === view));
    const det = view === "determinism";
    const agents = view === "agents";
    const reg = view === "regressions";
    $("#determinism").hidden = !det;
    $("#agents").hidden = !agents;
    $("#regressions").hidden = !reg;
    ["#list", "#graph", "#panel"].forEach((s) => { $(s).hidden = det || agents || reg; });
    if (det) loadDeterminism();
    if (agents) loadAgents();
    if (reg) loadRegressions();
  }

  $("#filters").addEventListener("submit", (ev) => { ev.preventDefault(); loadTraces(); });
  $("#traces tbody").addEventListener("click", (ev) => {
    const tr = ev.target.closest("tr[data-trace-id]");
    if (tr) openTrace(tr.dataset.traceId);
  });
  $("#reg-list tbody").addEventListener("click", (ev) => {
    const tr = ev.target.closest("tr[data-name]");
    if (tr) openRegression(tr.dataset.name);
  });
  document.querySelectorAll("nav a").forEach((a) => a.addEventListener("click", (ev) => { ev.preventDefault(); show(a.dataset.view); }));
  loadTraces();
})();
