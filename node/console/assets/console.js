// The kvmesh console: polls /console/state once per interval and renders it. No framework,
// no external fetch; every value from the node is set as text, never as markup.
"use strict";
(function () {
  const HISTORY_MS = 5 * 60 * 1000;
  const $ = (id) => document.getElementById(id);
  let history = []; // {t, m: {key: value}} newest last, at most HISTORY_MS old
  let last = null; // the last state
  let interval = 1000;
  let selected = null; // name of the node shown in detail

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function row(cells, head) {
    const tr = el("tr");
    for (const c of cells) {
      const td = el(head ? "th" : "td", c);
      if (!head && typeof c === "number") td.className = "n";
      if (head) td.scope = "col";
      tr.appendChild(td);
    }
    return tr;
  }
  function fill(table, head, rows, caption) {
    const cap = table.querySelector("caption");
    table.replaceChildren();
    if (cap) table.appendChild(cap);
    const th = el("thead"); th.appendChild(row(head, true)); table.appendChild(th);
    const tb = el("tbody");
    for (const r of rows) tb.appendChild(r instanceof Element ? r : row(r));
    if (rows.length === 0) { const tr = el("tr"); const td = el("td", caption || "none yet", "muted"); td.colSpan = head.length; tr.appendChild(td); tb.appendChild(tr); }
    table.appendChild(tb);
  }
  const fix = (v, d) => (typeof v === "number" ? Number(v.toFixed(d)) : v);
  const pct = (v) => (v * 100).toFixed(0) + "%";
  // Milliseconds from seconds, with two decimals under 10 ms: a fast engine's predictions are
  // fractions of a millisecond and must not read as zero.
  const ms = (s) => { const v = (s || 0) * 1000; return (v < 10 ? v.toFixed(2) : v.toFixed(0)) + " ms"; };

  // Flattens the families to "name{k=v,...}" keys, so two polls can be subtracted.
  function flat(metrics) {
    const out = {};
    for (const [name, samples] of Object.entries(metrics || {})) {
      for (const s of samples) {
        const ls = s.labels ? Object.keys(s.labels).sort().map((k) => k + "=" + s.labels[k]).join(",") : "";
        out[name + "{" + ls + "}"] = s.value;
      }
    }
    return out;
  }
  // Sums a family's series by a function of their labels, over the window [from, to] of
  // history: per second rate (from the two samples) and total (to's).
  function sumBy(name, keyOf, from, to) {
    const acc = {};
    for (const s of (last.metrics[name] || [])) {
      const k = keyOf(s.labels || {});
      if (k === null) continue;
      const ls = s.labels ? Object.keys(s.labels).sort().map((x) => x + "=" + s.labels[x]).join(",") : "";
      const key = name + "{" + ls + "}";
      const a = (acc[k] = acc[k] || { total: 0, rate: 0 });
      a.total += s.value;
      if (from && to && to.t > from.t) a.rate += ((to.m[key] || 0) - (from.m[key] || 0)) / ((to.t - from.t) / 1000);
    }
    return acc;
  }
  const prev = () => (history.length > 1 ? history[history.length - 2] : null);
  const now = () => history[history.length - 1];
  const oldest = () => history[0];

  function ready(p) { return p.liveness === "alive" && p.engine_healthy && !p.stale; }
  function models(p) {
    return (p.models || []).map((m) => m.name + (m.adapters && m.adapters.length ? " [" + m.adapters.map((a) => a.name || a).join(", ") + "]" : "")).join("; ");
  }
  function peerRow(p) {
    const tr = row([
      p.name + (p.self ? " (this node)" : ""), p.liveness, ready(p) ? "ready" : "not ready", p.role || "whole",
      models(p), p.engine_kind || "", pct(p.kv_use || 0), (p.running || 0) + " / " + (p.waiting || 0),
      p.queued_prefill_tokens || 0, p.prefix_blocks || 0,
      (p.power_watts ? p.power_watts.toFixed(0) + " W" : "–") + " / " + (p.temp_c ? p.temp_c.toFixed(0) + " °C" : "–"),
      (p.carbon_zone || "–") + (p.carbon_intensity ? " " + p.carbon_intensity.toFixed(0) + " g" : ""),
      fix(p.age_seconds || 0, 1) + " s" + (p.stale ? " stale" : ""),
    ]);
    tr.className = "peer";
    tr.tabIndex = 0;
    tr.dataset.name = p.name;
    tr.cells[1].className = p.liveness === "alive" ? "ok" : "bad";
    tr.cells[2].className = ready(p) ? "ok" : "warn";
    tr.setAttribute("aria-label", "node " + p.name + ", open details");
    return tr;
  }
  function renderMesh() {
    const peers = (last.mesh && last.mesh.peers) || [];
    $("nodes-count").textContent = "(" + peers.length + " node" + (peers.length === 1 ? "" : "s") + ")";
    const q = $("filter").value.trim().toLowerCase();
    const key = $("sort").value;
    const shown = peers.filter((p) => !q || [p.name, models(p), p.role, p.carbon_zone, p.engine_kind, p.liveness].join(" ").toLowerCase().includes(q));
    shown.sort((a, b) => (key === "name" ? a.name.localeCompare(b.name) : (b[key] || 0) - (a[key] || 0)));
    const groups = new Map(); // model domain: the first model a node serves
    for (const p of shown) {
      const d = (p.models && p.models[0] && p.models[0].name) || "(no model)";
      if (!groups.has(d)) groups.set(d, []);
      groups.get(d).push(p);
    }
    const box = $("mesh-groups");
    const focused = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.name : null;
    box.replaceChildren();
    const head = ["node", "liveness", "readiness", "role", "models (adapters)", "engine", "KV use", "running / waiting", "queued prefill", "prefix blocks", "power / temp", "carbon", "staleness"];
    for (const [d, ps] of [...groups.entries()].sort()) {
      const t = el("table");
      t.appendChild(el("caption", "model " + d + " — " + ps.length + " node" + (ps.length === 1 ? "" : "s")));
      fill(t, head, ps.map(peerRow));
      box.appendChild(t);
    }
    if (focused) { const r = box.querySelector('tr.peer[data-name="' + CSS.escape(focused) + '"]'); if (r) r.focus(); }
    if (selected) showDetail(selected);
  }
  function showDetail(name) {
    const p = ((last.mesh && last.mesh.peers) || []).find((x) => x.name === name);
    if (!p) { $("detail").hidden = true; selected = null; return; }
    selected = name;
    $("detail-h").textContent = "Node " + name;
    const dl = $("detail-list");
    dl.replaceChildren();
    for (const [k, v] of Object.entries(p)) {
      dl.appendChild(el("dt", k));
      dl.appendChild(el("dd", typeof v === "object" ? JSON.stringify(v) : v));
    }
    $("detail").hidden = false;
  }

  function renderAdmission() {
    const p = prev(), n = now(), o = oldest();
    const by = sumBy("kvmesh_admission_decisions_total", (l) => l.decision, p, n);
    const cards = $("adm-cards");
    cards.replaceChildren();
    for (const d of ["accept", "queue", "refuse"]) {
      const a = by[d] || { total: 0, rate: 0 };
      const c = el("div", null, "card");
      c.id = "adm-" + d;
      c.appendChild(el("span", d === "accept" ? "accepted" : d === "queue" ? "queued" : "refused"));
      const b = el("b", fix(a.rate, 1) + "/s"); c.appendChild(b);
      const t = el("span", a.total + " total", "muted"); t.dataset.total = a.total; c.appendChild(t);
      cards.appendChild(c);
    }
    const reasons = sumBy("kvmesh_admission_decisions_total", (l) => l.decision + " " + l.layer + " " + l.reason, p, n);
    fill($("adm-reasons"), ["verdict", "layer", "reason", "per s", "total"],
      Object.entries(reasons).filter(([, a]) => a.total > 0).sort((x, y) => y[1].total - x[1].total).map(([k, a]) => [...k.split(" "), fix(a.rate, 2), a.total]));
    const cls = sumBy("kvmesh_admission_class_decisions_total", (l) => l.class + " " + l.decision, p, n);
    fill($("adm-classes"), ["class", "verdict", "per s", "total"],
      Object.entries(cls).filter(([, a]) => a.total > 0).map(([k, a]) => [...k.split(" "), fix(a.rate, 2), a.total]));
    const depth = sumBy("kvmesh_admission_queue_requests", (l) => l.priority);
    const tokens = sumBy("kvmesh_admission_queue_prefill_tokens", (l) => l.priority);
    const caps = sumBy("kvmesh_admission_queue_token_cap", (l) => l.model + " / " + l.pool);
    const rows = Object.keys(depth).map((k) => ["priority " + k, depth[k].total + " requests", (tokens[k] || { total: 0 }).total + " prefill tokens"]);
    for (const [k, a] of Object.entries(caps)) rows.push(["cap " + k, "", a.total.toFixed(0) + " tokens"]);
    fill($("room"), ["pool", "depth", "tokens"], rows, "empty");
    const fin = sumBy("kvmesh_slo_requests_total", (l) => l.class, o, n);
    const met = sumBy("kvmesh_slo_met_total", (l) => l.class, o, n);
    const mins = o && n ? ((n.t - o.t) / 60000).toFixed(1) : "0";
    fill($("slo"), ["class", "last " + mins + " min", "since start"], Object.keys(fin).map((k) => {
      const f = fin[k], m = met[k] || { total: 0, rate: 0 };
      const span = o && n ? (n.t - o.t) / 1000 : 0;
      const win = f.rate * span > 0.5 ? pct((m.rate * span) / (f.rate * span)) : "–";
      return [k, win, f.total > 0 ? pct(m.total / f.total) : "–"];
    }));
    chart();
  }
  // Lines of accepted, queued and refused per second over the history.
  function chart() {
    const svg = $("adm-chart");
    svg.replaceChildren();
    if (history.length < 2) return;
    const pts = { accept: [], queue: [], refuse: [] };
    let top = 1;
    for (let i = 1; i < history.length; i++) {
      const a = history[i - 1], b = history[i], dt = (b.t - a.t) / 1000;
      for (const d of Object.keys(pts)) {
        let s = 0;
        for (const k of Object.keys(b.m)) if (k.startsWith("kvmesh_admission_decisions_total{") && k.includes("decision=" + d + ",")) s += (b.m[k] - (a.m[k] || 0));
        const r = dt > 0 ? s / dt : 0;
        top = Math.max(top, r);
        pts[d].push([b.t, r]);
      }
    }
    const t1 = now().t, t0 = t1 - HISTORY_MS;
    const ns = "http://www.w3.org/2000/svg";
    for (const [d, ps] of Object.entries(pts)) {
      const pl = document.createElementNS(ns, "polyline");
      pl.setAttribute("class", d);
      pl.setAttribute("points", ps.map(([t, r]) => (((t - t0) / HISTORY_MS) * 600).toFixed(1) + "," + (115 - (r / top) * 100).toFixed(1)).join(" "));
      svg.appendChild(pl);
    }
    const lab = document.createElementNS(ns, "text");
    lab.setAttribute("x", "4"); lab.setAttribute("y", "12");
    lab.textContent = "max " + top.toFixed(1) + "/s — green accepted, amber queued, red refused";
    svg.appendChild(lab);
  }

  function renderTraffic() {
    const p = prev(), n = now();
    const flows = last.flows || {};
    const dt = p && n ? (n.t - p.t) / 1000 : 0;
    const pf = (p && p.flows) || {};
    const peers = Object.keys(flows).sort();
    const rows = peers.map((k) => {
      const f = flows[k], q = pf[k] || { sent: 0, received: 0 };
      const tr = row([k, dt > 0 ? fix((f.sent - q.sent) / dt, 2) : 0, f.sent, dt > 0 ? fix((f.received - q.received) / dt, 2) : 0, f.received]);
      tr.dataset.peer = k;
      return tr;
    });
    fill($("flows"), ["peer", last.node + " → peer /s", "total", "peer → " + last.node + " /s", "total"], rows, "no forwards yet");
    const fw = sumBy("kvmesh_forward_attempts_total", (l) => l.result, p, n);
    fill($("forwards"), ["result", "per s", "total"], Object.entries(fw).map(([k, a]) => [k, fix(a.rate, 2), a.total]));
    const mig = sumBy("kvmesh_migrations_total", (l) => "migration " + l.outcome + " (" + l.cause + ")", p, n);
    const ej = sumBy("kvmesh_forward_peer_ejections_total", (l) => "ejection " + l.reason, p, n);
    fill($("moves"), ["event", "per s", "total"], Object.entries({ ...mig, ...ej }).map(([k, a]) => [k, fix(a.rate, 2), a.total]));
  }

  function renderCarbon() {
    const zones = new Map();
    for (const p of (last.mesh && last.mesh.peers) || []) {
      if (!p.carbon_zone) continue;
      const z = zones.get(p.carbon_zone) || { nodes: [], intensity: p.carbon_intensity, stale: p.carbon_stale };
      z.nodes.push(p.name);
      zones.set(p.carbon_zone, z);
    }
    fill($("zones"), ["zone", "intensity (gCO₂/kWh)", "nodes", "reading"],
      [...zones.entries()].map(([k, z]) => [k, fix(z.intensity, 0), z.nodes.join(", "), z.stale ? "stale" : "fresh"]), "no node reports a carbon zone");
    const p = prev(), n = now();
    const r = sumBy("kvmesh_carbon_rerouted_total", () => "x", p, n).x;
    const d = sumBy("kvmesh_carbon_deferred_total", () => "x", p, n).x;
    $("shed").textContent = r || d
      ? "Shed by this node: " + (r ? r.total : 0) + " sheddable requests kept off dirty grids (" + fix(r ? r.rate : 0, 2) + "/s), " + (d ? d.total : 0) + " deferred (" + fix(d ? d.rate : 0, 2) + "/s)."
      : "This node has no carbon signal configured.";
  }

  function renderRecent() {
    const ul = $("recent");
    // The list is rebuilt each poll; a keyboard user's focus stays on the same request id.
    const focused = ul.contains(document.activeElement) ? document.activeElement.textContent : null;
    ul.replaceChildren();
    for (const e of last.recent || []) {
      const li = el("li"), b = el("button", e.id);
      b.type = "button";
      b.title = e.model + " " + e.class + ": " + e.action + (e.reason ? " (" + e.reason + ")" : "");
      b.addEventListener("click", () => { $("explain-id").value = e.id; explain(e.id); });
      li.appendChild(b);
      ul.appendChild(li);
      if (e.id === focused) b.focus();
    }
    if (!ul.children.length) ul.appendChild(el("li", "none yet", "muted"));
  }

  async function explain(id) {
    const out = $("explain-result");
    out.replaceChildren(el("p", "Loading…", "muted"));
    let res, body;
    try {
      res = await fetch("/console/explain?id=" + encodeURIComponent(id), { cache: "no-store" });
      body = await res.json();
    } catch (e) {
      out.replaceChildren(el("p", "The node did not answer: " + e.message, "bad"));
      return;
    }
    if (!res.ok) { out.replaceChildren(el("p", (body.error && body.error.message) || res.statusText, "bad")); return; }
    out.replaceChildren();
    out.appendChild(el("h3", "Request " + body.id));
    out.appendChild(el("p", "model " + body.model + ", class " + body.class + ": " + body.action + " at layer " + body.layer +
      (body.reason ? " (" + body.reason + ")" : "") + (body.chosen ? ", sent to " + body.chosen : "") + "; " + body.total_candidates + " candidates"));
    const t = el("table"); t.id = "explain-table";
    fill(t, ["candidate", "score", "prefix tokens", "load", "free KV", "power", "thermal", "reserved", "spill", "TTFT", "TPOT", "flags"],
      (body.candidates || []).map((c) => [c.name + (c.name === body.chosen ? " (chosen)" : ""), fix(c.score, 3), c.prefix_tokens, fix(c.load, 2) + " (" + c.load_tokens + " tokens)", fix(c.free_kv, 2),
        fix(c.power, 2), fix(c.thermal, 2), c.reserved_tokens, c.spill, ms(c.ttft_seconds), ms(c.tpot_seconds),
        [c.home && "home", c.gated && "gated", c.sticky && "sticky", c.decode && "decode " + c.decode].filter(Boolean).join(" ")]), "no candidate");
    out.appendChild(t);
  }

  async function poll() {
    let state;
    try {
      const res = await fetch("/console/state", { cache: "no-store" });
      if (!res.ok) throw new Error("HTTP " + res.status + (res.status === 401 ? ": an API key is required" : ""));
      state = await res.json();
    } catch (e) {
      const u = $("unreachable");
      u.textContent = "The node is unreachable (" + e.message + "). The figures below are from " + (last ? new Date(last.time).toLocaleTimeString() : "no poll yet") + "; retrying every " + interval / 1000 + " s.";
      u.hidden = false;
      setTimeout(poll, interval);
      return;
    }
    $("unreachable").hidden = true;
    last = state;
    interval = Math.max(state.interval_ms || 1000, 1000);
    const t = Date.parse(state.time);
    if (!history.length || t > now().t) history.push({ t, m: flat(state.metrics), flows: state.flows || {} });
    while (history.length > 2 && t - history[0].t > HISTORY_MS) history.shift();
    $("node-name").textContent = state.node;
    document.title = "kvmesh " + state.node;
    $("status").textContent = "Connected to " + state.node + ", updated " + new Date(t).toLocaleTimeString();
    const parts = [renderMesh, renderAdmission, renderTraffic, renderCarbon, renderRecent];
    for (const f of parts) f();
    setTimeout(poll, interval);
  }

  function init() {
    $("filter").addEventListener("input", () => last && renderMesh());
    $("sort").addEventListener("change", () => last && renderMesh());
    // Focus moves to the detail's heading, not to its Close button: the key that opened the
    // detail still has its keypress and keyup to deliver, and on a button they would press it.
    const open = (e) => { const tr = e.target.closest && e.target.closest("tr.peer"); if (tr) { showDetail(tr.dataset.name); $("detail-h").focus(); } };
    $("mesh-groups").addEventListener("click", open);
    $("mesh-groups").addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); open(e); } });
    const close = () => {
      const name = selected;
      $("detail").hidden = true; selected = null;
      const tr = name && $("mesh-groups").querySelector('tr.peer[data-name="' + CSS.escape(name) + '"]');
      if (tr) tr.focus();
    };
    $("detail-close").addEventListener("click", close);
    $("detail").addEventListener("keydown", (e) => { if (e.key === "Escape") { e.preventDefault(); close(); } });
    $("explain-form").addEventListener("submit", (e) => { e.preventDefault(); const id = $("explain-id").value.trim(); if (id) explain(id); });
    poll();
  }
  document.addEventListener("DOMContentLoaded", init);
})();
