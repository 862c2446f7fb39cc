// tracedag web UI: trace list, one trace (DAG + timeline, dag.js), a conversation's turns, agent graph,
// determinism, saved regression reports.
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
  const when = (v) => String(v || "").replace("T", " ").slice(0, 19);
  const took = (ms) => (ms == null ? "" : ms >= 1000 ? (ms / 1000).toFixed(ms >= 10000 ? 0 : 1) + " s" : Math.round(ms) + " ms");
  const NO_DAG = "not in this report (tracedag report --traces N inlines more)";

  async function getJSON(path) {
    const r = await fetch(path, { headers });
    const body = await r.json();
    if (!r.ok) throw new Error(body.error || r.statusText);
    return body;
  }

  // ---- trace list: filters, sort, pages ------------------------------------------------------------
  const list = { sort: "start_time", order: "desc", offset: 0, limit: 100 };

  function filters() {
    const f = {};
    for (const [k, v] of new FormData($("#filters")).entries()) if (v) f[k] = v;
    return f;
  }

  const sortKey = (t, key) => (key === "start_time" ? t.start_time_unix_nano : t[key]);

  // the report's list: the same filters (run labels: the trace's own columns), sort and pages in the page
  function pageInline(f) {
    let rows = INLINE.traces;
    if (f.status === "passed") rows = rows.filter((t) => t.passed === true);
    if (f.status === "failed") rows = rows.filter((t) => t.passed === false);
    if (f.status === "error") rows = rows.filter((t) => t.error_count > 0);
    for (const [k, col] of [["agent", "agent"], ["service_version", "service_version"], ["scenario", "scenario_id"],
                            ["conversation", "conversation_id"]]) if (f[k]) rows = rows.filter((t) => t[col] === f[k]);
    if (f.label) {
      const pairs = f.label.split(",").map((p) => p.split("=").map((x) => x.trim()));
      rows = rows.filter((t) => pairs.every(([k, v]) => String(t[k]) === v));
    }
    const sign = list.order === "asc" ? 1 : -1;
    rows = rows.slice().sort((a, b) => {
      const x = sortKey(a, list.sort), y = sortKey(b, list.sort);
      if (x == null || y == null) return x == null ? (y == null ? 0 : 1) : -1;
      return (x < y ? -1 : x > y ? 1 : 0) * sign || (a.trace_id < b.trace_id ? -1 : 1);
    });
    const choices = {};
    for (const [k, col] of [["agent", "agent"], ["service_version", "service_version"], ["scenario", "scenario_id"]])
      choices[k] = [...new Set(INLINE.traces.map((t) => t[col]).filter((v) => v != null && v !== ""))].sort();
    return { total: rows.length, traces: rows.slice(list.offset, list.offset + list.limit), choices };
  }

  function fillChoices(choices) {
    for (const [name, values] of Object.entries(choices || {})) {
      const sel = $(`#filters select[name=${name}]`);
      if (!sel || sel.options.length > 1) continue;
      sel.innerHTML = '<option value="">any</option>' + values.map((v) => `<option>${esc(v)}</option>`).join("");
    }
  }

  function rowHtml(t) {
    const linked = !INLINE || INLINE.details[t.trace_id];
    const attrs = linked ? `data-trace-id="${esc(t.trace_id)}"` : `class="nodag" data-nodag="${esc(t.trace_id)}"`;
    return `<tr ${attrs}><td class="id" title="${esc(t.trace_id)}">${esc(t.trace_id.slice(0, 8))}</td>` +
      `<td>${esc(t.agent)}</td><td>${t.conversation_id ? `<a href="#" data-conv="${esc(t.conversation_id)}">${esc(t.conversation_id)}</a>` : ""}</td><td class="status-${esc(t.status)}">${esc(t.status)}</td>` +
      (t.root_cause_step ? `<td>${esc(t.root_cause_step)}</td>`
        : t.passed === false ? '<td class="muted" title="the workflow score is under the pass mark, but no step failed">no failed step</td>' : "<td></td>") +
      `<td class="num">${num(t.workflow_score, 2)}</td>` +
      `<td class="num">${took(t.duration_ms)}</td><td>${esc(when(t.start_time))}</td>` +
      `<td>${linked ? '<a href="#" class="open">DAG</a>' : esc(NO_DAG)}</td></tr>`;
  }

  async function loadTraces() {
    const f = filters();
    let page;
    try {
      page = INLINE ? pageInline(f)
        : await getJSON("api/trace_list?" + new URLSearchParams({ ...f, sort: list.sort, order: list.order,
                                                                  offset: list.offset, limit: list.limit }));
    } catch (e) {
      $("#count").textContent = "error: " + e.message;
      return;
    }
    fillChoices(page.choices);
    const last = Math.min(list.offset + page.traces.length, page.total);
    $("#count").textContent = page.total ? `${list.offset + 1}–${last} of ${page.total} traces` : "0 traces";
    $("#prev").disabled = list.offset === 0;
    $("#next").disabled = last >= page.total;
    document.querySelectorAll("#traces th[data-sort]").forEach((th) => {
      th.classList.toggle("sorted", th.dataset.sort === list.sort);
      th.classList.toggle("asc", th.dataset.sort === list.sort && list.order === "asc");
      th.classList.toggle("desc", th.dataset.sort === list.sort && list.order === "desc");
    });
    const body = $("#traces tbody");
    body.innerHTML = page.traces.map(rowHtml).join("");
    body.dataset.total = String(page.total);
    body.dataset.loaded = String(page.traces.length);
  }

  // ---- one trace ------------------------------------------------------------------------------------
  let current = null;

  async function openTrace(id) {
    show("trace");
    $("#dag").removeAttribute("data-trace");
    $("#title").textContent = "loading " + id + " ...";
    let doc;
    try {
      doc = INLINE ? INLINE.details[id] : await getJSON("api/traces/" + encodeURIComponent(id) + "/view");
    } catch (e) {
      $("#title").textContent = "error: " + e.message;
      return;
    }
    if (!doc) {
      $("#title").textContent = "This trace's DAG is " + NO_DAG + ".";
      return;
    }
    current = doc;
    drawTrace(doc);
  }

  function drawTrace(doc) {
    const t = doc.trace;
    const rc = doc.root_cause;
    const conv = t.conversation_id ? ` · conversation <a href="#" id="open-conv">${esc(t.conversation_id)}</a>` : "";
    $("#title").innerHTML = `${esc(doc.agent || t.agent || t.service_name)} · ${esc(t.trace_id)} · ${doc.nodes.length} steps · ` +
      `workflow score ${num(t.workflow_score, 2)}` + conv +
      (rc ? ` · root cause <b>${esc(rc.root_step_name)}</b> (${esc(rc.root_taxonomy_l1 || "unclassified")}` +
            `${rc.root_taxonomy_l3 ? " / " + esc(rc.root_taxonomy_l3) : ""})` +
            (rc.failed_span_id && rc.failed_span_id !== rc.root_span_id
              ? ` → final failure <b>${esc(rc.failed_step_name)}</b>, ${Math.max(0, (doc.propagation_path || []).length - 1)} hops`
              : ", itself the final failure") : "");
    if (doc.root_cause_check) $("#title").insertAdjacentHTML("beforeend", checkHtml(doc.root_cause_check));
    if (rc && rc.silent_producer) $("#title").insertAdjacentHTML("beforeend", silentHtml(rc));
    const cross = doc.cross_turn_cause || (INLINE && (INLINE.conversation_causes || {})[t.trace_id]);
    if (cross && cross.root_trace_id && cross.root_trace_id !== t.trace_id) {
      $("#title").insertAdjacentHTML("beforeend", ` · cause across turns: <b>${esc(cross.root_step_name)}</b> in ` +
        `<a href="#" id="cross-turn" data-open="${esc(cross.root_trace_id)}">turn ${esc(cross.root_turn_index)}</a>` +
        (cross.silent_producer ? silentHtml(cross) : ""));
    }
    // data-painted: the first view is drawn; data-trace: every step is in the graph
    const dag = $("#dag");
    ["painted", "trace", "nodes"].forEach((k) => delete dag.dataset[k]);
    if (window.tracedagCy) window.tracedagCy.destroy();
    const drawn = window.tracedagDag.draw(dag, $("#timeline"), doc, showSpan, (cy) => {
      if (current !== doc) return;
      dag.dataset.nodes = String(cy.nodes().length);
      dag.dataset.trace = t.trace_id;
    });
    window.tracedagCy = drawn.cy;
    window.tracedagSelect = drawn.select;
    dag.dataset.root = rc ? rc.root_span_id : "";
    dag.dataset.path = (doc.propagation_path || []).join(",");
    dag.dataset.painted = t.trace_id;
  }

  // the root cause's latest counterfactual check (tracedag confirm), beside it in the title: the verdict, the
  // runs, what replaced the step and the downstream deltas; the reason and the replacement's source on hover
  function checkHtml(c) {
    const delta = c.downstream_score_delta == null ? "" : `, step scores ${c.downstream_score_delta >= 0 ? "+" : ""}${num(c.downstream_score_delta, 2)}`;
    const by = c.replacement_kind ? esc(c.replacement_kind) : "no replacement";
    const hover = `${c.reason || ""}${c.replacement_source ? " · replaced by " + c.replacement_source : ""}`;
    return ` · <span id="rc-check" class="check check-${esc(c.verdict)}" data-verdict="${esc(c.verdict)}" title="${esc(hover)}">` +
      `check: <b>${esc(c.verdict)}</b> (${by}, ${esc(c.runs)} runs, failed again in ${esc(c.failures_after)}${delta})</span>`;
  }

  // value provenance: the root passed but wrote (or the user typed) the value the failure rejected
  function silentHtml(r) {
    return ` <span class="silent" title="the failed step's ${esc(r.data_arg)} came from here (dag_edges edge_kind data)">` +
      `(${r.root_step_type === "user" ? "the user typed" : "silent producer of"} ${esc(r.data_arg)})</span>`;
  }

  const STATUS_CODE = { 0: "unset", 1: "ok", 2: "error" };

  function showSpan(id) {
    const doc = current;
    const span = doc.spans.find((s) => s.span_id === id) || {};
    const node = doc.nodes.find((n) => n.span_id === id) || {};
    const scores = doc.scores.filter((s) => s.span_id === id);
    const fail = (doc.failures || []).find((f) => f.span_id === id);
    let attrs = span.attributes;
    try { attrs = JSON.stringify(JSON.parse(attrs), null, 1); } catch (e) { /* keep the text */ }
    const rc = doc.root_cause || {};
    const role = id === rc.root_span_id ? `<p><b>root cause</b> (${esc(rc.root_taxonomy_l1)} / ${esc(rc.root_taxonomy_l2)} / ${esc(rc.root_taxonomy_l3)})</p>`
      : id === rc.failed_span_id ? "<p><b>final failure</b> of the trace</p>" : "";
    $("#panel").innerHTML =
      `<h3>${esc(span.name || node.step_name)}</h3>` + role +
      (fail ? `<p>${esc(fail.recovered ? "failed, recovered" : fail.kind)} failure${fail.nearest_failing_upstream && fail.nearest_failing_upstream.length ? " (from " + fail.nearest_failing_upstream.length + " failing upstream step(s))" : ""}</p>` : "") +
      `<p>${esc(node.step_type)} · ${num(node.duration_ms, 1)} ms · status ${esc(STATUS_CODE[span.status_code] || span.status_code)}` +
      `${span.status_message ? ": " + esc(span.status_message) : ""} · score ${num(node.score, 2)}</p>` +
      (scores.length ? "<table><tr><th>metric</th><th>score</th><th>source</th><th>category</th></tr>" + scores.map((s) =>
        `<tr><td>${esc(s.metric)}</td><td>${num(s.score, 2)}</td><td>${esc(s.source)}</td><td>${esc(s.taxonomy_l3 || s.taxonomy_l1 || "")}</td></tr>`).join("") + "</table>" : "") +
      `<h3>input</h3><pre>${esc(span.input_text)}</pre><h3>output</h3><pre>${esc(span.output_text)}</pre>` +
      `<h3>attributes</h3><pre>${esc(attrs)}</pre>`;
    $("#panel").dataset.span = id;
  }

  // ---- a conversation: its turns in order, each turn's outcome, the cross-turn cause -------------------
  function conversationInline(id) {
    const turns = INLINE.traces.filter((t) => t.conversation_id === id)
      .sort((a, b) => a.start_time_unix_nano - b.start_time_unix_nano);
    const causes = INLINE.conversation_causes || {};
    return { conversation_id: id, turns: turns.map((t, i) => ({ turn: i + 1, trace: t, cross_turn_cause: causes[t.trace_id] || null })) };
  }

  async function openConversation(id) {
    show("conversation");
    let doc;
    try {
      doc = INLINE ? conversationInline(id) : await getJSON("api/conversations/" + encodeURIComponent(id));
    } catch (e) {
      $("#conv-body").textContent = "error: " + e.message;
      return;
    }
    const byTrace = new Map(doc.turns.map((x) => [x.trace.trace_id, x.turn]));
    $("#conv-title").textContent = `conversation ${id} · ${doc.turns.length} turn(s)`;
    $("#conv-body").innerHTML = "<table id=\"turns\"><thead><tr><th>turn</th><th>trace</th><th>start</th><th>status</th><th>score</th>" +
      "<th>root cause in the turn</th><th>cause across turns</th></tr></thead><tbody>" + doc.turns.map((x) => {
        const t = x.trace, c = x.cross_turn_cause;
        const across = !c ? "" : c.root_trace_id && c.root_trace_id !== t.trace_id
          ? `${esc(c.root_step_name)} in <a href="#" data-open="${esc(c.root_trace_id)}">turn ${esc(byTrace.get(c.root_trace_id) || c.root_turn_index)}</a>`
          : `${esc(c.root_step_name)} (this turn)`;
        return `<tr data-turn="${x.turn}"><td>${x.turn}</td><td class="id"><a href="#" data-open="${esc(t.trace_id)}">${esc(t.trace_id.slice(0, 8))}</a></td>` +
          `<td>${esc(when(t.start_time))}</td><td class="status-${esc(t.status)}">${esc(t.status)}</td><td>${num(t.workflow_score, 2)}</td>` +
          `<td>${esc(t.root_cause_step)}</td><td class="across">${across}</td></tr>`;
      }).join("") + "</tbody></table>";
    $("#conv-body").dataset.conversation = id;
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
                                     label: "data(label)", "font-size": 12, "text-valign": "bottom" } },
        { selector: "edge", style: { width: "data(width)", "line-color": "data(colour)", "target-arrow-color": "data(colour)",
                                     "target-arrow-shape": "triangle", "curve-style": "bezier" } },
      ],
      layout: { name: window.cytoscapeDagre ? "dagre" : "breadthfirst", rankDir: "LR", nodeSep: 30, rankSep: 80 },
    });
    window.tracedagAgentCy = cy;
    $("#agraph").dataset.agent = key;
  }

  // ---- tabs: exactly one section visible ------------------------------------------------------------
  const SECTIONS = ["list", "trace", "conversation", "agents", "determinism", "regressions"];
  const TAB_OF = { list: "traces", trace: "traces", conversation: "traces" };

  function show(section) {
    SECTIONS.forEach((s) => { $("#" + s).hidden = s !== section; });
    const tab = TAB_OF[section] || section;
    document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("on", a.dataset.view === tab));
    document.body.dataset.view = section;
    if (section === "trace" && window.tracedagCy) window.tracedagCy.resize();
    if (section === "determinism") loadDeterminism();
    if (section === "agents") loadAgents();
    if (section === "regressions") loadRegressions();
  }

  $("#filters").addEventListener("submit", (ev) => { ev.preventDefault(); list.offset = 0; loadTraces(); });
  $("#prev").addEventListener("click", () => { list.offset = Math.max(0, list.offset - list.limit); loadTraces(); });
  $("#next").addEventListener("click", () => { list.offset += list.limit; loadTraces(); });
  document.querySelectorAll("#traces th[data-sort]").forEach((th) => th.addEventListener("click", () => {
    const key = th.dataset.sort;
    list.order = list.sort === key && list.order === "desc" ? "asc" : list.sort === key ? "desc" : (key === "start_time" ? "desc" : "asc");
    list.sort = key;
    list.offset = 0;
    loadTraces();
  }));
  $("#traces tbody").addEventListener("click", (ev) => {
    ev.preventDefault();
    const conv = ev.target.closest("a[data-conv]");
    if (conv) { openConversation(conv.dataset.conv); return; }
    const tr = ev.target.closest("tr[data-trace-id]");
    if (!tr) return;
    document.querySelectorAll("#traces tr.selected").forEach((r) => r.classList.remove("selected"));
    tr.classList.add("selected");
    openTrace(tr.dataset.traceId);
  });
  $("#back").addEventListener("click", () => show("list"));
  $("#conv-back").addEventListener("click", () => show(current ? "trace" : "list"));
  $("#title").addEventListener("click", (ev) => {
    if (ev.target.id === "cross-turn") { ev.preventDefault(); openTrace(ev.target.dataset.open); }
    if (ev.target.id !== "open-conv") return;
    ev.preventDefault();
    openConversation(current.trace.conversation_id);
  });
  $("#conv-body").addEventListener("click", (ev) => {
    const a = ev.target.closest("a[data-open]");
    if (!a) return;
    ev.preventDefault();
    openTrace(a.dataset.open);
  });
  $("#reg-list tbody").addEventListener("click", (ev) => {
    const tr = ev.target.closest("tr[data-name]");
    if (tr) openRegression(tr.dataset.name);
  });
  document.querySelectorAll("nav a").forEach((a) => a.addEventListener("click", (ev) => {
    ev.preventDefault();
    show(a.dataset.view === "traces" ? "list" : a.dataset.view);
  }));
  window.tracedagUi = { openTrace, openConversation, show };
  loadTraces();
})();
